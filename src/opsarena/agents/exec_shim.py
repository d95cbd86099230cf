"""`$OPSARENA_EXEC` and `$OPSARENA_PUT`: how a command agent's program reaches its host.

Run as a script (standard library only, so it starts fast) by the small wrappers the
command agent writes into the program's view; it asks the agent's gate, a unix socket
served by the arena's process, to act on the host, and passes the answer through:

    shim exec SOCKET TOKEN WORDS...     run WORDS (joined by spaces) with bash -c in the
                                        host; stdout, stderr and the exit code pass through
    shim put SOCKET TOKEN LOCAL REMOTE  copy local file LOCAL to absolute REMOTE in the host

TOKEN is the agent's own gate token (the gate also checks the caller's uid).

Standard input is forwarded to the command when it is a pipe or a file (never a
terminal), up to `PAYLOAD_LIMIT` bytes, as is a file put. Exit code 255 with a line on
stderr means the host could not be reached (it may be rebooting) or the match is over.
OPSARENA_EXEC_TIMEOUT (seconds, default 300) bounds one command.

The request is one JSON line followed by the raw payload (the gate charges its size to
a memory budget before it reads it); the answer one JSON line followed by the raw
stdout and stderr (see `agents.command._Gate`).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from typing import Any

UNREACHABLE = 255
PAYLOAD_LIMIT = 100 * 1024 * 1024
"""Largest standard input or file one request carries (`hosts.DEFAULT_FILE_LIMIT`)."""


def _stdin_data() -> bytes | None:
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return None
    if stat.S_ISFIFO(mode) or stat.S_ISREG(mode):
        return sys.stdin.buffer.read(PAYLOAD_LIMIT + 1)
    return None


def _ask(path: str, request: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
    """The gate's answer (its JSON line) and the bytes after it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        sock.sendall(json.dumps(request).encode() + b"\n")
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before its payload was read: the answer says why
        chunks = []
        while data := sock.recv(1 << 16):
            chunks.append(data)
    line, _, rest = b"".join(chunks).partition(b"\n")
    reply: dict[str, Any] = json.loads(line)
    return reply, rest


def _request(op: str, args: list[str]) -> tuple[dict[str, Any], bytes] | str:
    """The request for `op` and its payload, or a usage message."""
    too_big = f"over {PAYLOAD_LIMIT} bytes: copy it in parts"
    if op == "exec":
        if not args:
            return "usage: $OPSARENA_EXEC 'COMMAND'"
        stdin = _stdin_data()
        if stdin is not None and len(stdin) > PAYLOAD_LIMIT:
            return f"standard input {too_big}"
        request = {
            "op": "exec",
            "command": " ".join(args),
            "timeout": float(os.environ.get("OPSARENA_EXEC_TIMEOUT") or 300),
            "stdin_size": len(stdin) if stdin is not None else None,
        }
        return request, stdin or b""
    if op == "put":
        if len(args) != 2:
            return "usage: $OPSARENA_PUT LOCAL_FILE /ABSOLUTE/PATH/IN/HOST"
        local, remote = args
        try:
            with open(local, "rb") as file:
                data = file.read(PAYLOAD_LIMIT + 1)
                mode = stat.S_IMODE(os.fstat(file.fileno()).st_mode)
        except OSError as exc:
            return f"cannot read {local}: {exc.strerror}"
        if len(data) > PAYLOAD_LIMIT:
            return f"{local} is {too_big}"
        return {"op": "put", "path": remote, "mode": mode, "size": len(data)}, data
    return f"unknown operation {op!r}"


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("opsarena: the exec shim needs OPERATION SOCKET TOKEN ...", file=sys.stderr)
        return 2
    op, path, token, args = argv[0], argv[1], argv[2], argv[3:]
    made = _request(op, args)
    if isinstance(made, str):
        print(f"opsarena: {made}", file=sys.stderr)
        return 2
    request, payload = made
    request["token"] = token
    try:
        reply, rest = _ask(path, request, payload)
    except (OSError, ValueError) as exc:
        print(f"opsarena: cannot reach the arena ({exc}): the match may be over", file=sys.stderr)
        return UNREACHABLE
    out_size = int(reply.get("stdout_size") or 0)
    sys.stdout.buffer.write(rest[:out_size])
    sys.stdout.flush()
    sys.stderr.buffer.write(rest[out_size : out_size + int(reply.get("stderr_size") or 0)])
    if reply.get("error"):
        print(f"opsarena: {reply['error']}", file=sys.stderr)
    sys.stderr.flush()
    return int(reply.get("exit_code", UNREACHABLE))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
