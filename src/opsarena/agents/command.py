"""The `command:PROGRAM ARGS...` agent: any program, run outside the host in its own process group.

The program gets the match in its environment:
- OPSARENA_BRIEF_FILE: a file holding the brief;
- OPSARENA_MATCH, OPSARENA_TERRITORY: the match id and its territory;
- OPSARENA_EXEC: a command prefix; `$OPSARENA_EXEC 'cmd'` runs `cmd` through bash in the
  host, passing its output and exit code through (255: host unreachable);
- OPSARENA_PUT: `$OPSARENA_PUT localfile /path/in/host` copies a file into the host.
Both are executables (usable from any language); they talk to a gate, a unix socket this
agent serves, which acts through `ctx.host` and records each action as a transcript entry.

Exit 0 → completed, successful; non-zero → failed, `failure_source` "player", exit code in
`terminal_detail`. Stdout and stderr are reported as "output" chunks, at most
`output_limit` bytes per stream. Cancellation, the deadline or the wall limit: SIGTERM to
the whole group, SIGKILL after `grace_s`. No process of the group outlives `run`, nor
one that left the group: the program runs in a cgroup of its own (`agents.cage`) when the
machine allows one, and whatever is left in it is killed when `run` ends.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from opsarena.agents.base import Agent, AgentContext, AgentOutcome
from opsarena.agents.cage import ProcessCage
from opsarena.agents.spec import AgentSettings
from opsarena.errors import AgentConfigError, HostError, HostUnavailableError
from opsarena.hosts import DEFAULT_FILE_LIMIT, DEFAULT_OUTPUT_LIMIT

OUTPUT_LIMIT = 1024 * 1024
"""Bytes of each of the program's streams reported as output."""
TRANSCRIPT_OUTPUT_LIMIT = 4096
"""Characters of an exec's stdout and stderr kept in its transcript entry."""
MAX_EXEC_TIMEOUT = 3600.0
DEFAULT_GRACE = 5.0
_CHUNK = 8192
_DRAIN_CHUNK = 1024 * 1024
_GATE_LINE_LIMIT = 2 * DEFAULT_FILE_LIMIT  # a base64 file of the largest size fits


class CommandAgent(Agent):
    """An external program competing through `$OPSARENA_EXEC` / `$OPSARENA_PUT`. See the
    module docstring for its environment and how it ends."""

    def __init__(
        self,
        argv: list[str],
        *,
        model: str = "",
        env: dict[str, str] | None = None,
        grace_s: float = DEFAULT_GRACE,
        wall_s: float | None = None,
        output_limit: int = OUTPUT_LIMIT,
    ) -> None:
        if not argv:
            raise AgentConfigError("a command agent needs a program: command:PROGRAM ARGS...")
        self.argv = argv
        self.model = model or Path(argv[0]).name
        self.env = env or {}
        self.grace_s = grace_s
        self.wall_s = wall_s
        self.output_limit = output_limit

    @classmethod
    def from_settings(cls, argv: list[str], settings: AgentSettings) -> CommandAgent:
        return cls(
            argv,
            model=settings.model or "",
            env=dict(settings.env),
            grace_s=settings.grace_s or DEFAULT_GRACE,
            wall_s=settings.limits.wall_s,
        )

    async def preflight(self) -> None:
        """Raise `AgentConfigError` unless the program exists and is executable."""
        self.check_program()

    def check_program(self) -> None:
        """`preflight`, for callers without an event loop."""
        program = self.argv[0]
        found = program if "/" in program else shutil.which(program)
        if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
            raise AgentConfigError(
                f"program {program!r} is not found or not executable: check command:{program}"
            )

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        workdir = Path(tempfile.mkdtemp(prefix="opsarena-agent-"))
        gate = _Gate(ctx)
        server: asyncio.Server | None = None
        try:
            brief = workdir / "brief.md"
            brief.write_text(ctx.brief)
            socket_path = str(workdir / "gate.sock")
            server = await asyncio.start_unix_server(
                gate.serve, path=socket_path, limit=_GATE_LINE_LIMIT
            )
            env = {
                **os.environ,
                **self.env,
                "OPSARENA_BRIEF_FILE": str(brief),
                "OPSARENA_MATCH": ctx.match_id,
                "OPSARENA_TERRITORY": ctx.territory,
                "OPSARENA_EXEC": _wrapper(workdir / "exec", "exec", socket_path),
                "OPSARENA_PUT": _wrapper(workdir / "put", "put", socket_path),
            }
            return await self._run_program(ctx, env)
        finally:
            if server is not None:
                server.close()
            await gate.close()
            shutil.rmtree(workdir, ignore_errors=True)

    async def _run_program(self, ctx: AgentContext, env: dict[str, str]) -> AgentOutcome:
        cage = ProcessCage.create(ctx.match_id, ctx.territory)
        try:
            return await self._run_caged(ctx, env, cage)
        finally:
            if cage is not None:  # whatever left the process group (setsid) ends here
                await asyncio.to_thread(cage.remove)

    async def _run_caged(
        self, ctx: AgentContext, env: dict[str, str], cage: ProcessCage | None
    ) -> AgentOutcome:
        argv = cage.wrap(self.argv) if cage is not None else self.argv
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            detail = f"cannot start {self.argv[0]}: {exc.strerror or exc}"
            return AgentOutcome("failed", False, detail, "player")
        assert proc.stdout is not None and proc.stderr is not None
        pumps = asyncio.gather(
            self._pump(ctx, proc.stdout, "stdout"), self._pump(ctx, proc.stderr, "stderr")
        )
        wall_end = time.monotonic() + self.wall_s if self.wall_s else math.inf
        scope = asyncio.timeout(min(ctx.deadline, wall_end) - time.monotonic())
        try:
            try:
                async with scope:
                    code = await proc.wait()
            except TimeoutError:
                if not scope.expired():
                    raise
                await self._stop(proc)
                if wall_end <= ctx.deadline:
                    detail = f"wall time limit ({self.wall_s:g}s) reached"
                    return AgentOutcome("terminated", None, detail, "player")
                return AgentOutcome("terminated", None, "match deadline reached", "controller")
            except asyncio.CancelledError:
                await self._stop(proc)
                raise
        finally:
            _kill_group(proc.pid, signal.SIGKILL)  # what is left of the group, whatever happened
            try:
                async with asyncio.timeout(self.grace_s):
                    await pumps
            except TimeoutError:
                pumps.cancel()
        if code == 0:
            return AgentOutcome("completed", True, "exited with code 0")
        if code < 0:
            return AgentOutcome("failed", False, f"killed by signal {-code}", "player")
        return AgentOutcome("failed", False, f"exited with code {code}", "player")

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        """SIGTERM to the group; SIGKILL to it once `grace_s` has passed with any left."""
        _kill_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.grace_s):
                await proc.wait()
                await _group_gone(proc.pid)
        _kill_group(proc.pid, signal.SIGKILL)
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


def _wrapper(path: Path, op: str, socket_path: str) -> str:
    shim = Path(__file__).with_name("exec_shim.py")
    words = [sys.executable, "-I", "-S", str(shim), op, socket_path]
    path.write_text(f'#!/bin/sh\nexec {" ".join(shlex.quote(w) for w in words)} "$@"\n')
    path.chmod(0o755)
    return str(path)


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _group_gone(pgid: int) -> None:
    """Return once no process is left in group `pgid` (polling; callers bound the wait)."""
    while True:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        await asyncio.sleep(0.05)


class _Gate:
    """Answers the shim's requests (one JSON line each way) by acting on `ctx.host`."""

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        self.tasks: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
        try:
            line = await reader.readline()
            try:
                request = json.loads(line)
                reply = await self._answer(request)
            except (ValueError, KeyError, TypeError) as exc:
                reply = {"exit_code": 2, "error": f"bad request to the gate: {exc}"}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            if task is not None:
                self.tasks.discard(task)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()

    async def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        host = self.ctx.host
        if request["op"] == "put":
            path, data = str(request["path"]), base64.b64decode(request["data"])
            try:
                await host.write_file(path, data, mode=int(request.get("mode", 0o644)) & 0o7777)
            except HostError as exc:
                await self._record(
                    {"kind": "put", "path": path, "bytes": len(data), "error": str(exc)}
                )
                code = 255 if isinstance(exc, HostUnavailableError) else 1
                return {"exit_code": code, "error": str(exc)}
            await self._record({"kind": "put", "path": path, "bytes": len(data)})
            return {"exit_code": 0}
        command = str(request["command"])
        stdin = base64.b64decode(request["stdin"]) if request.get("stdin") is not None else None
        timeout = min(float(request.get("timeout") or 300), MAX_EXEC_TIMEOUT)
        try:
            result = await host.exec(
                command, timeout=timeout, input=stdin, output_limit=DEFAULT_OUTPUT_LIMIT
            )
        except HostError as exc:
            error = f"the host is not reachable (it may be rebooting): {exc}"
            await self._record({"kind": "exec", "command": command, "error": error})
            return {"exit_code": 255, "error": error}
        await self._record(
            {
                "kind": "exec",
                "command": command,
                "exit_code": result.exit_code,
                "stdout": _clip(result.stdout),
                "stderr": _clip(result.stderr),
            }
        )
        reply: dict[str, Any] = {
            "exit_code": result.exit_code,
            "stdout": base64.b64encode(result.stdout).decode(),
            "stderr": base64.b64encode(result.stderr).decode(),
        }
        if result.timed_out:
            reply["error"] = f"killed after {timeout:g}s (OPSARENA_EXEC_TIMEOUT)"
        elif result.truncated:
            reply["error"] = f"output cut after {DEFAULT_OUTPUT_LIMIT} bytes per stream"
        return reply

    async def _record(self, entry: dict[str, Any]) -> None:
        await self.ctx.report("transcript", {"entry": entry})


def _clip(data: bytes) -> str:
    text = data.decode(errors="replace")
    if len(text) <= TRANSCRIPT_OUTPUT_LIMIT:
        return text
    return f"{text[:TRANSCRIPT_OUTPUT_LIMIT]}\n[... {len(text) - TRANSCRIPT_OUTPUT_LIMIT} more cut]"
