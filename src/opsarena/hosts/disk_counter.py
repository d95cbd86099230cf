"""A program of the arena's own that counts directories with `du` on request, for as long
as its standard input stays open.

Run as `python -I -S disk_counter.py`. Each request is one line of JSON on standard input,
`{"id": N, "path": P, "timeout": T}`; for each it runs `du -sx -B1 -- P` and
`du -sx --inodes -- P` (one program started for both, killed with its process group
after T seconds) in a thread of its own, and answers one line of JSON,
`{"id": N, "out": ..., "err": ..., "code": C}` (code None after the timeout). It imports
only the standard library and executes nothing from a host: `du` reads the host's
writable layer from outside, as the arena does.

Why a separate process (`diskcount`): the controller counts every host's disk every
second, and starting a program from the arena's large, many-threaded process (pipes, an
asyncio transport and a thread watching the child) cost several times what it costs
from this small one; at 32 hosts it was a tenth of the controller's CPU.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading

SCRIPT = 'du -sx -B1 -- "$1"; a=$?; du -sx --inodes -- "$1"; exit $(( a | $? ))'
LIMIT = 4096

_write = threading.Lock()


def _answer(reply: dict[str, object]) -> None:
    line = json.dumps(reply) + "\n"
    with _write:
        sys.stdout.write(line)
        sys.stdout.flush()


def _count(request_id: int, path: str, timeout: float) -> None:
    process = subprocess.Popen(
        ["/bin/sh", "-c", SCRIPT, "du", path],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True, cwd="/",
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=timeout)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        code = None
    _answer(
        {
            "id": request_id,
            "out": out[:LIMIT].decode(errors="replace"),
            "err": err[-LIMIT:].decode(errors="replace"),
            "code": code,
        }
    )


def main() -> None:
    for line in sys.stdin:
        try:
            request = json.loads(line)
            request_id, path, timeout = request["id"], request["path"], request["timeout"]
        except (ValueError, KeyError, TypeError):
            continue  # only the arena writes here; a line it did not mean is dropped
        threading.Thread(target=_count, args=(request_id, path, timeout), daemon=True).start()


if __name__ == "__main__":
    main()
