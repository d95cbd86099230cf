"""The `Host` contract every driver implements, and the `HostDriver` that makes hosts.

A host behaves like a small machine: a real init (systemd), a disk that survives
reboots, and a network stack of its own with no route anywhere. It is hostile: root in
it is the competitor, who can replace any program there. So a driver never runs a
program of the host's with the arena's privileges, and whatever it reports as a
fact (processes, cgroups, sockets, mounts) it reads from outside the host. The arena talks to
it only through this interface. The conformance suite (`tests/hosts/`) tests every
sentence of these docstrings against each registered driver.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import contextlib
from dataclasses import dataclass, field

from opsarena.errors import FaultUnsupportedError, HostNotFoundError, ShellUnsupportedError
from opsarena.hosts.kernel import Proc, now_ticks

DEFAULT_OUTPUT_LIMIT = 1024 * 1024
"""Bytes kept per output stream of `Host.exec` unless the caller asks otherwise."""

DEFAULT_FILE_LIMIT = 100 * 1024 * 1024
"""Largest file `Host.read_file` and `Host.write_file` accept."""

TIMEOUT_EXIT_CODE = 124
"""`ExecResult.exit_code` of a command killed because it ran past its timeout."""

FAULT_SERVICE_CRASH = "crash"
"""`Host.crash_service`: every process of a unit killed at once; systemd must restart it."""

FAULT_POWER_CUT = "power-cut"
"""`Host.power_cut`: every process dies and every write not made durable may be lost."""

FAULT_DISK_LOSS = "disk-loss"
"""`Host.lose_directory`: every process dies and one directory's contents are gone."""

DEFAULT_DISK_MB = 1024
"""Size of a host's disk (the most it can hold, whatever the quota watch sees)."""

DEFAULT_WRITE_MBPS = 64
"""A host's write bandwidth cap on its disk, MiB/s (`HostSpec.disk_write_mbps`)."""

DEFAULT_WRITE_IOPS = 2000
"""A host's write request cap on its disk, a second (`HostSpec.disk_write_iops`)."""


@dataclass(frozen=True)
class ExecResult:
    """What one command run in a host did.

    `stdout` and `stderr` hold at most the caller's output limit each; `truncated` is
    true when either stream had more (the command was then ended: see `Host.exec`). A command
    killed at its timeout has `timed_out` true and `exit_code` 124.
    """

    exit_code: int
    stdout: bytes
    stderr: bytes
    truncated: bool
    duration_ms: int
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class DiskUse:
    """What a host has written to its own disk (its writable layer): `bytes` of
    allocated blocks and `inodes` (files, directories, links, whiteouts; a hard-linked
    file once). `partial` when entries vanished while they were counted: the figures are
    then a lower bound."""

    bytes: int
    inodes: int
    partial: bool = False


@dataclass(frozen=True)
class ServiceRestart:
    """What one `Host.restart_service` did, as the kernel shows it from outside.

    `before` is every process in the unit's cgroup just before the restart (this
    machine's pids with start times); none of them runs any more. `started` is the
    moment the restart began, in the unit of `Proc.start`: a process started before it
    is not a new process of the restarted unit, wherever it was. `killed` are those
    that were still alive when the host's systemd said the restart was done (a
    `KillMode=process` child, or a "systemd" that did not restart anything): the arena
    killed them from outside. `main_pid` is the new main process, as the host numbers
    it: a process in the unit's cgroup that did not exist before.
    """

    unit: str
    main_pid: int
    before: tuple[Proc, ...]
    killed: tuple[Proc, ...]
    started: int = 0

    def describe(self) -> str:
        """One line for the record: the new main PID and whatever the arena had to kill."""
        text = f"{self.unit} restarted; its new main PID is {self.main_pid}"
        if self.killed:
            pids = ", ".join(str(proc.inner or proc.pid) for proc in self.killed)
            text += (
                f"; {len(self.killed)} old process(es) of the unit survived the restart "
                f"and were killed by the arena (PID {pids})"
            )
        return text


@dataclass(frozen=True)
class HostSpec:
    """What a driver needs to create one host.

    `match_id` and `territory` name the host (drivers derive a unique name from both)
    and label it, so that `cleanup` can find everything a match left.
    """

    match_id: str
    territory: str
    image: str
    cpus: float = 1.0
    memory_mb: int = 512
    pids_limit: int = 1024
    power_cut: bool = False
    """Give the host a disk that can lose power (`Host.power_cut`); such a disk has
    exactly `disk_mb` MiB. Every other host's disk holds `disk_mb` MiB of data and
    `disk_inodes` inodes (drivers that can bound a disk: `hosts/disk.py`)."""
    disk_mb: int = DEFAULT_DISK_MB
    disk_inodes: int | None = None
    """Inodes of an ordinary host's disk; None: one per 8 KiB (`disk.default_inodes`)."""
    disk_write_mbps: int = DEFAULT_WRITE_MBPS
    """Cap on the host's writes to its disk, MiB a second (0: none)."""
    disk_write_iops: int = DEFAULT_WRITE_IOPS
    """Cap on the host's write requests to its disk, a second (0: none)."""


@dataclass(frozen=True)
class HostInfo:
    """A host as a driver lists it."""

    name: str
    match_id: str
    territory: str
    image: str
    state: str
    created: str = ""
    labels: dict[str, str] = field(default_factory=dict)


class Host(abc.ABC):
    """One competitor's machine.

    Every method has a time bound; none waits forever. Errors:
    - `HostUnavailableError`: the driver could not reach the host (the arena's fault);
    - `HostBootError`: boot or reboot did not reach readiness in time;
    - `UnitMissingError`, `ServiceNotRunningError`, `ServiceRestartError`: the state
      of the competitor's unit made `restart_service` impossible;
    - `HostFileError`: a file operation failed for a reason named in the message.
    Commands that fail inside the host are not errors: `exec` returns their exit code.
    """

    name: str
    territory: str
    match_id: str

    @property
    @abc.abstractmethod
    def boots(self) -> int:
        """How many boots of this host this object has seen: 1 after creation, plus one
        per confirmed reboot."""

    @abc.abstractmethod
    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout: float,
        input: bytes | None = None,
        user: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        """Run `cmd` in the host and return what it did.

        A string runs through `bash -c`; a list runs as is. `input` is fed to stdin
        (stdin is empty otherwise). `user` runs it as that user (default root).
        After `timeout` seconds the command and every process in its process group
        are killed inside the host (not merely abandoned) and the result has
        `timed_out` true. Each stream keeps at most `output_limit` bytes; a command
        whose output passes that is ended (its process group, and whatever in the
        host still holds its output pipes, are killed) and the result has `truncated`
        true: a flood costs the arena one limit's worth of reading. Raises
        `HostUnavailableError` when the host cannot run commands at all (stopped,
        rebooting, or the driver failed).
        """

    @abc.abstractmethod
    async def read_file(self, path: str, *, limit: int = DEFAULT_FILE_LIMIT) -> bytes:
        """Return the exact bytes of the file at absolute `path` in the host.

        Raises `HostFileError` if it is missing, not a regular file, or larger than
        `limit` bytes.
        """

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write `data` exactly to absolute `path` in the host, creating parent
        directories, replacing any file there. Raises `HostFileError` when the data is
        over `DEFAULT_FILE_LIMIT` or the host refused the write (disk full, a directory
        in the way)."""

    last_restart: ServiceRestart | None
    """What the latest `restart_service` of this object did (None before the first)."""

    last_fault_at: float | None = None
    """`time.monotonic()` taken just before the destructive step of the latest fault this
    object injected (the restart job of `restart_service`, the kill of `crash_service` and
    `power_cut`, the request of `reboot`); None before the first. A write the service
    acknowledged before this instant was acknowledged before the fault."""

    def clock_ticks(self) -> int:
        """Now, in the unit of `Proc.start`: a process started after this call has a
        start time at or above it."""
        return now_ticks()

    @abc.abstractmethod
    async def restart_service(self, unit: str, *, timeout: float = 30.0) -> ServiceRestart:
        """Restart systemd `unit` and return what the restart did (also `last_restart`).

        The restart is asked of the host's systemd without running any program of the
        host's; its effect is confirmed from outside: every process that was in the
        unit's cgroup before is gone afterwards (survivors are killed by the arena and
        listed in `killed`), and the returned `main_pid` is a process in the unit's
        cgroup that did not exist before. The restart does not count toward the unit's
        start rate limit (the arena's restarts are not crashes), so repeated checks
        never make a unit hit it. Raises `UnitMissingError` if the unit does not exist,
        `ServiceNotRunningError` if it has no main process to restart, and
        `ServiceRestartError` if no new main process appeared within `timeout` seconds.
        """

    @abc.abstractmethod
    async def unit_members(self, unit: str) -> list[Proc]:
        """Every process now in `unit`'s cgroup (and the cgroups below it), read from the
        arena's cgroupfs; only processes of this host count. Raises `UnitMissingError`
        if the unit does not exist."""

    @abc.abstractmethod
    async def port_owners(self, port: int) -> list[Proc]:
        """The host's processes holding a TCP socket that listens on `port` (any address,
        IPv4 or IPv6), read from outside (the host's socket table and its processes'
        fds); empty when nothing listens."""

    @property
    @abc.abstractmethod
    def init_process(self) -> Proc | None:
        """The host's init as of the latest boot the arena saw (None before it looked)."""

    @abc.abstractmethod
    async def reboot(self, *, hard: bool = False, timeout: float = 60.0) -> None:
        """Reboot the host and wait until it is ready again.

        Clean (default): systemd inside shuts down in order, then the host boots.
        Hard: every process is killed at once, then the host boots. Either way `/run`
        and `/tmp` come back empty, the disk is kept, and enabled units start again.
        The reboot is confirmed by the host's init having a new start time; `boots`
        grows by one. Raises `HostBootError` if the host is not ready within `timeout`
        seconds, `HostUnavailableError` if the driver could not reboot it.
        """

    async def boot_again(self, timeout: float) -> str:
        """Bring back a host that the arena itself left stopped (a reboot, power cut or
        disk loss whose controller was killed midway), then `wait_ready`; a host already
        running is only waited for. Only for a host the arena's log says it was
        rebooting: a host that stopped by itself stays stopped. Raises `HostBootError`."""
        return await self.wait_ready(timeout)

    @abc.abstractmethod
    async def wait_ready(self, timeout: float) -> str:
        """Wait until systemd in the host reports `running` or `degraded` and return
        that state. It is asked without running any program of the host's (and without
        `podman exec`). Raises `HostBootError` after `timeout` seconds."""

    @abc.abstractmethod
    async def disk_use(self, *, within: float | None = None) -> DiskUse:
        """Bytes and inodes the host has written to its own disk since it was created
        (its files under /run and /tmp are not disk: they count against its memory).
        Counted from outside the host, by the arena's own program, in at most a bounded
        time (`within` seconds when given, else the driver's own bound). Raises
        `DiskMeasureError` when the count fails or runs past that time (what the host
        wrote decides that), `HostUnavailableError` when the driver cannot look now (the
        host is being power-cut, or podman cannot show its layer)."""

    async def disk_usage(self) -> int:
        """Bytes the host has written to its own disk (`disk_use().bytes`). Raises as
        `disk_use`."""
        return (await self.disk_use()).bytes

    @abc.abstractmethod
    async def freeze_disk(self) -> None:
        """Make the host's disk read-only, at once and until the host is removed:
        `reboot` applies it again before it returns. Reading, running, /run and /tmp
        stay as they were. No program of the host's runs for it, and it returns only
        once the kernel's mount table shows the host's `/` read-only. The arena does
        this to a host over its disk quota, so a competitor that fills its disk fails
        alone instead of filling the machine.
        Raises `HostUnavailableError`."""

    async def crash_service(self, unit: str, *, timeout: float = 10.0) -> int:
        """Crash systemd `unit`: SIGKILL every process in its cgroup at once, from
        outside the host, and return the host's pid of the new main process systemd
        started by itself (the unit's own `Restart=`).

        The kill is confirmed from outside (none of the old processes, by pid and start
        time, is alive); the new process is one the host's init started in the unit's
        cgroup. A write the service held only in memory is gone; one in a file is not.
        Raises `UnitMissingError` for a name that is not a unit, `ServiceNotRunningError`
        when the unit has no process to kill, `ServiceNotRestartedError` when no new
        process appeared within `timeout` seconds of the kill (the competitor's fault),
        `FaultUnsupportedError` when the driver lacks the fault.
        """
        raise FaultUnsupportedError(f"host {self.name} cannot crash a service")

    async def power_cut(self, *, timeout: float = 60.0) -> None:
        """Cut the host's power: every process dies at once, every write to its disk
        not made durable (fsync/fdatasync/sync/O_SYNC of the file, and an fsync of the
        directory for a create or rename) may be lost, writes made durable before the
        cut never are; then the host boots and is ready, confirmed like `reboot` (new
        init start time; `boots` grows by one). Raises `FaultUnsupportedError` for a
        host created without `HostSpec.power_cut`, `HostBootError` when it is not ready
        within `timeout` seconds, `HostNotFoundError` when it was removed meanwhile
        (it then never boots again).
        """
        raise FaultUnsupportedError(
            f"host {self.name} has no power-cut disk (create it with HostSpec.power_cut)"
        )

    async def lose_directory(self, path: str, *, timeout: float = 60.0) -> int:
        """The disk holding directory `path` is lost and replaced by an empty one: every
        process of the host dies at once (nothing is written out on the way down),
        everything below `path` is deleted (the directory itself stays, empty; the rest of
        the disk is kept), then the host boots and is ready, confirmed like `reboot` (new
        init start time; `boots` grows by one). The deletion is made from outside the
        host with no process of it running, never following a symlink. Returns how many
        entries were deleted. Raises `PathMissingError` when `path` is not a plain
        directory in the host (missing, a symlink on the way, or holding a mount point;
        nothing happens then), `HostBootError` when it is not ready within `timeout`,
        `FaultUnsupportedError` when the driver lacks the fault.
        """
        raise FaultUnsupportedError(f"host {self.name} cannot lose a directory")

    def shell_argv(self, *, user: str | None = None, tty: bool = False) -> list[str]:
        """The command line of a program of this machine that opens an interactive login
        shell in the host as `user` (root when None, in root's home), reading the
        caller's stdin and writing its stdout, on a terminal of its own when `tty`. The
        caller runs it (`opsarena hosts shell` replaces itself with it). Raises
        `ShellUnsupportedError` when the driver cannot give one, `HostError` for a
        `user` that is not a user name."""
        raise ShellUnsupportedError(
            f"host {self.name} has no interactive shell: its driver cannot open one"
        )

    @abc.abstractmethod
    async def connect(
        self, port: int, *, timeout: float = 5.0
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Open a TCP connection to 127.0.0.1:`port` inside the host's own network.

        The connection is made by the arena's process; nothing runs in the host for
        it and no port is published, so what arrives is the competitor's server's own
        answer. Raises `ConnectionRefusedError` when nothing listens (at once),
        `TimeoutError` after `timeout` seconds, `HostUnavailableError` when the host
        is not running.
        """


class HostDriver(abc.ABC):
    """Makes, finds and removes hosts of one kind (podman containers, ...).

    Drivers register by name in `opsarena.hosts.registry`; callers never import one.
    `faults` names the faults (`opsarena.referee.nemesis`) its hosts support: a challenge
    needing another is refused at match start.
    """

    name: str
    faults: frozenset[str] = frozenset()
    """The faults (`FAULT_*` names) this driver's hosts support; a challenge that needs
    another one is refused before its match starts."""

    @abc.abstractmethod
    async def create(self, spec: HostSpec, *, boot_timeout: float = 60.0) -> Host:
        """Create and boot a host, returning it once `wait_ready` succeeded.

        Raises `ImageMissingError` when the image is absent, `HostBootError` when it
        did not boot (the half-made host is removed first), `HostError` when a host of
        that name exists already.
        """

    @abc.abstractmethod
    async def get(self, name: str) -> Host:
        """The existing host called `name` (as `HostInfo.name`). Raises
        `HostNotFoundError`."""

    @abc.abstractmethod
    async def list(self, *, match_id: str | None = None) -> list[HostInfo]:
        """Every host this driver made (of one match when `match_id` is given)."""

    @abc.abstractmethod
    async def remove(self, name: str) -> None:
        """Stop and delete host `name`, at once. Raises `HostNotFoundError`."""

    async def cleanup(self, *, match_id: str | None = None) -> builtins.list[str]:
        """Remove every host this driver made (of one match when given); return their
        names. Touches nothing the driver did not label as its own."""
        infos = await self.list(match_id=match_id)
        await asyncio.gather(*(self._remove_if_there(info.name) for info in infos))
        return [info.name for info in infos]

    async def _remove_if_there(self, name: str) -> None:
        # Another cleanup may have removed it between list and remove: that is fine.
        with contextlib.suppress(HostNotFoundError):
            await self.remove(name)

    async def prepare_image(self, image: str, packages: tuple[str, ...]) -> None:
        """Make `image`, the default image with `packages` added (`image.image_for`),
        ready for `create`: a driver that builds its images builds it once per recipe;
        one whose images come from elsewhere does nothing (the default)."""
        return None

    def host_name(self, match_id: str, territory: str) -> str:
        """The name a host of `territory` in `match_id` gets."""
        return f"opsarena-{match_id}-{territory}"
