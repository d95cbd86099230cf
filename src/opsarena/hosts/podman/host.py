"""`PodmanHost`: a podman container booted with systemd. Commands and files go through
`podman exec`, exactly as confined as the competitor's own commands, and their output
is never evidence; connections are made in the host's network namespace by the arena.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time

from opsarena.errors import (
    HostDownError,
    HostError,
    HostFileError,
    HostNetworkRefusedError,
    HostUnavailableError,
)
from opsarena.hosts import kernel
from opsarena.hosts.base import (
    DEFAULT_FILE_LIMIT,
    DEFAULT_OUTPUT_LIMIT,
    TIMEOUT_EXIT_CODE,
    ExecResult,
)
from opsarena.hosts.netns import socket_in_netns
from opsarena.hosts.podman.cli import last_line
from opsarena.hosts.podman.core import INIT_GONE_GRACE_S
from opsarena.hosts.podman.faults import PodmanFaults

USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$")
"""What `shell_argv` passes to `podman exec --user`: a user or uid, with a group or gid."""


class PodmanHost(PodmanFaults):
    """A podman container booted with systemd. See `Host` for the contract."""

    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout: float,
        input: bytes | None = None,
        user: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        # Marked, so that output past `output_limit` ends the command where it runs
        # (`kernel.end_exec`) instead of being read away while it floods on.
        marker = secrets.token_hex(8)
        podman_args = ["exec", "--env", f"{kernel.EXEC_MARK}={marker}"]
        if input is not None:
            podman_args.append("--interactive")
        if user is not None:
            podman_args += ["--user", user]
        # `timeout` runs inside the host and SIGKILLs the command's whole process group,
        # so a command past its time is really gone, not merely abandoned.
        podman_args += [self.name, "timeout", "--signal=KILL", f"{timeout:.3f}s", *argv]

        async def end() -> None:
            await asyncio.to_thread(kernel.end_exec, await self._init_pid(), marker)

        result = await self.podman.run(
            *podman_args,
            timeout=timeout + 15.0,
            input=input,
            output_limit=output_limit,
            on_overflow=end,
        )
        code = result.returncode
        if code in (125, 126, 255) and result.stderr.startswith(b"Error: "):
            if not self._rebooting and b"running container" in result.stderr:
                await self._init_pid()  # raises HostDownError when it stopped by itself
            raise HostUnavailableError(
                f"cannot run commands in {self.name}: {last_line(result.stderr)}"
            )
        timed_out = code == 128 + 9 and result.duration_ms >= timeout * 1000
        return ExecResult(
            exit_code=TIMEOUT_EXIT_CODE if timed_out else (code if code is not None else -1),
            stdout=result.stdout,
            stderr=result.stderr,
            truncated=result.truncated,
            duration_ms=result.duration_ms,
            timed_out=timed_out,
        )

    async def read_file(self, path: str, *, limit: int = DEFAULT_FILE_LIMIT) -> bytes:
        _require_absolute(path)
        script = 'test -f "$1" || { echo "not a regular file" >&2; exit 3; }; exec cat -- "$1"'
        result = await self.exec(
            ["bash", "-c", script, "read_file", path], timeout=60.0, output_limit=limit + 1
        )
        # Size first: output past the limit ends `cat` (`exec`), which then exits
        # killed or whole depending on which came first.
        if len(result.stdout) > limit:
            raise HostFileError(f"{path} in {self.name} is larger than {limit} bytes")
        if result.exit_code != 0:
            raise HostFileError(f"cannot read {path} in {self.name}: {last_line(result.stderr)}")
        return result.stdout

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        _require_absolute(path)
        if len(data) > DEFAULT_FILE_LIMIT:
            raise HostFileError(f"{len(data)} bytes is over the {DEFAULT_FILE_LIMIT} byte limit")
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" -- "$1"'
        result = await self.exec(
            ["bash", "-c", script, "write_file", path, f"{mode:o}"], timeout=60.0, input=data
        )
        if result.exit_code != 0:
            raise HostFileError(f"cannot write {path} in {self.name}: {last_line(result.stderr)}")

    def shell_argv(self, *, user: str | None = None, tty: bool = False) -> list[str]:
        argv = [self.podman.binary, "exec", "--interactive", *(["--tty"] if tty else [])]
        if user is None:
            argv += ["--workdir", "/root"]
        elif USER_RE.match(user):
            argv += ["--user", user]
        else:
            raise HostError(f"{user!r} is not a user name (NAME, UID or UID:GID)")
        return [*argv, self.name, "bash", "-l"]

    async def connect(
        self, port: int, *, timeout: float = 5.0
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is out of range")
        pid = await self._init_pid()
        try:
            sock = socket_in_netns(pid)
        except ProcessLookupError as exc:
            # init just went: ask podman whether the host stopped by itself (HostDownError),
            # giving it a moment to notice (it may still say "running" for a while).
            self._pid = 0
            deadline = time.monotonic() + INIT_GONE_GRACE_S
            while time.monotonic() < deadline and not self._rebooting:
                try:
                    if await self._init_pid() != pid:  # HostDownError once podman saw it stop
                        break  # running again with a new init (someone restarted it)
                    await asyncio.sleep(0.2)
                except HostDownError:
                    raise
                except HostUnavailableError:
                    await asyncio.sleep(0.2)
            raise HostUnavailableError(f"{self.name} is not running (init is gone)") from exc
        try:
            async with asyncio.timeout(timeout):
                try:
                    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
                except OSError as exc:
                    if exc.errno in HostNetworkRefusedError.NETWORK_ERRNOS:
                        raise HostNetworkRefusedError(exc.errno, exc.strerror) from exc
                    raise
                return await asyncio.open_connection(sock=sock)
        except BaseException:
            sock.close()
            raise


def _require_absolute(path: str) -> None:
    if not path.startswith("/"):
        raise HostFileError(f"{path!r} is not an absolute path")
