"""Facts about a host read from the arena's side of the kernel: its processes and their
start times, a cgroup's members, the owners of a listening socket, its root mount's
flags; and killing a process from outside by pidfd.

Everything here reads the arena's own `/proc` and cgroupfs, where pids are this
machine's numbers and nothing the host runs or prints is consulted. A competitor that
is root in its host can rename, re-exec or move its processes between its own
cgroups, but cannot make a process older than it is, hide one from the arena's
`/proc`, or hold a socket without an fd the arena can see.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import time
from dataclasses import dataclass, field
from stat import S_ISDIR as stat_is_dir

from opsarena.errors import HostFactsTooLargeError

CGROUP_ROOT = "/sys/fs/cgroup"
TCP_LISTEN = "0A"
"""The `st` column of /proc/net/tcp for a socket in LISTEN state."""


@dataclass(frozen=True, order=True)
class Proc:
    """One process: `pid` as this machine numbers it and its start time (clock ticks
    since boot). The pair names a process for good: a reused pid has another start."""

    pid: int
    start: int
    inner: int = field(default=0, compare=False)
    """The pid inside the host's own PID namespace (what the competitor sees)."""


def start_time(pid: int) -> int | None:
    """The start time of `pid` (field 22 of /proc/PID/stat), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19])


def now_ticks() -> int:
    """The current time in the unit of `Proc.start` (clock ticks since boot), so that a
    process started after this moment has a start time at or above it."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def alive(proc: Proc) -> bool:
    """Whether `proc` (this very process, not a reuse of its pid) still runs. A zombie
    counts as gone: it holds no socket and runs nothing."""
    try:  # one read for both (asked before every probe's connect)
        with open(f"/proc/{proc.pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[19]) == proc.start and fields[0] not in (b"Z", b"X")
    except (OSError, IndexError, ValueError):
        return False


def host_pids(init_pid: int, *, with_init: bool = True) -> list[int]:
    """Machine pids of the processes in the PID namespace of `init_pid` (init itself
    only `with_init`): the one walk of `/proc` every host fact starts from."""
    namespace = os.readlink(f"/proc/{init_pid}/ns/pid")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or (not with_init and int(entry) == init_pid):
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                found.append(int(entry))
    return found


def host_processes(init_pid: int) -> list[Proc]:
    """Every process in the PID namespace of `init_pid`, init included."""
    found = []
    for pid in host_pids(init_pid):
        start = start_time(pid)
        if start is not None:
            found.append(Proc(pid, start, host_pid(pid) or 0))
    return sorted(found)


def signal_host_processes(init_pid: int, signum: int) -> list[int]:
    """Send `signum` to every process of the host of `init_pid` but its init; return
    whom it reached (machine pids)."""
    reached = []
    for pid in host_pids(init_pid, with_init=False):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
            reached.append(pid)
    return reached


def host_pid(pid: int) -> int | None:
    """The pid of machine pid `pid` inside its own (innermost) PID namespace."""
    try:
        with open(f"/proc/{pid}/status", errors="surrogateescape") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except OSError:
        return None
    return None


def machine_pid(init_pid: int, inner: int) -> int | None:
    """The machine pid of the process numbered `inner` in the host of `init_pid`."""
    for proc in host_processes(init_pid):
        if host_pid(proc.pid) == inner:
            return proc.pid
    return None


def systemd_cgroup(pid: int) -> str:
    """The path of `pid` in the named `systemd` hierarchy (v1) or the unified one (v2),
    as this machine sees it (e.g. `/libpod_parent/libpod-ID/init.scope`)."""
    unified = ""
    with open(f"/proc/{pid}/cgroup", errors="surrogateescape") as cgroup:
        for line in cgroup:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "name=systemd":
                return path
            if number == "0":
                unified = path
    return unified


def cgroup_dir(relative: str) -> str:
    """The directory of cgroup `relative` in the arena's cgroupfs (the named systemd
    hierarchy on v1/hybrid machines, the unified one on v2)."""
    base = f"{CGROUP_ROOT}/systemd"
    if not os.path.exists(f"{base}/cgroup.procs"):
        base = CGROUP_ROOT if os.path.exists(f"{CGROUP_ROOT}/cgroup.procs") else base
    return base + relative


def container_cgroup(init_pid: int) -> str:
    """The cgroup the host's whole tree lives in: its init's cgroup without the
    `init.scope` that systemd puts itself into."""
    path = systemd_cgroup(init_pid)
    return path.removesuffix("/init.scope") if path.endswith("/init.scope") else path


def cgroup_members(relative: str, namespace_of: int) -> list[Proc]:
    """Processes of the PID namespace of `namespace_of` in cgroup `relative` or any
    cgroup below it. Processes of other namespaces (another host that wrote itself into
    this cgroup) are not members; a cgroup that does not exist has none."""
    namespace = os.readlink(f"/proc/{namespace_of}/ns/pid")
    top = cgroup_dir(relative)
    pids: set[int] = set()
    for directory, _dirs, files in os.walk(top, followlinks=False):
        if "cgroup.procs" not in files:
            continue
        with contextlib.suppress(OSError), open(f"{directory}/cgroup.procs") as procs:
            pids.update(int(line) for line in procs if line.strip())
    members = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/ns/pid") != namespace:
                continue
            start = start_time(pid)
            if start is not None:
                members.append(Proc(pid, start, host_pid(pid) or 0))
    return sorted(members)


SCAN_LIMIT = 65536
"""Most socket-table rows, and most open files, the arena reads to find who holds a port.
A host can hold millions (1024 processes of 8192 files each): reading them all at every
check would spend the arena's CPU on one competitor's behalf. Past the limit the facts
are refused (`HostFactsTooLargeError`), the competitor's doing; a service needs a few."""


def listening_inodes(init_pid: int, port: int) -> set[int]:
    """Inodes of the TCP sockets listening on `port` (any address, IPv4 or IPv6) in the
    network namespace of `init_pid`. Raises `HostFactsTooLargeError` past `SCAN_LIMIT`
    rows."""
    inodes: set[int] = set()
    rows = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{init_pid}/net/{table}") as f:
            next(f, None)
            for line in f:
                rows += 1
                if rows > SCAN_LIMIT:
                    raise HostFactsTooLargeError(
                        f"the host has more than {SCAN_LIMIT} TCP sockets: the referee "
                        "does not read a socket table that large"
                    )
                fields = line.split()
                if len(fields) < 10 or fields[3] != TCP_LISTEN:
                    continue
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(int(fields[9]))
    return inodes


def socket_owners(processes: list[Proc], inodes: set[int]) -> list[Proc]:
    """The processes among `processes` holding an fd on one of the socket `inodes`.
    Raises `HostFactsTooLargeError` past `SCAN_LIMIT` open files in all."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    owners = []
    seen = 0
    for proc in processes:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{proc.pid}/fd"):
                seen += 1
                if seen > SCAN_LIMIT:
                    raise HostFactsTooLargeError(
                        f"the host's processes hold more than {SCAN_LIMIT} open files: the "
                        "referee does not read that many to find who holds the port"
                    )
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{proc.pid}/fd/{fd}") in wanted:
                        owners.append(proc)
                        break
    return owners


def port_owners(init_pid: int, port: int) -> list[Proc]:
    """The host's processes holding a socket that listens on `port`; empty when nothing
    listens."""
    inodes = listening_inodes(init_pid, port)
    if not inodes:
        return []
    owners = socket_owners(host_processes(init_pid), inodes)
    return [proc for proc in owners if alive(proc)]


def parent_pid(pid: int) -> int | None:
    """The machine pid of `pid`'s parent, None when `pid` is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def signal_process(proc: Proc, signum: int = signal.SIGKILL) -> bool:
    """Send `signum` to `proc` through a pidfd (never to a reuse of its pid), without
    waiting; True when it was alive and got it."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return False
    try:
        if start_time(proc.pid) != proc.start:
            return False
        try:
            signal.pidfd_send_signal(pidfd, signum)
        except ProcessLookupError:
            return False
        return True
    finally:
        os.close(pidfd)


def kill(procs: list[Proc], *, wait: float = 2.0) -> list[Proc]:
    """SIGKILL each of `procs` through a pidfd (so a reused pid is never hit) and wait up
    to `wait` seconds for each to exit; return those that were alive and got the signal."""
    killed = []
    for proc in procs:
        try:
            pidfd = os.pidfd_open(proc.pid)
        except ProcessLookupError:
            continue
        try:
            if start_time(proc.pid) != proc.start:  # the pid now names another process
                continue
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed.append(proc)
            # A pidfd polls readable once its process has exited.
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            poller.poll(int(wait * 1000))
        finally:
            os.close(pidfd)
    return killed


EXEC_MARK = "OPSARENA_EXEC_ID"
"""The environment variable an exec's first process carries (`end_exec` finds it by it)."""
END_EXEC_ROUNDS = 20
"""`end_exec` looks again this many times for processes of the exec (forks meanwhile)."""


def _marked(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return needle in b"\0" + environ.read(1024 * 1024)  # podman's: a few KiB
    except OSError:
        return False


def _stat_field(pid: int, index: int) -> int | None:
    """Field `index` after the command name of /proc/PID/stat (0: the state)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[index])
    except (OSError, IndexError, ValueError):
        return None


def _fd_targets(pid: int, limit: int = SCAN_LIMIT) -> dict[str, str]:
    """What each of `pid`'s fds points at (`pipe:[N]`, a path, ...), by fd number; at
    most `limit` of them."""
    found = {}
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd")[:limit]:
            with contextlib.suppress(OSError):
                found[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
    return found


def end_exec(init_pid: int, marker: str) -> int:
    """SIGKILL what one exec runs in the host of `init_pid`: the exec's first process
    (the one whose environment has `EXEC_MARK`=`marker`, started from outside), its
    process group (what `timeout` itself kills) and every process of the host holding
    the pipes of its standard output or error (a child that left the group still writing
    there). Looks again until none is left (at most `END_EXEC_ROUNDS` times); returns
    how many processes got the signal. Nothing else in the host is touched."""
    needle = f"\0{EXEC_MARK}={marker}\0".encode()
    groups: set[int] = set()
    pipes: set[str] = set()
    killed = 0
    init_group = _stat_field(init_pid, 2)
    for _ in range(END_EXEC_ROUNDS):
        everything = host_processes(init_pid)
        inside = {proc.pid for proc in everything}
        processes = [proc for proc in everything if proc.pid != init_pid]
        for proc in processes:
            # The exec's first process is the child of podman's conmon, outside the host
            # (an orphan of the exec has the host's init or a subreaper for a parent).
            if parent_pid(proc.pid) not in inside and _marked(proc.pid, needle):
                group = _stat_field(proc.pid, 2)
                if group is not None and group != init_group:
                    groups.add(group)
                fds = _fd_targets(proc.pid)
                pipes.update(fds[fd] for fd in ("1", "2") if fds.get(fd, "").startswith("pipe:"))
        targets = []
        budget = SCAN_LIMIT  # open files read a round: a host cannot make this unbounded
        for proc in processes:
            if _stat_field(proc.pid, 2) in groups:
                targets.append(proc)
            elif pipes and budget > 0:
                fds = _fd_targets(proc.pid, budget)
                budget -= len(fds)
                if not pipes.isdisjoint(fds.values()):
                    targets.append(proc)
        targets = [proc for proc in targets if alive(proc)]
        if not targets:
            break
        killed += sum(signal_process(proc) for proc in targets)
        time.sleep(0.01)
    return killed


def empty_directory(path: str, *, dir_fd: int | None = None) -> int:
    """Delete everything below the directory `path` (relative to `dir_fd` when given),
    keeping the directory itself; return how many entries went. Nothing is followed: the
    directory is opened with O_NOFOLLOW, every entry is looked at with lstat semantics
    relative to its parent's descriptor (a symlink is removed, never followed), and no
    directory on another device (a mount point) is entered. Raises `OSError` when the
    directory cannot be opened or an entry cannot be removed (e.g. a mount point: EBUSY)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    top = os.open(path, flags, dir_fd=dir_fd)
    try:
        return _empty(top, os.fstat(top).st_dev)
    finally:
        os.close(top)


def mount_below(dir_fd: int) -> str | None:
    """The path (relative to `dir_fd`) of the first directory below it on another device
    (a mount point), or None; nothing is followed. Only directories count: `fwalk` lists
    a symlink to a directory among them, and on an overlay whose layers lie on different
    filesystems (a host's disk) a symlink shows its upper layer's device."""
    device = os.fstat(dir_fd).st_dev
    for top, dirs, _files, fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        for name in dirs:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat_is_dir(info.st_mode) and info.st_dev != device:
                return os.path.normpath(os.path.join(top, name))
    return None


def _empty(fd: int, device: int) -> int:
    removed = 0
    for name in os.listdir(fd):
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat_is_dir(info.st_mode):
            if info.st_dev != device:
                raise OSError(errno.EBUSY, "a mount point is in the way", name)
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            child = os.open(name, flags, dir_fd=fd)
            try:
                if os.fstat(child).st_ino != info.st_ino:  # swapped since the lstat
                    raise OSError(errno.EAGAIN, "the directory changed while emptied", name)
                removed += _empty(child, device)
            finally:
                os.close(child)
            os.rmdir(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)
        removed += 1
    return removed


def _root_mount(init_pid: int) -> list[str] | None:
    """The fields of the topmost mount at `/` in the mount namespace of `init_pid` (a
    line of /proc/PID/mountinfo), None when there is none."""
    found = None
    with open(f"/proc/{init_pid}/mountinfo", errors="surrogateescape") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            if fields[4] == "/":
                found = fields
    return found


def root_mount_read_only(init_pid: int) -> bool:
    """Whether the host's `/` is read-only as its processes see it: the topmost mount at
    `/` in its mount namespace has `ro` in its mount or superblock options."""
    fields = _root_mount(init_pid)
    if fields is None:
        return False
    separator = fields.index("-")
    mount_options = fields[5].split(",")
    super_options = fields[separator + 3].split(",") if len(fields) > separator + 3 else []
    return "ro" in mount_options or "ro" in super_options


def root_writers(init_pid: int) -> list[int]:
    """Processes of the host of `init_pid` (not init) holding a file on its root
    filesystem open for writing (machine pids)."""
    root = _root_mount(init_pid)
    root_mount = root[0] if root is not None else None
    writers = []
    for pid in host_pids(init_pid, with_init=False):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fdinfo"):
                info = fdinfo(pid, fd)
                flags = int(info.get("flags", "0"), 8)
                if flags & os.O_ACCMODE != os.O_RDONLY and info.get("mnt_id") == root_mount:
                    writers.append(pid)
                    break
    return writers


def fdinfo(pid: int, fd: str) -> dict[str, str]:
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


def writable_binds(init_pid: int) -> list[str]:
    """Mount points in the host that are read-write bind mounts of a file or directory of
    the machine's own disk (the same device as the machine's `/`), i.e. writes there
    land outside the host's measured layer."""
    machine_dev = os.stat("/").st_dev
    major, minor = os.major(machine_dev), os.minor(machine_dev)
    found = []
    with open(f"/proc/{init_pid}/mountinfo", errors="surrogateescape") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            if fields[2] != f"{major}:{minor}" or fields[4] == "/":
                continue
            if "rw" in fields[5].split(","):
                found.append(fields[4])
    return found
