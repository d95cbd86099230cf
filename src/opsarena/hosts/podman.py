"""The podman driver: each host is a podman container running systemd as PID 1.

Containers have no network (`--network none`), so a host has only its own loopback;
the arena reaches servers in it through `connect()` (a socket made in the
container's network namespace) and runs commands through `podman exec`.

What a machine needs is detected when the driver starts, never assumed: a hybrid
cgroup hierarchy needs the runc runtime (crun refuses it), and ulimits are capped
at the arena's own hard limits (raising them needs CAP_SYS_RESOURCE).

Trust: the arena never runs a program from a host's filesystem with its own
privileges. Readiness and restarts go over the host's private systemd bus
(`systemd_bus`); the effect of a restart and of a disk freeze is confirmed with
kernel facts read from outside (`kernel`); the freeze itself is mount(2) from a thread
that entered the host's mount namespace. Only `exec`, `read_file` and `write_file` run
inside a host, through `podman exec`, exactly as confined as the competitor's own
commands, and their output is never evidence.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import logging
import os
import re
import resource
import secrets
import shutil
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import platformdirs

from opsarena.errors import (
    BootFailedError,
    DiskMeasureError,
    DriverMissingError,
    FaultUnsupportedError,
    HostBootError,
    HostDownError,
    HostError,
    HostFileError,
    HostNetworkRefusedError,
    HostNotFoundError,
    HostUnavailableError,
    ImageMissingError,
    PathMissingError,
    ServiceNotRestartedError,
    ServiceNotRunningError,
    ServiceRestartError,
    UnitMissingError,
)
from opsarena.hosts import crash, diskcount, diskloss, kernel, powerdisk
from opsarena.hosts.base import (
    DEFAULT_FILE_LIMIT,
    DEFAULT_OUTPUT_LIMIT,
    FAULT_DISK_LOSS,
    FAULT_POWER_CUT,
    FAULT_SERVICE_CRASH,
    TIMEOUT_EXIT_CODE,
    DiskUse,
    ExecResult,
    Host,
    HostDriver,
    HostInfo,
    HostSpec,
    ServiceRestart,
)
from opsarena.hosts.disk import IO_ANNOTATION, WriteCaps, io_controller, own_disks_possible
from opsarena.hosts.idmap import IdRange
from opsarena.hosts.kernel import Proc
from opsarena.hosts.netns import socket_in_netns
from opsarena.hosts.process import ProcessResult, run_process
from opsarena.hosts.runc import runc_containers
from opsarena.hosts.systemd_bus import BusError, KeptBus, SystemdBus, report_empty_cgroup

log = logging.getLogger(__name__)

LABEL_MATCH = "opsarena.match"
LABEL_TERRITORY = "opsarena.territory"
LABEL_DISK = "opsarena.disk"
"""`power` on a host whose root is a power-cut disk (`hosts/powerdisk.py`), `fixed` on
one whose root is a fixed-size disk (`hosts/disk.py`); none on a host made before every
host had a disk of its own (its root is in podman's storage)."""
DISK_KINDS = ("power", "fixed")
LABEL_IMAGE = "opsarena.image"
LABEL_IDS_OF = "opsarena.ids-of"
"""On a power-cut host's id reservation (`ids_name`): the host's name."""
LABEL_IDS_MATCH = "opsarena.ids-match"
"""On a power-cut host's id reservation: the host's match (for `cleanup --match`)."""
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
        self.global_flags: list[str] = []
        """Flags before podman's subcommand (the arena's hooks directory)."""
        self.confine_flags = self._prepare_confinement()
        """`podman run` flags that confine a host (see `_prepare_confinement`)."""
        self.io_controller = io_controller()
        """The cgroup controller that caps a host's disk writes, or None (`hosts/disk.py`)."""
        self.own_disks = own_disks_possible()
        """Whether every host gets a fixed-size disk of its own (`hosts/disk.py`); else
        an ordinary host's root is in podman's storage, bounded by the quota watch only."""

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

    def _prepare_confinement(self) -> list[str]:
        """The flags that put a host in a user namespace of its own, deny it new user
        namespaces, and leave it no writable file of the machine's disk.

        - `--userns auto`: podman gives each host a distinct range of the uids listed
          for `containers` in /etc/subuid and /etc/subgid, so no host shares the arena's
          ids, and the arena's `start_hook` (run by podman before the host's init, at
          every start) caps its per-user kernel limits (inotify instances and watches)
          in that namespace: the owner of every host's namespace is the machine's root,
          so without a cap of its own a host could spend root's whole budget. On a
          cgroup v1/hybrid machine the hook also hands the host its systemd cgroup
          (runc leaves it owned by the machine's root).
        - a seccomp profile derived from podman's default that refuses `CLONE_NEWUSER`
          in clone/unshare and answers clone3 with ENOSYS (so libc falls back to clone).
        - `--no-hosts` and read-only binds for /etc/hostname and /run/.containerenv: the
          files podman would bind read-write from the machine's disk, outside the host's
          measured layer.
        """
        state = platformdirs.user_state_path("opsarena") / "hosts"
        flags: list[str] = []
        if not _has_subids("containers"):
            raise DriverMissingError(
                "hosts need uid ranges of their own: add `containers:1073741824:1073741824` "
                "to /etc/subuid and /etc/subgid (./bootstrap does it)"
            )
        self.userns_flags = ["--userns", "auto:size=65536"]
        flags += self.userns_flags
        budget = _read_int("/proc/sys/user/max_inotify_instances")
        if budget is not None and budget < MACHINE_INOTIFY_INSTANCES:
            raise DriverMissingError(
                f"the machine's root may hold only {budget} inotify instances, which a few "
                f"hosts (64 each) could spend: sysctl -w fs.inotify.max_user_instances="
                f"{MACHINE_INOTIFY_INSTANCES} (./bootstrap does it)"
            )
        hooks = _write_once(state, "hook.json", _hook_config())
        self.global_flags = ["--hooks-dir", str(hooks.parent)]
        flags += ["--annotation", f"{HOOK_ANNOTATION}=1"]
        profile = _write_once(state, "seccomp.json", seccomp_profile(DEFAULT_SECCOMP))
        flags += ["--security-opt", f"seccomp={profile}"]
        empty = _write_once(state, "containerenv", b"")
        flags += ["--no-hosts", "--mount", f"type=bind,src={empty},dst=/run/.containerenv,ro=true"]
        self.state_dir = state
        return flags

    def hostname_file(self, territory: str) -> Path:
        """A read-only-mounted /etc/hostname for a host of `territory`."""
        return _write_once(self.state_dir, "hostname", f"{territory}\n".encode())

    async def run(
        self,
        *args: str,
        timeout: float = PODMAN_TIMEOUT,
        input: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        on_overflow: Callable[[], Awaitable[None]] | None = None,
    ) -> ProcessResult:
        """Run `podman ARGS` (`run_process` says what `on_overflow` does). Raises
        `HostUnavailableError` when podman itself hangs."""
        result = await run_process(
            [self.binary, *self.global_flags, *args],
            timeout=timeout,
            input=input,
            output_limit=output_limit,
            on_overflow=on_overflow,
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


def _without_userns(flags: list[str]) -> list[str]:
    """`flags` without their `--userns VALUE` pair."""
    kept: list[str] = []
    skip = False
    for flag in flags:
        if skip:
            skip = False
        elif flag == "--userns":
            skip = True
        else:
            kept.append(flag)
    return kept


def _last_line(data: bytes) -> str:
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def disk_kind(disk: powerdisk.PowerDisk) -> str:
    """`LABEL_DISK`'s value for a host on `disk`."""
    return "power" if disk.power else "fixed"


def ids_name(host: str) -> str:
    """The name of the container that holds the id range of power-cut host `host`
    (never a host's name: those begin with `opsarena-`)."""
    return f"ids.{host}"


def _single_range(entries: list[str] | None, what: str) -> tuple[int, int]:
    """(machine base, size) of a podman id map that is one `0:BASE:SIZE` entry."""
    if not entries or len(entries) != 1:
        raise HostBootError(f"podman reserved no single {what} range: {entries!r}")
    inside, base, size = (int(part) for part in entries[0].split(":"))
    if inside != 0:
        raise HostBootError(f"podman's {what} range does not start at 0: {entries[0]}")
    return base, size


HOOK_ANNOTATION = "opsarena.start-hook"
DEFAULT_SECCOMP = "/usr/share/containers/seccomp.json"
CLONE_NEWUSER = 0x10000000
ENOSYS = 38
EPERM = 1


MACHINE_INOTIFY_INSTANCES = 8192
"""Least inotify budget of the machine's root the driver accepts (hosts are capped at 64
each in their own namespace by `start_hook`, and all are charged to root as well)."""


def _read_int(path: str) -> int | None:
    try:
        with open(path) as value:
            return int(value.read())
    except (OSError, ValueError):
        return None


def _has_subids(user: str) -> bool:
    """Whether /etc/subuid and /etc/subgid both give `user` a range."""
    for name in ("/etc/subuid", "/etc/subgid"):
        try:
            with open(name) as listing:
                if not any(line.split(":", 1)[0] == user for line in listing):
                    return False
        except FileNotFoundError:
            return False
    return True


def _write_once(directory: Path, name: str, data: bytes) -> Path:
    """`directory/<sha>-name` holding `data`, written atomically if not there yet (many
    arena processes share it; the content names the file, so none overwrites another)."""
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(data).hexdigest()[:16]
    if name == "hook.json":  # podman reads every *.json of a hooks directory
        directory = directory / f"hooks-{digest}"
        directory.mkdir(exist_ok=True)
        path = directory / name
    else:
        path = directory / f"{digest}-{name}"
    if not path.exists():
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        temporary.write_bytes(data)
        temporary.chmod(0o644)
        os.replace(temporary, path)
    return path


def _hook_config() -> bytes:
    hook = str(Path(__file__).with_name("start_hook.py"))
    config = {
        "version": "1.0.0",
        "hook": {"path": sys.executable, "args": [sys.executable, "-I", "-S", hook]},
        "when": {"annotations": {f"^{re.escape(HOOK_ANNOTATION)}$": ".*"}},
        "stages": ["createRuntime"],
    }
    return json.dumps(config, indent=1).encode()


def seccomp_profile(default_path: str) -> bytes:
    """Podman's default seccomp profile at `default_path`, changed so a host cannot make
    user namespaces: clone and unshare with `CLONE_NEWUSER` fail with EPERM, clone3
    (whose flags seccomp cannot read) fails with ENOSYS. Everything else is unchanged.
    Raises `DriverMissingError` when the default profile is not there."""
    try:
        with open(default_path) as default:
            profile: dict[str, Any] = json.load(default)
    except OSError as exc:
        raise DriverMissingError(
            f"podman's default seccomp profile {default_path} is missing: "
            "apt-get install golang-github-containers-common"
        ) from exc
    denied = {"clone", "clone3", "unshare"}
    for rule in profile["syscalls"]:
        if rule.get("action") == "SCMP_ACT_ALLOW":
            rule["names"] = [name for name in rule["names"] if name not in denied]
    profile["syscalls"] = [rule for rule in profile["syscalls"] if rule["names"]]
    without_newuser = {
        "index": 0,
        "value": CLONE_NEWUSER,
        "valueTwo": 0,
        "op": "SCMP_CMP_MASKED_EQ",
    }
    with_newuser = {**without_newuser, "valueTwo": CLONE_NEWUSER}
    for name in ("clone", "unshare"):
        profile["syscalls"].append(
            {"names": [name], "action": "SCMP_ACT_ALLOW", "args": [without_newuser]}
        )
        profile["syscalls"].append(
            {
                "names": [name],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
                "args": [with_newuser],
            }
        )
    profile["syscalls"].append(
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS}
    )
    return json.dumps(profile, indent=1).encode()


INIT_GONE_GRACE_S = 5.0
RESTORE_TIMEOUT_S = 30.0
"""Bound on bringing a host back after a power cut that failed midway."""
CGROUP_NUDGE_S = 0.5
"""After a kill, how long the driver waits before it tells the host's systemd (again) that
the unit's cgroup may be empty (`systemd_bus.report_empty_cgroup`)."""
"""How long `connect` waits for podman to say whether a host whose init died is down."""

REMOVE_ATTEMPTS = 5
"""`remove` tries this many times while podman finds the host's shm mount busy."""

READY_POLL_FIRST_S = 0.02
READY_POLL_MAX_S = 0.5
"""`wait_ready` asks again after 20 ms, then twice as long each time up to 500 ms: a boot
takes seconds, and at a steady 20 ms, with 32 hosts booting, parsing systemd's answers
took 7 % of the controller's Python time (docs/PERFORMANCE.md)."""

DISK_COUNT_S = 30.0
"""`disk_use` counts a host's writable layer (bytes, then inodes) within this long."""

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
    with open(f"/proc/{init_pid}/mountinfo", errors="surrogateescape") as mountinfo:
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
        with open(f"/proc/{pid}/fdinfo/{fd}", errors="surrogateescape") as info:
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


CLONE_FS = 0x00000200
CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_REMOUNT = 32
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def remount_root_read_only(init_pid: int) -> str | None:
    """Remount the root filesystem of the host of `init_pid` read-only with mount(2)
    itself: no program (the host's `mount` least of all) runs for it. Returns None on
    success, else the error.

    A fresh thread unshares its filesystem attributes (so it alone may change mount
    namespace), enters the host's mount namespace, remounts and ends; the arena's other
    threads never leave their own namespace.
    """
    try:
        ns_fd = os.open(f"/proc/{init_pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return f"the host's init is gone ({exc.strerror})"
    outcome: list[str | None] = []

    def enter_and_remount() -> None:
        steps: tuple[tuple[str, Callable[[], int]], ...] = (
            ("unshare(CLONE_FS)", lambda: int(_libc.unshare(CLONE_FS))),
            ("setns(mnt)", lambda: int(_libc.setns(ns_fd, CLONE_NEWNS))),
            (
                "mount(remount,ro)",
                lambda: int(_libc.mount(None, b"/", None, MS_REMOUNT | MS_RDONLY, None)),
            ),
        )
        for step, call in steps:
            if call() != 0:
                outcome.append(f"{step}: {os.strerror(ctypes.get_errno())}")
                return
        outcome.append(None)

    try:
        thread = threading.Thread(target=enter_and_remount, name=f"mnt-{init_pid}", daemon=True)
        thread.start()
        thread.join()
    finally:
        os.close(ns_fd)
    return outcome[0] if outcome else "the remount thread failed"


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
        self._stopped_by_arena = False
        """True from the arena's stop of the host (a reboot, a power cut) until it runs
        again: a host left stopped by a fault that failed midway is the arena's doing,
        never reported as a host that stopped by itself."""
        self._upper: str | None = None
        self.last_crash_restart_ms: int | None = None
        """Milliseconds from the last `crash_service` kill to the new main process."""
        self.last_restart: ServiceRestart | None = None
        self._kept_bus = KeptBus()

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
        known = self._pid and self._boot_id is not None
        if known and kernel.alive(Proc(self._pid, self._boot_id or 0)):  # a zombie is gone
            return self._pid
        state = (await self._inspect())["State"]
        if not state.get("Running"):
            if self._rebooting:
                raise HostUnavailableError(f"host {self.name} is rebooting")
            if self._stopped_by_arena:
                raise HostUnavailableError(
                    f"host {self.name} is stopped: a reboot or power cut the arena began "
                    "did not complete"
                )
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
        if not self._rebooting:
            self._stopped_by_arena = False
        if self._boot_id is None or not kernel.alive(Proc(self._pid, self._boot_id)):
            # init died (or is a zombie) and podman has not noticed yet
            self._pid = 0
            raise HostUnavailableError(f"{self.name} is not running (init is gone)")
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
        # Size first: output past the limit ends `cat` (`exec`), which then exits
        # killed or whole depending on which came first.
        if len(result.stdout) > limit:
            raise HostFileError(f"{path} in {self.name} is larger than {limit} bytes")
        if result.exit_code != 0:
            raise HostFileError(f"cannot read {path} in {self.name}: {_last_line(result.stderr)}")
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

    async def _bus(self, what: str, timeout: float) -> SystemdBus:
        pid = await self._init_pid()
        try:
            return await asyncio.to_thread(SystemdBus, pid, timeout=timeout)
        except BusError as exc:
            raise HostUnavailableError(f"{what} in {self.name}: {exc}") from exc

    def _unit_cgroup(self, init_pid: int, claimed: str, unit: str) -> str:
        """The unit's cgroup, as systemd names it, accepted only below the host's own."""
        root = kernel.container_cgroup(init_pid)
        parts = claimed.split("/")
        if not claimed.startswith("/") or any(p in (".", "..") for p in parts):
            raise ServiceRestartError(
                f"systemd in {self.name} puts {unit} in cgroup {claimed!r}, outside the host"
            )
        # With a cgroup namespace of its own (cgroup v2) systemd names paths below its
        # root; without one (v1/hybrid here) it names them as the machine does.
        return claimed if claimed.startswith(root + "/") else root + claimed

    async def unit_members(self, unit: str) -> list[Proc]:
        if not _UNIT_RE.match(unit):
            raise UnitMissingError(f"{unit!r} is not a systemd unit name")
        pid = await self._init_pid()
        try:  # asked at every health check: on the connection kept for it
            state = await asyncio.to_thread(
                self._kept_bus.ask, pid, 10.0, lambda bus: bus.unit_state(unit)
            )
        except BusError as exc:
            raise HostUnavailableError(
                f"asking systemd about {unit} in {self.name}: {exc}"
            ) from exc
        if state.load != "loaded":
            raise UnitMissingError(
                f"unit {unit} does not exist in {self.name} ({state.load or 'unknown'})"
            )
        if not state.cgroup:
            return []
        cgroup = self._unit_cgroup(pid, state.cgroup, unit)
        return await asyncio.to_thread(kernel.cgroup_members, cgroup, pid)

    async def port_owners(self, port: int) -> list[Proc]:
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is out of range")
        pid = await self._init_pid()
        return await asyncio.to_thread(kernel.port_owners, pid, port)

    @property
    def init_process(self) -> Proc | None:
        if not self._pid or self._boot_id is None:
            return None
        return Proc(self._pid, self._boot_id, 1)

    async def restart_service(self, unit: str, *, timeout: float = 30.0) -> ServiceRestart:
        if not _UNIT_RE.match(unit):
            raise UnitMissingError(f"{unit!r} is not a systemd unit name")
        deadline = time.monotonic() + timeout
        pid = await self._init_pid()
        with await self._bus(f"restarting {unit}", 10.0) as bus:
            state = await asyncio.to_thread(bus.unit_state, unit)
            if state.load != "loaded":
                raise UnitMissingError(
                    f"unit {unit} does not exist in {self.name} ({state.load or 'unknown'})"
                )
            if state.main_pid == 0:
                raise ServiceNotRunningError(
                    f"unit {unit} in {self.name} has no running process ({state.active})"
                )
            cgroup = self._unit_cgroup(pid, state.cgroup, unit)
            started = kernel.now_ticks()
            before = await asyncio.to_thread(kernel.cgroup_members, cgroup, pid)
            # reset-failed first: restarts the arena injects are not crashes, and must not
            # push the competitor's unit over its start rate limit (StartLimitBurst).
            try:
                await asyncio.to_thread(bus.reset_failed, unit)
                self.last_fault_at = time.monotonic()
                job = await asyncio.to_thread(bus.restart_unit, unit)
                nudged = time.monotonic()
                while await asyncio.to_thread(bus.job_running, job):
                    if time.monotonic() >= deadline:
                        raise ServiceRestartError(
                            f"the restart of {unit} in {self.name} did not finish "
                            f"within {timeout:g}s"
                        )
                    # systemd may wait in stop-sigterm for a cgroup-empty event that never
                    # comes on a v1 machine (`report_empty_cgroup`): tell it once it is empty.
                    if (
                        time.monotonic() - nudged >= CGROUP_NUDGE_S
                        and not any(kernel.alive(proc) for proc in before)
                        and not await asyncio.to_thread(kernel.cgroup_members, cgroup, pid)
                    ):
                        await self._report_empty(pid, state.cgroup)
                        nudged = time.monotonic()
                    await asyncio.sleep(0.02)
            except BusError as exc:
                raise ServiceRestartError(
                    f"systemd in {self.name} did not restart {unit}: {exc}"
                ) from exc
            # Whatever systemd (or the unit's KillMode) left of the old service dies now,
            # from outside: a restart leaves no old process behind.
            survivors = [proc for proc in before if kernel.alive(proc)]
            killed = await asyncio.to_thread(kernel.kill, survivors)
            old = set(before)
            while True:
                state = await asyncio.to_thread(bus.unit_state, unit)
                members = await asyncio.to_thread(kernel.cgroup_members, cgroup, pid)
                fresh = [p for p in members if p not in old and p.start >= started]
                main = next((proc for proc in fresh if proc.inner == state.main_pid), None)
                if main is not None:
                    restart = ServiceRestart(
                        unit=unit,
                        main_pid=main.inner,
                        before=tuple(before),
                        killed=tuple(killed),
                        started=started,
                    )
                    self.last_restart = restart
                    return restart
                if time.monotonic() >= deadline:
                    raise ServiceRestartError(
                        f"unit {unit} in {self.name} had no new main process {timeout:g}s "
                        f"after restart ({state.active}, MainPID {state.main_pid}; "
                        f"{len(fresh)} new process(es) in its cgroup)"
                    )
                await asyncio.sleep(0.05)

    async def reboot(self, *, hard: bool = False, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        old_boot = (self._pid, self._boot_id) if self._pid else None
        with contextlib.suppress(HostError):
            await self._init_pid()
            old_boot = (self._pid, self._boot_id)
        self._rebooting = True
        self._stopped_by_arena = True
        self.last_fault_at = time.monotonic()
        try:
            if hard:
                await self.podman.check("kill", "--signal", "KILL", self.name, timeout=timeout)
            else:
                # podman sends SIGRTMIN+3, systemd's "halt" request, and waits for it.
                await self.podman.check("stop", "--time", "20", self.name, timeout=timeout)
            await self._wait_stopped(deadline)
            await self._clear_shm()
            await self.podman.check("start", self.name, timeout=timeout)
            await self._init_pid()
        finally:
            self._rebooting = False
        if (self._pid, self._boot_id) == old_boot:
            raise HostBootError(f"{self.name} did not reboot: its init has the same start time")
        self._boots += 1
        await self.wait_ready(max(1.0, deadline - time.monotonic()))
        if self._frozen:  # a new boot mounts the disk read-write again
            await self.freeze_disk()

    async def wait_ready(self, timeout: float) -> str:
        # SystemState is asked over the host's private bus: no program in the host runs
        # for it and no `podman exec` (so a neighbour's exec storm does not slow it). One
        # connection serves every poll until it fails.
        deadline = time.monotonic() + timeout
        last = "not started"
        answered = False
        bus: SystemdBus | None = None
        pause = READY_POLL_FIRST_S
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                try:
                    if bus is None:
                        bus = await self._bus("readiness", max(0.5, min(remaining, 10.0)))
                    last = await asyncio.to_thread(bus.system_state)
                    answered = True
                    if last in _READY_STATES:
                        return last
                    if last == "maintenance":  # boot failed to emergency/rescue: no healing
                        raise BootFailedError(
                            f"{self.name} failed to boot: its systemd is in emergency or "
                            "rescue mode (maintenance)"
                        )
                    # "initializing", "starting": wait.
                except HostUnavailableError as exc:  # the bus is not up yet, or went away
                    last = str(exc)
                    answered = False
                    if bus is not None:
                        bus.close()
                        bus = None
                await asyncio.sleep(pause)
                pause = min(pause * 2, READY_POLL_MAX_S)
        finally:
            if bus is not None:
                bus.close()
        if answered:
            # Its systemd answers, still booting: units of the host's hold the boot.
            raise BootFailedError(
                f"{self.name} was still booting after {timeout:g}s (its systemd: "
                f"{printable_state(last)}): a unit of the host holds the boot"
            )
        raise HostBootError(f"{self.name} was not ready within {timeout:g}s (systemd: {last})")

    async def disk_use(self) -> DiskUse:
        upper = await self._upper_dir()
        # The upper directory is the arena's, outside the host's view: the host cannot
        # remove it. It is missing only while a power-cut disk is unmounted.
        cutting = self.disk is not None and self._rebooting
        if cutting or not await asyncio.to_thread(os.path.isdir, upper):
            raise HostUnavailableError(f"the disk of {self.name} is not mounted now")
        deadline = time.monotonic() + DISK_COUNT_S
        (used, inodes), partial = await self._du(upper, deadline)
        return DiskUse(bytes=used, inodes=inodes, partial=partial)

    async def _upper_dir(self) -> str:
        """The host's writable layer on this machine (it holds everything it wrote to
        disk): asked of podman once, the same for the container's whole life."""
        if self._upper is None:
            if self.disk is not None:
                self._upper = str(self.disk.upper)
            else:
                inspected = await self._inspect()
                upper = (inspected.get("GraphDriver", {}).get("Data") or {}).get("UpperDir")
                if not upper:
                    raise HostUnavailableError(f"{self.name} has no writable layer podman can show")
                self._upper = str(upper)
        return self._upper

    async def _du(self, upper: str, deadline: float) -> tuple[tuple[int, int], bool]:
        """The totals of `du -sx -B1` and `du -sx --inodes` under `upper` and whether
        either is partial (du said something vanished meanwhile but still gave a total).
        One program started for both (the controller counts every host every second: a
        start of this process costs more than the count). Raises `DiskMeasureError` past
        `deadline` or without both totals."""
        try:  # by a kept helper: starting a program here costs more than the count
            counted = await diskcount.count(upper, max(0.1, deadline - time.monotonic()))
        except OSError as exc:
            raise DiskMeasureError(f"cannot measure the disk of {self.name}: {exc}") from exc
        if counted.code is None:
            raise DiskMeasureError(f"counting the disk of {self.name} took over {DISK_COUNT_S:g}s")
        totals = [line.split()[0] for line in counted.out.splitlines() if line]
        if len(totals) != 2 or not all(total.isdigit() for total in totals):
            raise DiskMeasureError(
                f"cannot measure the disk of {self.name}: {_last_line(counted.err.encode())}"
            )
        return (int(totals[0]), int(totals[1])), counted.code != 0

    async def freeze_disk(self) -> None:
        pid = await self._init_pid()
        self._frozen = True
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
                error = await asyncio.to_thread(remount_root_read_only, pid)
            finally:
                for stopped_pid in stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(stopped_pid, signal.SIGCONT)
            # Confirmed from the kernel's own mount table, not from mount(2)'s word.
            if error is None and await asyncio.to_thread(kernel.root_mount_read_only, pid):
                return
            last = error or "the root mount is still read-write"
            await asyncio.sleep(0.05)
        raise HostUnavailableError(f"cannot make the disk of {self.name} read-only: {last}")

    async def crash_service(self, unit: str, *, timeout: float = 10.0) -> int:
        name = crash.unit_name(unit)
        pid = await self._init_pid()
        init = self.init_process
        assert init is not None
        with await self._bus(f"crashing {name}", 10.0) as bus:
            state = await asyncio.to_thread(bus.unit_state, name)
            if state.load != "loaded":
                raise UnitMissingError(
                    f"unit {name} does not exist in {self.name} ({state.load or 'unknown'})"
                )
            if not state.cgroup:
                raise ServiceNotRunningError(f"unit {name} in {self.name} has no running process")
            # The unit's cgroup is systemd's own answer (below the host's cgroup), never a
            # directory found by its name: a competitor can make one anywhere in its tree.
            cgroup = self._unit_cgroup(pid, state.cgroup, name)
            # As for restart_service: the arena's crashes must not push the unit over its
            # start rate limit (the referee may crash it once a second). It also sets
            # NRestarts back to 0, so the count to compare with is read after it.
            await asyncio.to_thread(bus.reset_failed, name)
            state = await asyncio.to_thread(bus.unit_state, name)
            freezer = await asyncio.to_thread(crash.host_freezer, pid)
            self.last_fault_at = time.monotonic()
            victims, killed = await asyncio.to_thread(crash.kill_unit, cgroup, pid, freezer)
            if not victims:
                raise ServiceNotRunningError(f"unit {name} in {self.name} has no running process")
            killed_at = time.monotonic()
            while not await asyncio.to_thread(crash.gone, victims):
                if time.monotonic() - killed_at > 10.0:
                    raise HostUnavailableError(
                        f"the processes of {name} in {self.name} survived SIGKILL"
                    )
                await asyncio.sleep(0.005)
            nudged = killed_at
            while True:
                crash.require_alive(init)
                found = await asyncio.to_thread(
                    crash.new_main_process, cgroup, pid, victims, killed
                )
                if found is not None:
                    # A process an agent started by hand (`systemctl start`) is not the
                    # unit restarting itself: systemd counts only its own restarts.
                    after = await asyncio.to_thread(bus.unit_state, name)
                    if after.restarts > state.restarts:
                        self.last_crash_restart_ms = int((time.monotonic() - killed_at) * 1000)
                        return found.inner
                now = time.monotonic()
                if now - killed_at >= timeout:
                    raise ServiceNotRestartedError(
                        f"unit {name} in {self.name} was not restarted by systemd (its own "
                        f"Restart=) within {timeout:g}s of being killed"
                    )
                if now - nudged >= CGROUP_NUDGE_S and not await asyncio.to_thread(
                    kernel.cgroup_members, cgroup, pid
                ):
                    await self._report_empty(pid, state.cgroup)
                    nudged = time.monotonic()
                await asyncio.sleep(0.01)

    async def _report_empty(self, init_pid: int, cgroup: str) -> None:
        """Tell the host's systemd that `cgroup` (its name for it) may have emptied; see
        `systemd_bus.report_empty_cgroup` for why. A failure changes nothing."""
        try:
            await asyncio.to_thread(report_empty_cgroup, init_pid, cgroup, timeout=5.0)
        except (BusError, OSError) as exc:
            log.debug("could not nudge systemd in %s about %s: %s", self.name, cgroup, exc)

    async def power_cut(self, *, timeout: float = 60.0) -> None:
        disk = self.disk
        if disk is None or not disk.power:
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
            self.last_fault_at = time.monotonic()
            self._stopped_by_arena = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            try:
                await powerdisk.control(disk, "cut")
                await self._wait_stopped(deadline)
                await self._clear_shm()
                await powerdisk.power_cycle(disk)
                if disk.removed:
                    raise HostNotFoundError(f"host {self.name} was removed during the power cut")
                await self.podman.check(
                    "start", self.name, timeout=max(1.0, deadline - time.monotonic())
                )
            except BaseException:
                # The arena stopped this host: bring it back before reporting the failure,
                # or a later probe would take it for a host that stopped by itself.
                if not disk.removed:
                    await asyncio.shield(self._restore_power(disk))
                raise
            self._pid = 0
            await self._init_pid()
        finally:
            self._rebooting = False
        if (self._pid, self._boot_id) == old_boot:
            raise HostBootError(f"{self.name} did not boot after the power cut")

    async def _wait_stopped(self, deadline: float) -> None:
        while (await self._inspect())["State"].get("Running"):
            if time.monotonic() > deadline:
                raise HostBootError(f"{self.name} did not stop")
            await asyncio.sleep(0.01)

    async def _clear_shm(self) -> None:
        """Empty the host's /dev/shm while it is stopped. Podman keeps a container's shm
        mount across stop and start, so without this a "RAM disk" outlived every reboot
        and power cut (a memory-only service passed the reboot milestones). Done from the
        arena's side without following anything the host left (it runs nothing then)."""
        static = str((await self._inspect()).get("StaticDir") or "")
        shm = Path(static) / "shm"
        if static and shm.is_dir() and not shm.is_symlink():
            await asyncio.to_thread(kernel.empty_directory, str(shm))

    async def lose_directory(self, path: str, *, timeout: float = 60.0) -> int:
        diskloss.check_path(path)
        deadline = time.monotonic() + timeout
        pid = await self._init_pid()
        old_boot = (self._pid, self._boot_id)
        self._rebooting = True
        self._stopped_by_arena = True
        try:
            self.last_fault_at = time.monotonic()
            try:
                loss = await asyncio.to_thread(diskloss.lose, pid, path)
            except PathMissingError:
                self._stopped_by_arena = False  # nothing was done: the host runs as it did
                raise
            except BaseException:
                # Killed, partly emptied: the host must boot again whatever failed.
                await asyncio.shield(self._start_again(deadline))
                raise
            await self._wait_stopped(deadline)
            await self._clear_shm()
            await self.podman.check(
                "start", self.name, timeout=max(1.0, deadline - time.monotonic())
            )
            self._pid = 0
            await self._init_pid()
        finally:
            self._rebooting = False
        if (self._pid, self._boot_id) == old_boot:
            raise HostBootError(f"{self.name} did not boot after the disk loss")
        self._boots += 1
        await self.wait_ready(max(1.0, deadline - time.monotonic()))
        if self._frozen:
            await self.freeze_disk()
        return loss.removed

    async def _start_again(self, deadline: float) -> None:
        """Best effort: start a host the arena stopped (whatever a fault left)."""
        try:
            bound = max(1.0, min(RESTORE_TIMEOUT_S, deadline - time.monotonic()))
            async with asyncio.timeout(bound):
                await self._wait_stopped(deadline)
                await self.podman.check("start", self.name, timeout=RESTORE_TIMEOUT_S)
        except Exception as exc:  # logged; the original failure is the one raised
            log.warning("could not start %s again after a failed fault: %s", self.name, exc)

    async def boot_again(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        if not (await self._inspect())["State"].get("Running"):
            if self.disk is not None and self.disk.power:
                async with powerdisk.locked(self.disk):
                    await self._restore_power(self.disk)
            else:
                await self.podman.check("start", self.name, timeout=timeout)
            self._pid = 0
        return await self.wait_ready(max(1.0, deadline - time.monotonic()))

    async def _restore_power(self, disk: powerdisk.PowerDisk) -> None:
        """Best effort after a power cut that failed midway: power on, mount, start the
        host (bounded); whatever fails is logged and the host stays `_stopped_by_arena`."""
        try:
            async with asyncio.timeout(RESTORE_TIMEOUT_S):
                if (await self._inspect())["State"].get("Running"):
                    return
                with contextlib.suppress(HostUnavailableError):
                    await powerdisk.detach(disk)
                await powerdisk.control(disk, "on")
                await powerdisk.attach(disk)
                await self.podman.check("start", self.name, timeout=RESTORE_TIMEOUT_S)
        except Exception as exc:  # logged; the original failure is the one raised
            log.warning("could not bring %s back after a failed power cut: %s", self.name, exc)

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


def printable_state(text: str) -> str:
    """A state string a host's systemd sent, cut short and without control characters
    (it reaches logs and terminals)."""
    return "".join(c if c.isprintable() else "?" for c in text[:40])


def _require_absolute(path: str) -> None:
    if not path.startswith("/"):
        raise HostFileError(f"{path!r} is not an absolute path")


class PodmanDriver(HostDriver):
    """Hosts as podman containers. See `HostDriver`."""

    name = "podman"
    faults = frozenset({"restart", "reboot", FAULT_SERVICE_CRASH, FAULT_POWER_CUT, FAULT_DISK_LOSS})

    def __init__(self, podman: Podman | None = None) -> None:
        self.podman = podman or Podman()

    def _host(self, name: str, labels: dict[str, str]) -> PodmanHost:
        disk = powerdisk.PowerDisk.of(name) if labels.get(LABEL_DISK) in DISK_KINDS else None
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

    async def _reserve_ids(self, spec: HostSpec, name: str) -> IdRange:
        """A uid and gid range of the host's own, from podman's `--userns=auto` allocator.

        Podman cannot map a `--rootfs` container itself, and it records the ranges it
        hands out only for containers of its storage. So a power-cut host's range is
        held by a container that is created and never started (`ids_name`): podman
        gives it a range no other host has, and gives that range to nobody else while
        it exists. The host runs with exactly that range (`--uidmap`/`--gidmap`); the
        reservation is removed after the host and its disk (`remove`)."""
        reservation = ids_name(name)
        argv = [
            "create", "--name", reservation, "--label", f"{LABEL_IDS_OF}={name}",
            "--label", f"{LABEL_IDS_MATCH}={spec.match_id}", "--network", "none",
            *self.podman.userns_flags, spec.image, "/bin/true",
        ]  # fmt: skip
        result = await self.podman.run(*argv)
        if result.returncode != 0 and b"already in use" in result.stderr:
            # A leftover of a host podman no longer has (the host itself was checked).
            await self._drop_ids(name)
            result = await self.podman.run(*argv)
        if result.returncode != 0:
            raise HostBootError(f"cannot reserve ids for {name}: {_last_line(result.stderr)}")
        out = await self.podman.check(
            "inspect", "--type", "container", "--format", "{{json .HostConfig.IDMappings}}",
            reservation,
        )  # fmt: skip
        mappings = json.loads(out)
        uid, size = _single_range(mappings.get("UidMap"), "uid")
        gid, gid_size = _single_range(mappings.get("GidMap"), "gid")
        if gid_size != size:
            raise HostBootError(f"podman reserved {size} uids but {gid_size} gids for {name}")
        return IdRange(uid, gid, size)

    async def _drop_ids(self, name: str) -> None:
        """Remove the id reservation of host `name` (nothing when it has none)."""
        result = await self.podman.run("rm", "--force", "--time", "0", ids_name(name))
        if result.returncode != 0:
            raise HostUnavailableError(
                f"cannot remove the id reservation of {name}: {_last_line(result.stderr)}"
            )

    async def _make_disk(self, spec: HostSpec, name: str) -> tuple[powerdisk.PowerDisk, IdRange]:
        disk = powerdisk.PowerDisk.of(name)
        await powerdisk.destroy(disk)  # a leftover of a host podman no longer has
        # The reservation (two podman calls) runs while the disk is made and served.
        reserved = asyncio.create_task(self._reserve_ids(spec, name))
        try:
            layers = await self._image_layers(spec.image)
            await powerdisk.create(
                disk, size_mb=spec.disk_mb, lowerdirs=layers, match_id=spec.match_id,
                ids=reserved, power=spec.power_cut, inodes=spec.disk_inodes,
            )  # fmt: skip
        except BaseException:
            reserved.cancel()
            with contextlib.suppress(BaseException):
                await reserved
            raise
        return disk, reserved.result()

    async def create(self, spec: HostSpec, *, boot_timeout: float = 60.0) -> Host:
        name = self.host_name(spec.match_id, spec.territory)
        if (await self.podman.run("image", "exists", spec.image)).returncode != 0:
            raise ImageMissingError(f"image {spec.image} is not there: run `opsarena image build`")
        if (await self.podman.run("container", "exists", name)).returncode == 0:
            raise HostError(
                f"host {name} exists already: remove it with `opsarena hosts rm {name}`"
            )
        caps = WriteCaps(spec.disk_write_mbps * 2**20, spec.disk_write_iops)
        try:
            cap_text = caps.annotation(powerdisk.PowerDisk.of(name).loop_file)
        except ValueError as exc:
            raise HostBootError(f"cannot cap the writes of {name}: {exc}") from None
        disk: powerdisk.PowerDisk | None = None
        confine = self.podman.confine_flags
        if spec.power_cut or self.podman.own_disks:
            # The host's root lies on a disk of its own, of a fixed size (hosts/disk.py).
            try:
                disk, ids = await self._make_disk(spec, name)
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._drop_ids(name))
                raise
            # podman 4.3 cannot map a `--rootfs` tree itself (`--userns=auto` fails with
            # "no uid mappings found"): the disk is already shifted into the range
            # reserved for the host, which it runs in (docs/SECURITY.md).
            confine = [*_without_userns(confine), *ids.podman_flags()]
        root = ["--rootfs", str(disk.root)] if disk else [spec.image]
        disk_labels = ["--label", f"{LABEL_DISK}={disk_kind(disk)}"] if disk else []
        if disk and caps.any and self.podman.io_controller is not None:
            disk_labels += ["--annotation", f"{IO_ANNOTATION}={cap_text}"]
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
            *self.podman.run_flags, *confine,
            "--mount", f"type=bind,src={self.podman.hostname_file(spec.territory)},"
            "dst=/etc/hostname,ro=true",
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
                with contextlib.suppress(Exception):
                    await self._drop_ids(name)
            raise
        return host

    async def cleanup(self, *, match_id: str | None = None) -> builtins.list[str]:
        """Remove the hosts podman knows, then sweep what outlived podman's knowledge:
        runtime containers and power-cut disks of hosts podman no longer has."""
        removed = await super().cleanup(match_id=match_id)
        return removed + await self.sweep_runtime(match_id=match_id)

    async def sweep_runtime(self, *, match_id: str | None = None) -> builtins.list[str]:
        """Kill and delete runc containers annotated as ours that podman has forgotten,
        and destroy power-cut disks and id reservations whose host podman no longer has;
        return what went."""
        known = set(
            (await self.podman.check("ps", "--all", "--no-trunc", "--format", "{{.ID}}")).split()
        )
        names = set((await self.podman.check("ps", "--all", "--format", "{{.Names}}")).split())
        swept: list[str] = []
        runc = shutil.which("runc")
        if runc is not None:
            for row in await runc_containers(runc, RUNC_ROOT, timeout=PODMAN_TIMEOUT):
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
        reservations = await self.podman.check(
            "ps", "--all", "--filter", f"label={LABEL_IDS_OF}", "--format", "json"
        )
        for row in json.loads(reservations or "[]"):
            labels = row.get("Labels") or {}
            host = labels.get(LABEL_IDS_OF, "")
            if host in names or match_id not in (None, labels.get(LABEL_IDS_MATCH)):
                continue
            await self._drop_ids(host)
            swept.append(f"ids:{host}")
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
        # Last: podman may give the range to another host once this is gone.
        await self._drop_ids(name)

    async def _rm(self, name: str) -> None:
        for _attempt in range(REMOVE_ATTEMPTS):
            result = await self.podman.run("rm", "--force", "--time", "0", name, timeout=60.0)
            # A host in a user namespace of its own can leave its shm mount busy for a
            # moment after its processes died; podman then has removed all but that.
            if result.returncode == 0 or b"resource busy" not in result.stderr:
                break
            await asyncio.sleep(0.5)
        if result.returncode != 0:
            raise HostUnavailableError(f"cannot remove {name}: {_last_line(result.stderr)}")
