"""Counting a host's writable layer (bytes and inodes) through one kept helper process.

`count(path, timeout)` asks `disk_counter` (a small program of the arena's own, started
once per process and kept while the process lives) to run `du` on `path`; many counts
run at once, each bounded by its own timeout. A helper that died is started again on
the next count, and a process forked from this one starts its own.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

PROGRAM = str(Path(__file__).with_name("disk_counter.py"))
HELPER_GRACE_S = 5.0
"""How long past a count's timeout the helper may take to answer (it kills `du` first)."""


@dataclass(frozen=True)
class Counted:
    """What the helper's `du` printed; `code` is None when it was killed at its timeout."""

    out: str
    err: str
    code: int | None


class _Helper:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", PROGRAM],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, cwd="/", start_new_session=True,
        )  # fmt: skip
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin: IO[str] = self.process.stdin
        self.waiting: dict[int, concurrent.futures.Future[Counted]] = {}
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.reader = threading.Thread(
            target=self._read, args=(self.process.stdout,), name="opsarena-du", daemon=True
        )
        self.reader.start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            reply: dict[str, Any] = json.loads(line)
            with self.lock:
                waiter = self.waiting.pop(int(reply["id"]), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(Counted(str(reply["out"]), str(reply["err"]), reply["code"]))
        # The helper is gone: every count still waiting fails, the next one starts another.
        with self.lock:
            waiting, self.waiting = self.waiting, {}
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(OSError("the disk counting helper exited"))

    def usable(self) -> bool:
        return self.pid == os.getpid() and self.reader.is_alive() and self.process.poll() is None

    def submit(self, path: str, timeout: float) -> concurrent.futures.Future[Counted]:
        waiter: concurrent.futures.Future[Counted] = concurrent.futures.Future()
        with self.lock:
            request_id = next(self.ids)
            self.waiting[request_id] = waiter
            try:
                self.stdin.write(json.dumps({"id": request_id, "path": path, "timeout": timeout}))
                self.stdin.write("\n")
                self.stdin.flush()
            except (OSError, ValueError) as exc:  # a helper that died (ValueError: closed)
                del self.waiting[request_id]
                waiter.set_exception(OSError(f"the disk counting helper is gone: {exc}"))
        return waiter

    def close(self) -> None:
        if self.pid != os.getpid():
            return
        with self.lock, contextlib.suppress(OSError):
            self.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_helper: _Helper | None = None
_helper_lock = threading.Lock()


def _current() -> _Helper:
    global _helper
    with _helper_lock:
        if _helper is None or not _helper.usable():
            if _helper is not None:
                _helper.close()
            _helper = _Helper()
        return _helper


@atexit.register
def _close() -> None:
    if _helper is not None:
        _helper.close()


async def count(path: str, timeout: float) -> Counted:
    """`du -sx -B1` then `du -sx --inodes` of `path`, run by the helper within `timeout`
    seconds (past it, killed: `code` None). Raises `OSError` when the helper cannot run."""
    reply = _current().submit(path, timeout)
    try:
        async with asyncio.timeout(timeout + HELPER_GRACE_S):
            return await asyncio.wrap_future(reply)
    except TimeoutError:  # the helper did not answer even after killing its `du`
        return Counted("", "the disk counting helper did not answer", None)
