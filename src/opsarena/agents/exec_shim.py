"""`$OPSARENA_EXEC` and `$OPSARENA_PUT`: how a command agent's program reaches its host.

Run as a script (standard library only, so it starts fast) by the small wrappers the
command agent writes into the program's view; it asks the agent's gate, a unix socket
served by the arena's process, to act on the host, and passes the answer through:

    shim exec SOCKET TOKEN WORDS...     run WORDS (joined by spaces) with bash -c in the
                                        host; stdout, stderr and the exit code pass through
    shim put SOCKET TOKEN LOCAL REMOTE  copy local file LOCAL to absolute REMOTE in the host

TOKEN is the agent's own gate token (the gate also checks the caller's uid).

Standard input is forwarded to the command when it is a pipe or a file (never a
terminal). Exit code 255 with a line on stderr means the host could not be reached
(it may be rebooting) or the match is over. OPSARENA_EXEC_TIMEOUT (seconds, default
300) bounds one command.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import stat
import sys
from typing import Any

UNREACHABLE = 255


def _stdin_data() -> bytes | None:
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return None
    if stat.S_ISFIFO(mode) or stat.S_ISREG(mode):
        return sys.stdin.buffer.read()
    return None


def _ask(path: str, request: dict[str, Any]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        sock.sendall(json.dumps(request).encode() + b"\n")
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while data := sock.recv(1 << 16):
            chunks.append(data)
    reply: dict[str, Any] = json.loads(b"".join(chunks))
    return reply


def _request(op: str, args: list[str]) -> dict[str, Any] | str:
    """The request for `op`, or a usage message."""
    if op == "exec":
        if not args:
            return "usage: $OPSARENA_EXEC 'COMMAND'"
        stdin = _stdin_data()
        return {
            "op": "exec",
            "command": " ".join(args),
            "timeout": float(os.environ.get("OPSARENA_EXEC_TIMEOUT") or 300),
            "stdin": base64.b64encode(stdin).decode() if stdin is not None else None,
        }
    if op == "put":
        if len(args) != 2:
            return "usage: $OPSARENA_PUT LOCAL_FILE /ABSOLUTE/PATH/IN/HOST"
        local, remote = args
        try:
            with open(local, "rb") as file:
                data = file.read()
                mode = stat.S_IMODE(os.fstat(file.fileno()).st_mode)
        except OSError as exc:
            return f"cannot read {local}: {exc.strerror}"
        return {"op": "put", "path": remote, "mode": mode, "data": base64.b64encode(data).decode()}
    return f"unknown operation {op!r}"


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("opsarena: the exec shim needs OPERATION SOCKET TOKEN ...", file=sys.stderr)
        return 2
    op, path, token, args = argv[0], argv[1], argv[2], argv[3:]
    request = _request(op, args)
    if isinstance(request, str):
        print(f"opsarena: {request}", file=sys.stderr)
        return 2
    request["token"] = token
    try:
        reply = _ask(path, request)
    except (OSError, ValueError) as exc:
        print(f"opsarena: cannot reach the arena ({exc}): the match may be over", file=sys.stderr)
        return UNREACHABLE
    sys.stdout.buffer.write(base64.b64decode(reply.get("stdout") or ""))
    sys.stdout.flush()
    sys.stderr.buffer.write(base64.b64decode(reply.get("stderr") or ""))
    if reply.get("error"):
        print(f"opsarena: {reply['error']}", file=sys.stderr)
    sys.stderr.flush()
    return int(reply.get("exit_code", UNREACHABLE))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
