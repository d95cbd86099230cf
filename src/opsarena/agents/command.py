"""The `command:PROGRAM ARGS...` agent: any program, confined, acting on its host through its gate.

The program runs as an unprivileged user of its own in its own namespaces, in a cgroup
with pids, memory and CPU limits, and sees a private filesystem (see `agents.cage`):
/usr, a few files of /etc, empty /tmp and `$HOME`, its program file, the arguments that
name existing files or directories (`command:python3 agent.py`), and the `paths`
listed for it, read-only. No network unless `network` is set for it. Its environment
is exactly:
- OPSARENA_BRIEF_FILE: a file holding the brief;
- OPSARENA_MATCH, OPSARENA_TERRITORY: the match id and its territory;
- OPSARENA_EXEC: a command prefix; `$OPSARENA_EXEC 'cmd'` runs `cmd` through bash in the
  host, passing its output and exit code through (255: host unreachable);
- OPSARENA_PUT: `$OPSARENA_PUT localfile /path/in/host` copies a file into the host;
- PATH, HOME, TMPDIR, LANG, and the `env` given for it in the competitors file.
Nothing else of the arena's environment (no API key, no OPSARENA_DB) reaches it.
OPSARENA_EXEC and OPSARENA_PUT are executables (usable from any language); they talk to
the gate, a unix socket this agent serves, visible only in this program's mount
namespace. The gate answers only this program's user (SO_PEERCRED) presenting this
agent's token, acts through `ctx.host` and records each action as two transcript
entries: the request (`exec_request`, `put_request`) before anything is done, its result
(`exec`, `put`) after. A request that cannot be recorded is refused (exit code 2) and
not run. Commands, paths and output reach the log clipped (`agents.clip`).

Exit 0 → completed, successful; non-zero → failed, `failure_source` "player", exit code in
`terminal_detail`. Stdout and stderr are reported as "output" chunks, at most
`output_limit` bytes per stream. Cancellation, the deadline or the wall limit: SIGTERM to
every process of the cage, SIGKILL after `grace_s`. No process the program started
outlives `run`: whatever is left in its cgroup is killed when `run` ends.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import contextlib
import json
import logging
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opsarena.agents.base import Agent, AgentContext, AgentOutcome
from opsarena.agents.cage import (
    DEFAULT_LIMITS,
    SANDBOX_HOME,
    SANDBOX_PATH,
    SANDBOX_ROOT,
    CageLimits,
    ProcessCage,
    agent_uid,
    sandbox_argv,
    sandbox_tools,
    seccomp_program,
)
from opsarena.agents.clip import clip
from opsarena.agents.spec import AgentSettings
from opsarena.errors import AgentConfigError, HostError, HostUnavailableError
from opsarena.hosts import DEFAULT_FILE_LIMIT, DEFAULT_OUTPUT_LIMIT

log = logging.getLogger(__name__)

OUTPUT_LIMIT = 1024 * 1024
"""Bytes of each of the program's streams reported as output."""
TRANSCRIPT_OUTPUT_LIMIT = 4096
"""Bytes of an exec's stdout and stderr kept in its transcript entry (`clip`)."""
MAX_EXEC_TIMEOUT = 3600.0
DEFAULT_GRACE = 5.0
_CHUNK = 8192
_DRAIN_CHUNK = 1024 * 1024
GATE_HEADER_LIMIT = 1024 * 1024
"""Longest request line (JSON, before its payload); also what each connection's stream
buffers at most (twice this) before the gate pauses reading it."""
PAYLOAD_LIMIT = DEFAULT_FILE_LIMIT
"""Largest payload of one request: a put's file, an exec's standard input."""
GATE_CONNECTIONS = 16
"""Connections one gate has accepted at once; the program's further connects wait in the
listening socket's backlog (the kernel's), not in the arena's memory."""
GATE_READERS = 8
"""Requests one gate reads (line and payload) at once. A request waiting for the
competitor's host-operation cap, running, or answering holds no reader."""
EXEC_REPLY_ALLOWANCE = 4 * DEFAULT_OUTPUT_LIMIT + 1024 * 1024
"""Bytes an exec's answer may take in the arena: stdout and stderr as podman's reader
keeps and copies them, the reply's copies in the socket's buffer, one chunk of stdin
in the pipe to podman."""
PUT_ALLOWANCE = 1024 * 1024
"""Likewise for a put: one chunk of the file in the pipe to podman."""
GATE_BUDGET = 256 * 1024 * 1024
"""Bytes of requests one gate holds at once: each request is charged its line, twice its
payload while it is read (the chunks, then the one `bytes` they are joined into) and once
after, and its answer's allowance, before its payload is read, until its answer is
written. A request waits for room (its payload still in the program's socket); the
largest possible one always fits. So one agent's requests, however many and however
large, never hold more than this in the arena (docs/SECURITY.md has the measurement)."""
_PAYLOAD_CHUNK = 1024 * 1024
_SHIM = Path(__file__).with_name("exec_shim.py")
_SYSTEM_PYTHON = "/usr/bin/python3"
_HAVE_SYSTEM_PYTHON = os.path.exists(_SYSTEM_PYTHON)
_ENV_NAME = re.compile(r"(?!OPSARENA_|LD_)[A-Za-z_][A-Za-z0-9_]*")
"""A variable a competitors file may give a program (see `CommandAgent`)."""
GATE_PATH = f"{SANDBOX_ROOT}/gate/gate.sock"
"""The gate's socket as the program sees it."""


class CommandAgent(Agent):
    """An external program competing through `$OPSARENA_EXEC` / `$OPSARENA_PUT`. See the
    module docstring for its environment, its confinement and how it ends."""

    def __init__(
        self,
        argv: list[str],
        *,
        model: str = "",
        env: dict[str, str] | None = None,
        grace_s: float = DEFAULT_GRACE,
        wall_s: float | None = None,
        output_limit: int = OUTPUT_LIMIT,
        paths: Sequence[str] = (),
        network: bool = False,
        limits: CageLimits = DEFAULT_LIMITS,
    ) -> None:
        if not argv:
            raise AgentConfigError("a command agent needs a program: command:PROGRAM ARGS...")
        refused = sorted(name for name in env or {} if not _ENV_NAME.fullmatch(name))
        if refused:
            raise AgentConfigError(
                f"env {', '.join(refused)} cannot be given to a command agent: "
                "OPSARENA_* is the arena's interface, LD_* would reach the arena's own tools"
            )
        self.argv = argv
        self.model = model or Path(argv[0]).name
        self.env = env or {}
        self.grace_s = grace_s
        self.wall_s = wall_s
        self.output_limit = output_limit
        self.paths = [str(p) for p in paths]
        self.network = network
        self.limits = limits
        self.uid: int | None = None
        """The uid the program runs as (set by `run`)."""
        self.cage: ProcessCage | None = None
        """The program's cgroups while it runs (for tests and the bench)."""

    @classmethod
    def from_settings(cls, argv: list[str], settings: AgentSettings) -> CommandAgent:
        return cls(
            argv,
            model=settings.model or "",
            env=dict(settings.env),
            grace_s=settings.grace_s or DEFAULT_GRACE,
            wall_s=settings.limits.wall_s,
            paths=settings.paths,
            network=bool(settings.network),
        )

    async def preflight(self) -> None:
        """Raise `AgentConfigError` unless the program exists and is executable, every
        path to share exists, and this machine has the tools to confine it."""
        self.check_program()

    def check_program(self) -> None:
        """`preflight`, for callers without an event loop."""
        self._program()
        for path in self.paths:
            if not os.path.isabs(path) or not os.path.exists(path):
                raise AgentConfigError(
                    f"path {path!r} to share with {self.argv[0]} is not an existing absolute path"
                )
        sandbox_tools()

    def _program(self) -> str:
        """The program's absolute path (raises `AgentConfigError`)."""
        program = self.argv[0]
        found = os.path.abspath(program) if "/" in program else shutil.which(program)
        if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
            raise AgentConfigError(
                f"program {program!r} is not found or not executable: check command:{program}"
            )
        return found

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        try:
            program = self._program()
        except AgentConfigError as exc:
            return AgentOutcome("failed", False, str(exc), "player")
        try:
            tools = sandbox_tools()
        except AgentConfigError as exc:  # no confinement here: the arena's shortcoming
            return AgentOutcome("failed", False, str(exc), "arena")
        uid = self.uid = agent_uid()
        token = secrets.token_urlsafe(24)
        workdir = Path(tempfile.mkdtemp(prefix="opsarena-agent-"))  # root only, 0700
        gate = _Gate(ctx, uid=uid, token=token)
        seccomp_fd: int | None = None
        try:
            view = _make_view(workdir / "view", ctx.brief, token)
            socket_path = view / "gate" / "gate.sock"
            gate.listen(str(socket_path))
            socket_path.chmod(0o666)  # reachable only through this program's own view
            env = {
                **self.env,
                "PATH": SANDBOX_PATH,
                "HOME": SANDBOX_HOME,
                "TMPDIR": "/tmp",
                "LANG": "C.UTF-8",
                "OPSARENA_BRIEF_FILE": f"{SANDBOX_ROOT}/brief.md",
                "OPSARENA_MATCH": ctx.match_id,
                "OPSARENA_TERRITORY": ctx.territory,
                "OPSARENA_EXEC": f"{SANDBOX_ROOT}/exec",
                "OPSARENA_PUT": f"{SANDBOX_ROOT}/put",
            }
            args, named = _shared_args(self.argv[1:])
            shared = [p for p in [program, *named, *self.paths] if _outside_usr(p)]
            if not _HAVE_SYSTEM_PYTHON:  # the shim needs an interpreter
                shared.append(sys.base_prefix)
            if (filter_bytes := seccomp_program()) is not None:
                seccomp_fd = _pipe_with(filter_bytes)
            argv = sandbox_argv(
                [program, *args],
                uid=uid,
                view=view,
                read_only=shared,
                network=self.network,
                tools=tools,
                seccomp_fd=seccomp_fd,
            )
            return await self._run_program(ctx, argv, env, seccomp_fd)
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
            await gate.close()
            shutil.rmtree(workdir, ignore_errors=True)

    async def _run_program(
        self, ctx: AgentContext, argv: list[str], env: dict[str, str], seccomp_fd: int | None
    ) -> AgentOutcome:
        try:
            cage = await asyncio.to_thread(
                ProcessCage.create, ctx.match_id, ctx.territory, self.limits
            )
        except AgentConfigError as exc:
            return AgentOutcome("failed", False, str(exc), "arena")
        self.cage = cage
        try:
            fds = () if seccomp_fd is None else (seccomp_fd,)
            return await self._run_caged(ctx, cage.wrap(argv), env, cage, fds)
        finally:  # whatever the program started ends here, setsid or not
            await asyncio.to_thread(cage.remove)

    async def _run_caged(
        self,
        ctx: AgentContext,
        argv: list[str],
        env: dict[str, str],
        cage: ProcessCage,
        pass_fds: tuple[int, ...],
    ) -> AgentOutcome:
        # The output comes through pipes of our own, not the process's: an orphan the
        # program daemonised (and the sandbox's pid 1, which waits for it) keeps them open
        # after the program has exited, and asyncio's `wait()` also waits for the pipes
        # it made; the agent then ended `terminated` at the drain instead of with the
        # program's own exit. Its end is the sandbox's exit (bwrap returns the program's
        # status as soon as the program exits); what it left is killed just after.
        pipes = [os.pipe(), os.pipe()]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=pipes[0][1],
                stderr=pipes[1][1],
                env=env,
                start_new_session=True,
                pass_fds=pass_fds,
            )
        except OSError as exc:
            for read_end, _ in pipes:
                os.close(read_end)
            detail = f"cannot start {self.argv[0]}: {exc.strerror or exc}"
            return AgentOutcome("failed", False, detail, "player")
        finally:
            for _, write_end in pipes:
                os.close(write_end)
        (stdout, out_pipe), (stderr, err_pipe) = [await _read_pipe(r) for r, _ in pipes]
        pumps = asyncio.gather(self._pump(ctx, stdout, "stdout"), self._pump(ctx, stderr, "stderr"))
        wall_end = time.monotonic() + self.wall_s if self.wall_s else math.inf
        scope = asyncio.timeout(min(ctx.deadline, wall_end) - time.monotonic())
        try:
            try:
                async with scope:
                    code = await proc.wait()
            except TimeoutError:
                if not scope.expired():
                    raise
                await self._stop(proc, cage)
                if wall_end <= ctx.deadline:
                    detail = f"wall time limit ({self.wall_s:g}s) reached"
                    return AgentOutcome("terminated", None, detail, "player")
                return AgentOutcome("terminated", None, "match deadline reached", "controller")
            except asyncio.CancelledError:
                await self._stop(proc, cage)
                raise
        finally:
            await asyncio.to_thread(cage.kill_all)  # what is left, whatever happened
            try:
                async with asyncio.timeout(self.grace_s):
                    await pumps
            except TimeoutError:
                pumps.cancel()
            out_pipe.close()
            err_pipe.close()
        if code == 0:
            return AgentOutcome("completed", True, "exited with code 0")
        if code < 0:
            return AgentOutcome("failed", False, f"killed by signal {-code}", "player")
        return AgentOutcome("failed", False, f"exited with code {code}", "player")

    async def _stop(self, proc: asyncio.subprocess.Process, cage: ProcessCage) -> None:
        """SIGTERM to every process of the cage; SIGKILL to them once `grace_s` has
        passed with any left."""
        cage.signal_all(signal.SIGTERM)
        await asyncio.to_thread(cage.wait_empty, self.grace_s)
        await asyncio.to_thread(cage.kill_all)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.grace_s):
                await proc.wait()

    async def _pump(self, ctx: AgentContext, stream: asyncio.StreamReader, name: str) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        seen = 0
        cut = False
        # Past the cut, keep draining (in big reads) so the program never blocks on a
        # full pipe; the cut is reported once, even when it falls between two reads.
        while chunk := await stream.read(_DRAIN_CHUNK if cut else _CHUNK):
            room = self.output_limit - seen
            seen += len(chunk)
            if cut:
                continue
            text = decoder.decode(chunk[:room]) if room > 0 else ""
            if seen > self.output_limit:
                cut = True
                text += decoder.decode(b"", final=True)
                text += f"\n[{name} cut after {self.output_limit} bytes]\n"
            if text:
                await ctx.report("output", {"stream": name, "text": text})
        if not cut and (rest := decoder.decode(b"", final=True)):
            await ctx.report("output", {"stream": name, "text": rest})


async def _read_pipe(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    """A stream reading the pipe `fd` (which it then owns), and the transport to close."""
    reader = asyncio.StreamReader()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader, transport


def _make_view(view: Path, brief: str, token: str) -> Path:
    """The directory the program sees at `SANDBOX_ROOT` (root-owned, read-only to it):
    the brief, the shim, the `exec` and `put` wrappers (which carry the gate token) and
    an empty `gate/` for the gate's socket."""
    view.mkdir(mode=0o755)
    view.chmod(0o755)
    (view / "gate").mkdir(mode=0o755)
    (view / "gate").chmod(0o755)
    (view / "brief.md").write_text(brief)
    (view / "brief.md").chmod(0o644)
    shutil.copyfile(_SHIM, view / "shim.py")
    (view / "shim.py").chmod(0o644)
    python = _SYSTEM_PYTHON if _HAVE_SYSTEM_PYTHON else os.path.realpath(sys.executable)
    for op in ("exec", "put"):
        words = [python, "-I", "-S", f"{SANDBOX_ROOT}/shim.py", op, GATE_PATH, token]
        wrapper = view / op
        wrapper.write_text(f'#!/bin/sh\nexec {" ".join(shlex.quote(w) for w in words)} "$@"\n')
        wrapper.chmod(0o755)
    return view


def peer_uid(writer: asyncio.StreamWriter) -> int | None:
    """The uid of the process at the other end of a unix socket (SO_PEERCRED), or None."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class _Budget:
    """A count of bytes requests take and give back; a request that does not fit waits,
    in arrival order (a large request is not starved by small ones behind it)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self.peak = 0
        """The most bytes taken at once (for tests and the bench)."""
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def take(self, size: int) -> None:
        if not 0 <= size <= self.total:
            raise ValueError(f"{size} bytes can never fit in a budget of {self.total}")
        if not self._waiting and size <= self.free:
            self._took(size)
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((size, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.give(size)  # granted, but cancelled before it could be used
            raise

    def give(self, size: int) -> None:
        self.free += size
        while self._waiting:
            size, granted = self._waiting[0]
            if granted.done():  # cancelled while waiting
                self._waiting.popleft()
                continue
            if size > self.free:
                break
            self._waiting.popleft()
            self._took(size)
            granted.set_result(None)

    def _took(self, size: int) -> None:
        self.free -= size
        self.peak = max(self.peak, self.total - self.free)


class _Refused(Exception):
    """A request the gate answers with exit code 2 and does nothing for."""


class _Gate:
    """Answers the shim's requests by acting on `ctx.host`, for the program of uid `uid`
    presenting `token` only: anything else gets exit code 2 and nothing is done or
    recorded in this agent's name.

    The protocol (the shim's side is `exec_shim.py`): a request is one JSON line,
    `{"token", "op": "exec", "command", "timeout", "stdin_size": N | null}` or `{"token",
    "op": "put", "path", "mode", "size": N}`, followed by exactly N raw bytes (the
    standard input, the file); the answer is one JSON line, `{"exit_code", "error"?,
    "stdout_size", "stderr_size"}`, followed by those raw bytes of stdout, then stderr.

    What it holds in the arena is bounded whatever the program does: at most
    `GATE_CONNECTIONS` accepted connections (each stream buffering at most twice
    `GATE_HEADER_LIMIT` before it is paused), `GATE_READERS` of them reading at once, and
    every request's payload and answer charged to `GATE_BUDGET` before its payload is
    read (see `GATE_BUDGET`)."""

    def __init__(self, ctx: AgentContext, *, uid: int, token: str) -> None:
        self.ctx = ctx
        self.uid = uid
        self.token = token
        self.tasks: set[asyncio.Task[None]] = set()
        self.refused = 0
        self.failed = 0
        """Requests the gate failed on (an arena bug, answered with exit code 2)."""
        self.unrecorded = 0
        """Requests refused because they could not be recorded before they ran."""
        self.budget = _Budget(GATE_BUDGET)
        self._readers = asyncio.Semaphore(GATE_READERS)
        self._connections = asyncio.Semaphore(GATE_CONNECTIONS)
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None

    def listen(self, path: str) -> None:
        """Serve the gate on a new unix socket at `path`."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(64)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._accepting = asyncio.create_task(self._accept(listener), name="gate-accept")

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._connections.acquire()
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors, say: the program waits meanwhile
                self._connections.release()
                log.warning("%s: its gate cannot accept: %s", self.ctx.territory, exc)
                await asyncio.sleep(0.1)
                continue
            except BaseException:
                self._connections.release()
                raise
            task = asyncio.create_task(self._connection(conn))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        """Stop accepting, close the socket, cancel the requests still in flight (or
        waiting for the competitor's cap): their shims see the connection drop (255)."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._listener is not None:
            self._listener.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _connection(self, conn: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn, limit=GATE_HEADER_LIMIT)
        except BaseException:
            conn.close()
            self._connections.release()
            raise
        held = 0
        try:
            async with self._readers:
                try:
                    request, payload, held = await self._read(reader, writer)
                except _Refused as exc:
                    await self._reply(writer, {"exit_code": 2, "error": str(exc)})
                    return
            # The reader is free again: waiting for the competitor's cap holds none.
            try:
                answer, out, err = await self._answer(request, payload)
            except _Refused as exc:
                await self._reply(writer, {"exit_code": 2, "error": str(exc)})
                return
            del payload
            await self._reply(writer, answer, out, err)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # `close` cancels requests still in flight (or waiting for the competitor's
            # cap) when the agent ends; the shim sees the connection drop (exit 255).
            return
        except Exception:  # a bug here must end this request, never the gate's task
            self.failed += 1
            if self.failed == 1:  # once: a program that triggers it must not flood the log
                log.exception("%s: a request to its gate failed", self.ctx.territory)
            with contextlib.suppress(Exception):
                await self._reply(
                    writer, {"exit_code": 2, "error": "the arena failed on this request"}
                )
        finally:
            self.budget.give(held)
            writer.close()
            self._connections.release()

    async def _read(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[dict[str, Any], bytes, int]:
        """The request, its payload and the bytes of budget it now holds. Raises
        `_Refused` (nothing taken) for a request the gate does not serve."""
        try:
            line = await reader.readline()  # ValueError past GATE_HEADER_LIMIT
            request = json.loads(line)
        except ValueError as exc:
            raise _Refused(f"bad request to the gate: {exc}") from None
        if not self._authentic(writer, request):
            self.refused += 1
            if self.refused == 1:  # once: a flood of refusals must not flood the log
                log.warning("%s: a request to its gate was refused", self.ctx.territory)
            raise _Refused("this gate belongs to another agent")
        try:
            size = _payload_size(request)
        except (ValueError, KeyError, TypeError) as exc:
            raise _Refused(f"bad request to the gate: {exc}") from None
        allowance = PUT_ALLOWANCE if request["op"] == "put" else EXEC_REPLY_ALLOWANCE
        cost = len(line) + 2 * size + allowance
        await self.budget.take(cost)
        try:
            chunks = []
            remaining = size
            while remaining:
                chunk = await reader.read(min(remaining, _PAYLOAD_CHUNK))
                if not chunk:
                    raise asyncio.IncompleteReadError(b"", remaining)
                chunks.append(chunk)
                remaining -= len(chunk)
            payload = b"".join(chunks)
            del chunks
        except BaseException:
            self.budget.give(cost)
            raise
        self.budget.give(size)  # the chunks are gone; the joined payload stays charged
        return request, payload, cost - size

    def _authentic(self, writer: asyncio.StreamWriter, request: object) -> bool:
        token = request.get("token") if isinstance(request, dict) else None
        return (
            peer_uid(writer) == self.uid
            and isinstance(token, str)
            and secrets.compare_digest(token.encode(), self.token.encode())
        )

    async def _reply(
        self, writer: asyncio.StreamWriter, answer: dict[str, Any], out: bytes = b"",
        err: bytes = b"",
    ) -> None:  # fmt: skip
        answer = {**answer, "stdout_size": len(out), "stderr_size": len(err)}
        writer.write(json.dumps(answer).encode() + b"\n")
        writer.write(out)
        writer.write(err)
        await writer.drain()

    async def _answer(
        self, request: dict[str, Any], payload: bytes
    ) -> tuple[dict[str, Any], bytes, bytes]:
        """Record the request, act on it, record its result. A request that cannot be
        recorded raises `_Refused`: nothing in the host happens unrecorded."""
        host = self.ctx.host
        if request["op"] == "put":
            path, mode = str(request["path"]), int(request.get("mode", 0o644)) & 0o7777
            shown = {"path": clip(path), "bytes": len(payload)}
            await self._record_request({"kind": "put_request", **shown, "mode": f"{mode:04o}"})
            try:
                await host.write_file(path, payload, mode=mode)
            except HostError as exc:
                await self._record({"kind": "put", **shown, "error": clip(str(exc))})
                code = 255 if isinstance(exc, HostUnavailableError) else 1
                return {"exit_code": code, "error": str(exc)}, b"", b""
            await self._record({"kind": "put", **shown})
            return {"exit_code": 0}, b"", b""
        command = str(request["command"])
        stdin = payload if request.get("stdin_size") is not None else None
        timeout = min(float(request.get("timeout") or 300), MAX_EXEC_TIMEOUT)
        await self._record_request(
            {
                "kind": "exec_request",
                "command": clip(command),
                "timeout": timeout,
                "stdin_bytes": None if stdin is None else len(stdin),
            }
        )
        try:
            result = await host.exec(
                command, timeout=timeout, input=stdin, output_limit=DEFAULT_OUTPUT_LIMIT
            )
        except HostError as exc:
            error = f"the host is not reachable (it may be rebooting): {exc}"
            await self._record({"kind": "exec", "command": clip(command), "error": error})
            return {"exit_code": 255, "error": error}, b"", b""
        await self._record(
            {
                "kind": "exec",
                "command": clip(command),
                "exit_code": result.exit_code,
                "stdout": clip(result.stdout, TRANSCRIPT_OUTPUT_LIMIT),
                "stderr": clip(result.stderr, TRANSCRIPT_OUTPUT_LIMIT),
                **({"output_cut": True} if result.truncated else {}),
            }
        )
        answer: dict[str, Any] = {"exit_code": result.exit_code}
        if result.timed_out:
            answer["error"] = f"killed after {timeout:g}s (OPSARENA_EXEC_TIMEOUT)"
        elif result.truncated:
            answer["error"] = (
                f"output past {DEFAULT_OUTPUT_LIMIT} bytes on a stream: the command was ended"
            )
        return answer, result.stdout, result.stderr

    async def _record_request(self, entry: dict[str, Any]) -> None:
        """Record what is about to be done; raises `_Refused` (and nothing is done) when
        it cannot be recorded, whatever the reason."""
        try:
            await self.ctx.report("transcript", {"entry": entry})
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.unrecorded += 1
            if self.unrecorded == 1:
                log.warning("%s: a request could not be recorded: %r", self.ctx.territory, exc)
            raise _Refused(
                f"the arena cannot record this request ({type(exc).__name__}): not run"
            ) from None

    async def _record(self, entry: dict[str, Any]) -> None:
        """Record what was done. A result that cannot be recorded is only warned about:
        its request is in the log already, and the program still gets its answer."""
        try:
            await self.ctx.report("transcript", {"entry": entry})
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s: a result could not be recorded: %r", self.ctx.territory, exc)


def _payload_size(request: dict[str, Any]) -> int:
    """The payload size `request` announces, after checking the request's fields (raises
    `ValueError`, `KeyError` or `TypeError` naming what is wrong)."""
    op = request["op"]
    if op == "put":
        str(request["path"])
        int(request.get("mode", 0o644))
        size = request["size"]
    elif op == "exec":
        str(request["command"])
        timeout = float(request.get("timeout") or 300)
        if not 0 < timeout < math.inf:  # also NaN
            raise ValueError(f"timeout {request.get('timeout')!r} is not a positive number")
        size = request.get("stdin_size")
        size = 0 if size is None else size
    else:
        raise ValueError(f"unknown operation {op!r}")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= PAYLOAD_LIMIT:
        raise ValueError(f"a payload of {size!r} bytes: at most {PAYLOAD_LIMIT} may be sent")
    return size


def _pipe_with(data: bytes) -> int:
    """The read end of a pipe holding exactly `data` (which fits in a pipe's buffer)."""
    read, write = os.pipe()
    try:
        os.write(write, data)
    finally:
        os.close(write)
    return read


def _shared_args(args: list[str]) -> tuple[list[str], list[str]]:
    """`args` with those naming an existing file or directory (relative to the arena's
    working directory) made absolute, and the list of those, to bind into the sandbox."""
    out, named = [], []
    for arg in args:
        if not arg.startswith("-") and os.path.exists(arg):
            arg = os.path.abspath(arg)
            named.append(arg)
        out.append(arg)
    return out, named


def _outside_usr(path: str) -> bool:
    """Whether `path` must be bound to be seen: /usr is there already, /usr/local is not."""
    return not path.startswith("/usr/") or path.startswith("/usr/local/")
