"""The podman driver: each host is a podman container running systemd as PID 1.

Containers have no network (`--network none`), so a host has only its own loopback;
the arena reaches servers in it through `connect()` (a socket made in the
container's network namespace) and runs commands through `podman exec`.

What a machine needs is detected when the driver starts, never assumed: a hybrid
cgroup hierarchy needs the runc runtime (crun refuses it), and ulimits are capped
at the arena's own hard limits (raising them needs CAP_SYS_RESOURCE).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import time
from typing import Any

from opsarena.errors import (
    DriverMissingError,
    FaultUnsupportedError,
    HostBootError,
    HostDownError,
    HostError,
    HostFileError,
    HostNotFoundError,
    HostUnavailableError,
    ImageMissingError,
    ServiceNotRestartedError,
    ServiceNotRunningError,
    ServiceRestartError,
    UnitMissingError,
)
from opsarena.hosts import crash, powerdisk
from opsarena.hosts.base import (
    DEFAULT_FILE_LIMIT,
    DEFAULT_OUTPUT_LIMIT,
    FAULT_POWER_CUT,
    FAULT_SERVICE_CRASH,
    TIMEOUT_EXIT_CODE,
    ExecResult,
    Host,
    HostDriver,
    HostInfo,
    HostSpec,
)
from opsarena.hosts.netns import socket_in_netns
from opsarena.hosts.process import ProcessResult, run_process

LABEL_MATCH = "opsarena.match"
LABEL_TERRITORY = "opsarena.territory"
LABEL_DISK = "opsarena.disk"
"""`power` on a host whose root is a power-cut disk (`hosts/powerdisk.py`)."""
LABEL_IMAGE = "opsarena.image"
RUNC_ROOT = "/run/runc"
"""Where runc keeps its containers' state for podman run as root."""
PODMAN_TIMEOUT = 30.0
# Ceilings for the hosts' ulimits. Podman's defaults (1048576) exceed the hard limits
# of an unprivileged arena, and conmon may run with a lower NPROC hard limit than the
# shell that started it, so stay well below both; --pids-limit bounds processes anyway.
NOFILE_CEILING = 8192
NPROC_CEILING = 4096
_READY_STATES = ("running", "degraded")
_UNIT_RE = re.compile(r"^[A-Za-z0-9:_.@\\-]+$")


def _cgroup_is_hybrid() -> bool:
    """True on a cgroup v1/v2 hybrid (a tmpfs at /sys/fs/cgroup with `unified` in it)."""
    return os.path.isdir("/sys/fs/cgroup/unified") and not os.path.exists(
        "/sys/fs/cgroup/cgroup.controllers"
    )


def _ulimit(kind: int, ceiling: int) -> int:
    _soft, hard = resource.getrlimit(kind)
    return ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)


class Podman:
    """The podman command line, with a timeout on every call and this machine's quirks."""

    def __init__(self, binary: str | None = None) -> None:
        found = binary or shutil.which("podman")
        if not found:
            raise DriverMissingError(
                "podman is not installed: run ./bootstrap (or apt-get install podman runc)"
            )
        self.binary = found
        self.run_flags = self._detect_run_flags()
        self.nsenter = shutil.which("nsenter")
        """util-linux's nsenter, for the arena's own queries inside a host (or None)."""

    @staticmethod
    def _detect_run_flags() -> list[str]:
        flags: list[str] = []
        if _cgroup_is_hybrid():
            if not shutil.which("runc"):
                raise DriverMissingError(
                    "this machine has hybrid cgroups, which only the runc runtime "
                    "supports: apt-get install runc"
                )
            flags += ["--runtime", "runc"]
        nofile = _ulimit(resource.RLIMIT_NOFILE, NOFILE_CEILING)
        nproc = _ulimit(resource.RLIMIT_NPROC, NPROC_CEILING)
        flags += ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]
        return flags

    async def run(
        self,
        *args: str,
        timeout: float = PODMAN_TIMEOUT,
        input: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ProcessResult:
        """Run `podman ARGS`. Raises `HostUnavailableError` when podman itself hangs."""
        result = await run_process(
            [self.binary, *args], timeout=timeout, input=input, output_limit=output_limit
        )
        if result.timed_out:
            raise HostUnavailableError(f"podman {args[0]} did not answer within {timeout:g}s")
        return result

    async def check(self, *args: str, timeout: float = PODMAN_TIMEOUT) -> str:
        """Run `podman ARGS` and return its stdout; raise `HostUnavailableError` on failure."""
        result = await self.run(*args, timeout=timeout)
        if result.returncode != 0:
            raise HostUnavailableError(f"podman {args[0]} failed: {_last_line(result.stderr)}")
        return result.stdout.decode(errors="replace")


def _last_line(data: bytes) -> str:
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


FREEZE_ROUNDS = 20
"""`freeze_disk` tries this many times to catch the host without a file open for writing."""


def _host_pids(init_pid: int) -> list[int]:
    """Processes (as this machine numbers them) in the PID namespace of `init_pid`, but
    not init itself."""
    namespace = os.readlink(f"/proc/{init_pid}/ns/pid")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == init_pid:
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                found.append(int(entry))
    return found


def _signal_host_processes(init_pid: int, signum: int) -> list[int]:
    """Send `signum` to every process of the host but its init; return whom it reached."""
    reached = []
    for pid in _host_pids(init_pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
            reached.append(pid)
    return reached


def _root_writers(init_pid: int) -> list[int]:
    """Processes of the host holding a file on its root filesystem open for writing."""
    root_mount = None
    with open(f"/proc/{init_pid}/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            if fields[4] == "/":
                root_mount = fields[0]
    writers = []
    for pid in _host_pids(init_pid):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fdinfo"):
                info = _fdinfo(pid, fd)
                flags = int(info.get("flags", "0"), 8)
                if flags & os.O_ACCMODE != os.O_RDONLY and info.get("mnt_id") == root_mount:
                    writers.append(pid)
                    break
    return writers


def _fdinfo(pid: int, fd: str) -> dict[str, str]:
    """The fields of /proc/PID/fdinfo/FD (empty when the fd closed meanwhile)."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as info:
            return {
                key.strip(): value.strip()
                for key, _, value in (line.partition(":") for line in info)
                if value
            }
    except OSError:
        return {}


def _init_start_time(pid: int) -> int | None:
    """The start time (clock ticks since the machine booted) of process `pid`."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[19])  # field 22 of stat(5); fields[0] here is field 3


class PodmanHost(Host):
    """A podman container booted with systemd. See `Host` for the contract."""

    def __init__(
        self,
        podman: Podman,
        name: str,
        match_id: str,
        territory: str,
        disk: powerdisk.PowerDisk | None = None,
    ) -> None:
        self.podman = podman
        self.disk = disk
        self.name = name
        self.match_id = match_id
        self.territory = territory
        self._boots = 1
        self._pid = 0
        self._boot_id: int | None = None
        self._frozen = False
        self._rebooting = False
        self.last_crash_restart_ms: int | None = None
        """Milliseconds from the last `crash_service` kill to the new main process."""

    @property
    def boots(self) -> int:
        return self._boots

    async def _inspect(self) -> dict[str, Any]:
        result = await self.podman.run(
            "inspect", "--type", "container", "--format", "json", self.name
        )
        if result.returncode != 0:
            if b"no such" in result.stderr.lower():
                raise HostNotFoundError(f"host {self.name} does not exist")
            raise HostUnavailableError(f"cannot inspect {self.name}: {_last_line(result.stderr)}")
        data: list[dict[str, Any]] = json.loads(result.stdout)
        return data[0]

    async def _init_pid(self) -> int:
        """PID (on this machine) of the host's init, refreshed when the host rebooted."""
        if self._pid and _init_start_time(self._pid) == self._boot_id:
            return self._pid
        state = (await self._inspect())["State"]
        if not state.get("Running"):
            if self._rebooting:
                raise HostUnavailableError(f"host {self.name} is rebooting")
            if state.get("OOMKilled"):
                raise HostDownError(
                    f"host {self.name} stopped by itself: its init was killed for lack of "
                    "memory (it is over its memory limit; /tmp and /run count against it)"
                )
            raise HostDownError(
                f"host {self.name} stopped by itself ({state.get('Status')}, exit code "
                f"{state.get('ExitCode')}): its init exited, e.g. after poweroff or halt"
            )
        self._pid = int(state["Pid"])
        self._boot_id = _init_start_time(self._pid)
        return self._pid

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
        podman_args = ["exec"]
        if input is not None:
            podman_args.append("--interactive")
        if user is not None:
            podman_args += ["--user", user]
        # `timeout` runs inside the host and SIGKILLs the command's whole process group,
        # so a command past its time is really gone, not merely abandoned.
        podman_args += [self.name, "timeout", "--signal=KILL", f"{timeout:.3f}s", *argv]
        result = await self.podman.run(
            *podman_args, timeout=timeout + 15.0, input=input, output_limit=output_limit
        )
        code = result.returncode
        if code in (125, 126, 255) and result.stderr.startswith(b"Error: "):
            if not self._rebooting and b"running container" in result.stderr:
                await self._init_pid()  # raises HostDownError when it stopped by itself
            raise HostUnavailableError(
                f"cannot run commands in {self.name}: {_last_line(result.stderr)}"
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
        if result.exit_code != 0:
            raise HostFileError(f"cannot read {path} in {self.name}: {_last_line(result.stderr)}")
        if len(result.stdout) > limit:
            raise HostFileError(f"{path} in {self.name} is larger than {limit} bytes")
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
            raise HostFileError(f"cannot write {path} in {self.name}: {_last_line(result.stderr)}")

    async def _unit_state(self, unit: str) -> tuple[str, str, int]:
        result = await self.exec(
            ["systemctl", "show", "--property=LoadState,ActiveState,MainPID", "--", unit],
            timeout=10.0,
        )
        props = dict(
            line.split("=", 1) for line in result.stdout.decode().splitlines() if "=" in line
        )
        return (
            props.get("LoadState", ""),
            props.get("ActiveState", ""),
            int(props.get("MainPID") or 0),
        )

    async def restart_service(self, unit: str, *, timeout: float = 30.0) -> int:
        if not _UNIT_RE.match(unit):
            raise UnitMissingError(f"{unit!r} is not a systemd unit name")
        load, active, old_pid = await self._unit_state(unit)
        if load != "loaded":
            raise UnitMissingError(
                f"unit {unit} does not exist in {self.name} ({load or 'unknown'})"
            )
        if old_pid == 0:
            raise ServiceNotRunningError(
                f"unit {unit} in {self.name} has no running process ({active})"
            )
        deadline = time.monotonic() + timeout
        # reset-failed first: restarts the arena injects are not crashes, and must not
        # push the competitor's unit over its start rate limit (StartLimitBurst).
        restart = await self.exec(
            [
                "bash",
                "-c",
                'systemctl reset-failed -- "$1"; exec systemctl restart -- "$1"',
                "-",
                unit,
            ],
            timeout=timeout,
        )
        if restart.exit_code != 0:
            raise ServiceRestartError(
                f"systemctl restart {unit} failed in {self.name}: {_last_line(restart.stderr)}"
            )
        while True:
            _load, active, pid = await self._unit_state(unit)
            if pid not in (0, old_pid):
                return pid
            if time.monotonic() >= deadline:
                raise ServiceRestartError(
                    f"unit {unit} in {self.name} had no new main process {timeout:g}s after "
                    f"restart ({active}, MainPID {pid})"
                )
            await asyncio.sleep(0.1)

    async def reboot(self, *, hard: bool = False, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        old_boot = (self._pid, self._boot_id) if self._pid else None
        with contextlib.suppress(HostError):
            await self._init_pid()
            old_boot = (self._pid, self._boot_id)
        self._rebooting = True
        try:
            if hard:
                await self.podman.check("kill", "--signal", "KILL", self.name, timeout=timeout)
                await self.podman.check("start", self.name, timeout=timeout)
            else:
                # podman sends SIGRTMIN+3, systemd's "halt" request, and waits for it.
                await self.podman.check("restart", "--time", "20", self.name, timeout=timeout)
            await self._init_pid()
        finally:
            self._rebooting = False
        if (self._pid, self._boot_id) == old_boot:
            raise HostBootError(f"{self.name} did not reboot: its init has the same start time")
        self._boots += 1
        await self.wait_ready(max(1.0, deadline - time.monotonic()))
        if self._frozen:  # a new boot mounts the disk read-write again
            await self.freeze_disk()

    async def _system_state(self, timeout: float) -> str:
        """What `systemctl is-system-running` says in the host.

        Asked through nsenter into the host's namespaces when available: a poll then
        costs ~10 ms instead of a `podman exec` (~200 ms), which is most of the time
        from boot to ready. Only this readiness query runs that way; competitors'
        commands always go through `exec`.
        """
        argv = ["systemctl", "is-system-running"]
        nsenter = self.podman.nsenter
        if nsenter is None:
            result = await self.exec(argv, timeout=timeout)
            return result.stdout.decode().strip() or _last_line(result.stderr)
        pid = await self._init_pid()
        entered = await run_process(
            [
                nsenter,
                f"--target={pid}",
                "--mount",
                "--uts",
                "--ipc",
                "--net",
                "--pid",
                "--",
                *argv,
            ],
            timeout=timeout,
            output_limit=4096,
        )
        return entered.stdout.decode().strip() or _last_line(entered.stderr)

    async def wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        last = "not started"
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                last = await self._system_state(timeout=max(0.5, min(remaining, 10.0)))
                if last in _READY_STATES:
                    return last
                if last == "maintenance":  # boot failed to emergency/rescue: it will not heal
                    raise HostBootError(f"{self.name} failed to boot (systemd: maintenance)")
                # "offline" (manager not reachable yet), "initializing", "starting": wait.
            except HostUnavailableError as exc:
                last = str(exc)
            await asyncio.sleep(0.02)
        raise HostBootError(f"{self.name} was not ready within {timeout:g}s (systemd: {last})")

    async def disk_usage(self) -> int:
        # The container's writable overlay layer holds everything it wrote to disk.
        inspected = await self._inspect()
        upper = (inspected.get("GraphDriver", {}).get("Data") or {}).get("UpperDir")
        if self.disk is not None:
            upper = str(self.disk.upper)
        if not upper:
            raise HostUnavailableError(f"{self.name} has no writable layer podman can show")
        counted = await run_process(["du", "-sx", "-B1", upper], timeout=60.0, output_limit=4096)
        if counted.returncode != 0 or not counted.stdout.split():
            raise HostUnavailableError(
                f"cannot measure the disk of {self.name}: {_last_line(counted.stderr)}"
            )
        return int(counted.stdout.split()[0])

    async def freeze_disk(self) -> None:
        nsenter = self.podman.nsenter
        if nsenter is None:
            raise HostUnavailableError("nsenter (util-linux) is needed to freeze a host's disk")
        pid = await self._init_pid()
        self._frozen = True
        remount = [nsenter, f"--target={pid}", "--mount", "--", "mount", "-o", "remount,ro", "/"]
        last = ""
        for _round in range(FREEZE_ROUNDS):
            # The kernel refuses a read-only remount while any file on it is open for
            # writing: stop the host's processes (not init), kill those writers, remount.
            stopped = await asyncio.to_thread(_signal_host_processes, pid, signal.SIGSTOP)
            try:
                writers = await asyncio.to_thread(_root_writers, pid)
                for writer in writers:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(writer, signal.SIGKILL)
                if writers:
                    await asyncio.sleep(0.05)
                frozen = await run_process(remount, timeout=30.0, output_limit=4096)
            finally:
                for stopped_pid in stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(stopped_pid, signal.SIGCONT)
            if frozen.returncode == 0:
                return
            last = _last_line(frozen.stderr)
            await asyncio.sleep(0.05)
        raise HostUnavailableError(f"cannot make the disk of {self.name} read-only: {last}")

    async def crash_service(self, unit: str, *, timeout: float = 10.0) -> int:
        name = crash.unit_name(unit)
        pid = await self._init_pid()
        boot = self._boot_id
        host_cgroup, freezer = await asyncio.to_thread(crash.host_cgroups, pid)
        cgroup = await asyncio.to_thread(crash.unit_cgroup, host_cgroup, name)
        if cgroup is None:
            raise ServiceNotRunningError(f"unit {name} in {self.name} has no running process")
        # As for restart_service: the arena's crashes must not push the unit over its
        # start rate limit (the referee may crash it once a second). Asked inside the
        # host's confinement; nothing it prints is used.
        await self.exec(["systemctl", "reset-failed", "--", name], timeout=10.0)
        victims = await asyncio.to_thread(crash.kill_unit, cgroup, freezer)
        if not victims:
            raise ServiceNotRunningError(f"unit {name} in {self.name} has no running process")
        killed_at = time.monotonic()
        while not await asyncio.to_thread(crash.gone, victims):
            if time.monotonic() - killed_at > 10.0:
                raise HostUnavailableError(
                    f"the processes of {name} in {self.name} survived SIGKILL"
                )
            await asyncio.sleep(0.005)
        while True:
            crash.require_alive(pid, boot)
            found = await asyncio.to_thread(crash.new_process, cgroup, victims, pid)
            if found is not None:
                self.last_crash_restart_ms = int((time.monotonic() - killed_at) * 1000)
                return await asyncio.to_thread(crash.namespace_pid, found.pid)
            if time.monotonic() - killed_at >= timeout:
                raise ServiceNotRestartedError(
                    f"unit {name} in {self.name} was not restarted within {timeout:g}s of "
                    "being killed (does it have Restart=?)"
                )
            await asyncio.sleep(0.01)

    async def power_cut(self, *, timeout: float = 60.0) -> None:
        disk = self.disk
        if disk is None:
            raise FaultUnsupportedError(
                f"host {self.name} has no power-cut disk (create it with HostSpec.power_cut)"
            )
        deadline = time.monotonic() + timeout
        try:
            async with powerdisk.locked(disk):
                await self._power_cut_locked(disk, deadline)
        except FileNotFoundError:
            raise HostNotFoundError(f"host {self.name} was removed during the power cut") from None
        self._boots += 1
        await self.wait_ready(max(1.0, deadline - time.monotonic()))
        if self._frozen:
            await self.freeze_disk()

    async def _power_cut_locked(self, disk: powerdisk.PowerDisk, deadline: float) -> None:
        if disk.removed or not disk.exists():
            raise HostNotFoundError(f"host {self.name} is being removed")
        pid = await self._init_pid()
        old_boot = (pid, self._boot_id)
        self._rebooting = True
        try:
            # Killing a PID namespace's init kills every process in it at once; the
            # disk loses power right after, so nothing acknowledged later was durable.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            await powerdisk.control(disk, "cut")
            while (await self._inspect())["State"].get("Running"):
                if time.monotonic() > deadline:
                    raise HostBootError(f"{self.name} did not stop at the power cut")
                await asyncio.sleep(0.01)
            await powerdisk.power_cycle(disk)
            if disk.removed:
                raise HostNotFoundError(f"host {self.name} was removed during the power cut")
            await self.podman.check(
                "start", self.name, timeout=max(1.0, deadline - time.monotonic())
            )
            self._pid = 0
            await self._init_pid()
        finally:
            self._rebooting = False
        if (self._pid, self._boot_id) == old_boot:
            raise HostBootError(f"{self.name} did not boot after the power cut")

    async def connect(
        self, port: int, *, timeout: float = 5.0
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is out of range")
        pid = await self._init_pid()
        try:
            sock = socket_in_netns(pid)
        except ProcessLookupError as exc:
            self._pid = 0  # init just went: ask podman whether it stopped by itself
            await self._init_pid()
            raise HostUnavailableError(f"{self.name} is not running (init is gone)") from exc
        try:
            async with asyncio.timeout(timeout):
                await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
                return await asyncio.open_connection(sock=sock)
        except BaseException:
            sock.close()
            raise


def _require_absolute(path: str) -> None:
    if not path.startswith("/"):
        raise HostFileError(f"{path!r} is not an absolute path")


class PodmanDriver(HostDriver):
    """Hosts as podman containers. See `HostDriver`."""

    name = "podman"
    faults = frozenset({"restart", "reboot", FAULT_SERVICE_CRASH, FAULT_POWER_CUT})

    def __init__(self, podman: Podman | None = None) -> None:
        self.podman = podman or Podman()

    def _host(self, name: str, labels: dict[str, str]) -> PodmanHost:
        disk = powerdisk.PowerDisk.of(name) if labels.get(LABEL_DISK) == "power" else None
        return PodmanHost(
            self.podman, name, labels.get(LABEL_MATCH, ""), labels.get(LABEL_TERRITORY, ""), disk
        )

    async def _image_layers(self, image: str) -> list[str]:
        """The image's layer directories, topmost first (an overlay's lowerdir)."""
        out = await self.podman.check("image", "inspect", "--format", "json", image)
        data = (json.loads(out)[0].get("GraphDriver") or {}).get("Data") or {}
        layers = [data["UpperDir"]] if data.get("UpperDir") else []
        layers += [layer for layer in (data.get("LowerDir") or "").split(":") if layer]
        return layers

    async def _make_disk(self, spec: HostSpec, name: str) -> powerdisk.PowerDisk:
        disk = powerdisk.PowerDisk.of(name)
        await powerdisk.destroy(disk)  # a leftover of a host podman no longer has
        layers = await self._image_layers(spec.image)
        await powerdisk.create(disk, size_mb=spec.disk_mb, lowerdirs=layers, match_id=spec.match_id)
        return disk

    async def create(self, spec: HostSpec, *, boot_timeout: float = 60.0) -> Host:
        name = self.host_name(spec.match_id, spec.territory)
        if (await self.podman.run("image", "exists", spec.image)).returncode != 0:
            raise ImageMissingError(f"image {spec.image} is not there: run `opsarena image build`")
        if (await self.podman.run("container", "exists", name)).returncode == 0:
            raise HostError(
                f"host {name} exists already: remove it with `opsarena hosts rm {name}`"
            )
        disk = await self._make_disk(spec, name) if spec.power_cut else None
        root = ["--rootfs", str(disk.root)] if disk else [spec.image]
        disk_labels = ["--label", f"{LABEL_DISK}=power"] if disk else []
        result = await self.podman.run(
            "run", "--detach", "--name", name, "--hostname", spec.territory,
            "--label", f"{LABEL_MATCH}={spec.match_id}",
            "--label", f"{LABEL_TERRITORY}={spec.territory}",
            "--label", f"{LABEL_IMAGE}={spec.image}", *disk_labels,
            # The runtime's own record names the match too, so that `cleanup` finds a
            # container podman has forgotten (see `sweep_runtime`).
            "--annotation", f"{LABEL_MATCH}={spec.match_id}",
            "--network", "none", "--systemd", "always",
            "--cpus", f"{spec.cpus:g}", "--memory", f"{spec.memory_mb}m",
            "--memory-swap", f"{spec.memory_mb}m", "--pids-limit", str(spec.pids_limit),
            *self.podman.run_flags,
            *root, "/sbin/init",
            timeout=boot_timeout,
        )  # fmt: skip
        host = PodmanHost(self.podman, name, spec.match_id, spec.territory, disk)
        try:
            if result.returncode != 0:
                raise HostBootError(f"host {name} did not start: {_last_line(result.stderr)}")
            await host.wait_ready(boot_timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.remove(name)
            if disk is not None:
                with contextlib.suppress(Exception):
                    await powerdisk.destroy(disk)
            raise
        return host

    async def cleanup(self, *, match_id: str | None = None) -> builtins.list[str]:
        """Remove the hosts podman knows, then sweep what outlived podman's knowledge:
        runtime containers and power-cut disks of hosts podman no longer has."""
        removed = await super().cleanup(match_id=match_id)
        return removed + await self.sweep_runtime(match_id=match_id)

    async def sweep_runtime(self, *, match_id: str | None = None) -> builtins.list[str]:
        """Kill and delete runc containers annotated as ours that podman has forgotten,
        and destroy power-cut disks whose host podman no longer has; return what went."""
        known = set(
            (await self.podman.check("ps", "--all", "--no-trunc", "--format", "{{.ID}}")).split()
        )
        names = set((await self.podman.check("ps", "--all", "--format", "{{.Names}}")).split())
        swept: list[str] = []
        runc = shutil.which("runc")
        if runc is not None:
            listed = await run_process(
                [runc, "--root", RUNC_ROOT, "list", "--format", "json"], timeout=PODMAN_TIMEOUT
            )
            for row in json.loads(listed.stdout or b"null") or []:
                annotations = row.get("annotations") or {}
                ours = annotations.get(LABEL_MATCH)
                if ours is None or row["id"] in known or match_id not in (None, ours):
                    continue
                for argv in (["kill", row["id"], "KILL"], ["delete", "--force", row["id"]]):
                    await run_process([runc, "--root", RUNC_ROOT, *argv], timeout=PODMAN_TIMEOUT)
                swept.append(f"runc:{row['id'][:12]}")
        for disk in powerdisk.all_disks():
            if disk.dir.name in names or match_id not in (None, disk.match_id):
                continue
            disk.mark_removed()
            async with powerdisk.locked(disk):
                await powerdisk.destroy(disk)
            swept.append(f"disk:{disk.dir.name}")
        return swept

    async def get(self, name: str) -> Host:
        host = PodmanHost(self.podman, name, "", "")
        labels = (await host._inspect())["Config"].get("Labels") or {}
        if LABEL_MATCH not in labels:
            raise HostNotFoundError(f"{name} is not an opsarena host")
        return self._host(name, labels)

    async def list(self, *, match_id: str | None = None) -> list[HostInfo]:
        label = f"{LABEL_MATCH}={match_id}" if match_id is not None else LABEL_MATCH
        out = await self.podman.check(
            "ps", "--all", "--filter", f"label={label}", "--format", "json"
        )
        infos = []
        for row in json.loads(out or "[]"):
            labels = row.get("Labels") or {}
            infos.append(
                HostInfo(
                    name=row["Names"][0],
                    match_id=labels.get(LABEL_MATCH, ""),
                    territory=labels.get(LABEL_TERRITORY, ""),
                    image=labels.get(LABEL_IMAGE) or row.get("Image", ""),
                    state=row.get("State", ""),
                    created=str(row.get("CreatedAt", "")),
                    labels=labels,
                )
            )
        return sorted(infos, key=lambda info: info.name)

    async def remove(self, name: str) -> None:
        # `rm --force` succeeds for a missing container, so ask first.
        if (await self.podman.run("container", "exists", name)).returncode == 1:
            raise HostNotFoundError(f"host {name} does not exist")
        disk = powerdisk.PowerDisk.of(name)
        if not disk.exists():
            await self._rm(name)
            return
        # A power cut in flight checks the mark before it boots the host again, and
        # holds the lock until it has: removing under the lock means it never comes back.
        disk.mark_removed()
        await self._rm(name)
        async with powerdisk.locked(disk):
            await self._rm(name)
            await powerdisk.destroy(disk)

    async def _rm(self, name: str) -> None:
        result = await self.podman.run("rm", "--force", "--time", "0", name, timeout=60.0)
        if result.returncode != 0:
            raise HostUnavailableError(f"cannot remove {name}: {_last_line(result.stderr)}")
