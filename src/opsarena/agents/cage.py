"""A competitor program's confinement: its cgroup (limits, kill) and sandbox (namespaces, view).

A command agent's program is hostile. It runs:

- in a cgroup of its own per controller (`pids`, `memory`, `cpu`; cgroup v1, v2 or the
  hybrid of both, detected from /proc/self/mountinfo), with limits (`CageLimits`). It is
  moved in by a root shell before the program's first instruction, and it cannot leave:
  it is not root, holds no capability, and cannot even see a cgroup filesystem. Killing
  what is in the cgroup ends everything the program started, `setsid` or not;
- as an unprivileged user of its own (a random uid above `AGENT_UID_BASE`, never root),
  in new user, mount, pid, ipc, uts and cgroup namespaces and, unless the competitor
  opted in, a new network namespace with nothing but loopback, under a seccomp filter
  (`seccomp_program`). The namespaces are made by bubblewrap (`bwrap`, Debian's
  `bubblewrap`), entered through `setpriv`, both the arena's own binaries from /usr;
- in a private view of the filesystem: /usr (without /usr/local), a few named files of
  /etc, a fresh /proc of its own pid namespace, a minimal /dev, empty /tmp and home
  (tmpfs, charged to its memory limit), its program file and the paths the competitor
  listed, read-only, and `/opsarena` (brief, `exec`/`put` wrappers, its gate socket).
  No event log, no checkout, no other agent's gate, no runtime socket, no /sys.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opsarena.errors import AgentConfigError

KILL_ROUNDS = 50
CONTROLLERS = ("pids", "memory", "cpu")
"""The controllers a cage limits with; `pids` also lists its processes for the kill."""

AGENT_UID_BASE = 1_900_000_000
"""Agent programs run as `AGENT_UID_BASE + n`, n < `AGENT_UID_SPAN`, chosen at random per
agent: no account of the machine, below 2**31 (bubblewrap's uid map refuses more)."""
AGENT_UID_SPAN = 1 << 24

SANDBOX_ROOT = "/opsarena"
"""Where a program finds its brief, its `exec`/`put` wrappers and its gate."""
SANDBOX_HOME = "/home/agent"
SANDBOX_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
SCRATCH_BYTES = 256 * 1024 * 1024
"""Size of each of the program's tmpfs (`/tmp`, its home); their pages also count
against its memory limit."""

ETC_FILES = (
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/mime.types",
)
"""The only parts of the machine's /etc a program sees (read-only): what the dynamic
linker, name resolution and TLS need; nothing of the arena's."""
TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


BLOCKED_SYSCALLS_X86_64 = {
    "ptrace": 101,
    "syslog": 103,
    "pivot_root": 155,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
}
"""System calls a competitor's program gets EPERM for: kernel surface no build job needs
(keyrings, BPF, perf, io_uring, module and mount interfaces, namespaces, other
processes' memory). Everything else is allowed."""
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The program's seccomp filter as classic BPF (what `bwrap --seccomp` reads), or
    None on an architecture it has no table for (the sandbox then has none).

    Another architecture's calls (x32, i386 through int 0x80) are refused outright, so
    the table cannot be sidestepped."""
    if (machine or os.uname().machine) != "x86_64":
        return None
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, kill, eperm = 0x7FFF0000, 0x80000000, 0x00050000 | 1
    blocked = sorted(BLOCKED_SYSCALLS_X86_64.values())
    ops: list[tuple[int, int, int, int]] = [
        (ld_w_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq_k, 1, 0, _AUDIT_ARCH_X86_64),
        (ret_k, 0, 0, kill),
        (ld_w_abs, 0, 0, 0),  # seccomp_data.nr
        (jge_k, len(blocked) + 1, 0, _X32_SYSCALL_BIT),
    ]
    for index, number in enumerate(blocked):
        ops.append((jeq_k, len(blocked) - index, 0, number))
    ops += [(ret_k, 0, 0, allow), (ret_k, 0, 0, eperm)]
    return b"".join(struct.pack("=HBBI", *op) for op in ops)


@dataclass(frozen=True)
class CageLimits:
    """What one agent program (with everything it starts) may use at once."""

    pids: int = 256
    memory_bytes: int = 512 * 1024 * 1024
    cpus: float = 1.0


DEFAULT_LIMITS = CageLimits()


@dataclass(frozen=True)
class Hierarchy:
    """A mounted cgroup hierarchy: v1 (one or more controllers) or v2 (`version` 2)."""

    mount: Path
    version: int
    controllers: frozenset[str]
    own: str
    """This process's cgroup in it, relative to `mount` ("/" at the top)."""

    def bases(self) -> list[Path]:
        """Where cages are made in this hierarchy: beside this process (v1, so limits the
        arena itself runs under still apply) and at the top (where an older arena or
        another process's controller may have made them)."""
        top = self.mount / "opsarena"
        if self.version == 1 and self.own not in ("", "/"):
            return [self.mount / self.own.lstrip("/") / "opsarena", top]
        return [top]


def parse_mountinfo(text: str) -> list[tuple[Path, int, frozenset[str]]]:
    """The cgroup mounts in a /proc/PID/mountinfo `text`: (mount point, version, controllers)."""
    found: list[tuple[Path, int, frozenset[str]]] = []
    for line in text.splitlines():
        left, _sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            found.append((mount, 2, frozenset()))
        elif tail[0] == "cgroup":
            options = set(tail[2].split(","))
            found.append((mount, 1, frozenset(options & set(CONTROLLERS))))
    return found


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """A /proc/PID/cgroup `text` as {controller or "" for v2: path}."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for name in parts[1].split(",") if parts[1] else [""]:
            paths[name] = parts[2]
    return paths


def hierarchies() -> list[Hierarchy]:
    """The hierarchies a cage uses, the one listing its processes first: a v1 hierarchy
    per controller in `CONTROLLERS` that has one, else the v2 hierarchy for it."""
    try:
        mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
        own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    except OSError:
        return []
    chosen: list[Hierarchy] = []
    v2 = next(((m, c) for m, v, c in mounts if v == 2), None)
    v2_controllers: frozenset[str] = frozenset()
    if v2 is not None:
        with contextlib.suppress(OSError):
            v2_controllers = frozenset((v2[0] / "cgroup.controllers").read_text().split())
    need_v2: set[str] = set()
    for controller in CONTROLLERS:
        v1 = next((m for m, v, c in mounts if v == 1 and controller in c), None)
        if v1 is not None:
            if all(h.mount != v1 for h in chosen):
                chosen.append(Hierarchy(v1, 1, frozenset({controller}), own.get(controller, "/")))
        elif controller in v2_controllers:
            need_v2.add(controller)
    if v2 is not None and (need_v2 or not chosen):
        # The v2 tree also lists processes when no v1 pids hierarchy does.
        at = 0 if "pids" in need_v2 or not chosen else len(chosen)
        chosen.insert(at, Hierarchy(v2[0], 2, frozenset(need_v2), own.get("", "/")))
    return chosen


def limit_files(
    version: int, controllers: Iterable[str], limits: CageLimits
) -> list[tuple[str, str]]:
    """(file, value) pairs that set `limits` in a cgroup of `version`, in the order to write
    them (v1's memory+swap limit cannot be set below the memory limit)."""
    period = 100_000
    quota = max(1000, int(limits.cpus * period))
    writes: list[tuple[str, str]] = []
    controllers = set(controllers)
    if "pids" in controllers:
        writes.append(("pids.max", str(limits.pids)))
    if "memory" in controllers:
        if version == 1:
            writes.append(("memory.limit_in_bytes", str(limits.memory_bytes)))
            writes.append(("memory.memsw.limit_in_bytes", str(limits.memory_bytes)))
        else:
            writes.append(("memory.max", str(limits.memory_bytes)))
            writes.append(("memory.swap.max", "0"))
    if "cpu" in controllers:
        if version == 1:
            writes.append(("cpu.cfs_period_us", str(period)))
            writes.append(("cpu.cfs_quota_us", str(quota)))
        else:
            writes.append(("cpu.max", f"{quota} {period}"))
    return writes


class ProcessCage:
    """The cgroups (one per hierarchy) holding an agent program and all its descendants.
    `paths[0]` lists the processes."""

    def __init__(self, name: str, paths: Sequence[Path]) -> None:
        self.name = name
        self.paths = list(paths)

    @property
    def path(self) -> Path:
        return self.paths[0]

    @classmethod
    def create(
        cls, match_id: str, territory: str, limits: CageLimits = DEFAULT_LIMITS
    ) -> ProcessCage:
        """A new, empty cage for `territory`'s agent in `match_id`, with `limits` set.
        Raises `AgentConfigError` when this machine does not let the arena make one (not
        root, read-only cgroupfs, a controller missing): a program is never run uncaged."""
        found = hierarchies()
        have = set().union(*(h.controllers for h in found)) if found else set()
        missing = [c for c in CONTROLLERS if c not in have]
        if missing:
            raise AgentConfigError(
                f"cannot confine a command agent here: no cgroup controller {', '.join(missing)}"
            )
        name = f"{match_id}.{territory}.{secrets.token_hex(3)}"
        made: list[Path] = []
        try:
            for hierarchy in found:
                made.append(_make(hierarchy, name, limits))
        except OSError as exc:
            cls(name, made).remove()
            raise AgentConfigError(
                f"cannot confine a command agent here: cgroup setup failed: {exc}"
            ) from None
        return cls(name, made)

    @classmethod
    def of_match(cls, match_id: str) -> list[ProcessCage]:
        """Every cage left for `match_id`'s agents: those of a controller that died
        (SIGKILL, a crash) without removing them. Empty when there are none."""
        by_name: dict[str, list[Path]] = {}
        for hierarchy in hierarchies():
            for base in _cage_bases(hierarchy):
                for path in sorted(base.glob(f"{match_id}.*")):
                    if path.is_dir():
                        by_name.setdefault(path.name, []).append(path)
        return [cls(name, paths) for name, paths in sorted(by_name.items())]

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` started inside the cage: a shell (the arena's own /bin/sh) moves itself
        into every cgroup of the cage, then execs `argv`, so not even the program's first
        instruction runs outside."""
        moves = " && ".join(f"echo $$ > {shlex.quote(str(p / 'cgroup.procs'))}" for p in self.paths)
        return ["/bin/sh", "-c", f'{moves} && exec "$@"', "cage", *argv]

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError, ValueError):
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        return []

    def signal_all(self, sig: int) -> int:
        """Send `sig` to every process in the cage; return how many got it."""
        sent = 0
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                sent += 1
        return sent

    def wait_empty(self, timeout: float) -> bool:
        """Block until the cage is empty or `timeout` seconds pass; True when empty."""
        end = time.monotonic() + timeout
        while self.pids():
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)
        return True

    def kill_all(self) -> int:
        """SIGKILL everything in the cage until it is empty (or a bounded number of
        rounds); return how many processes were killed."""
        killed = 0
        for _round in range(KILL_ROUNDS):
            if not self.pids():
                break
            killed += self.signal_all(signal.SIGKILL)
            time.sleep(0.02)
        return killed

    def remove(self) -> None:
        """Kill what is left and delete the cgroups."""
        self.kill_all()
        for path in self.paths:
            for _attempt in range(KILL_ROUNDS):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # the last processes are still exiting
                    time.sleep(0.02)


def _cage_bases(hierarchy: Hierarchy, depth: int = 4) -> list[Path]:
    """Every `opsarena` directory of `hierarchy` at most `depth` levels down: where this
    process makes cages, and where a controller that ran in another cgroup made its own."""
    found = [base for base in hierarchy.bases() if base.is_dir()]
    level = [hierarchy.mount]
    for _ in range(depth):
        below: list[Path] = []
        for directory in level:
            with contextlib.suppress(OSError):
                below += [d for d in directory.iterdir() if d.is_dir() and d.name != "opsarena"]
            candidate = directory / "opsarena"
            if candidate.is_dir() and candidate not in found:
                found.append(candidate)
        level = below
    return found


def _make(hierarchy: Hierarchy, name: str, limits: CageLimits) -> Path:
    base = hierarchy.bases()[0]
    if hierarchy.version == 2 and hierarchy.controllers:
        base.mkdir(exist_ok=True)
        wanted = " ".join(f"+{c}" for c in sorted(hierarchy.controllers))
        for parent in (hierarchy.mount, base):
            (parent / "cgroup.subtree_control").write_text(wanted)
    else:
        base.mkdir(parents=True, exist_ok=True)
    path = base / name
    path.mkdir()
    for file, value in limit_files(hierarchy.version, hierarchy.controllers, limits):
        target = path / file
        if file == "memory.memsw.limit_in_bytes" and not target.exists():
            continue  # no swap accounting: the memory limit is all there is
        target.write_text(value)
    return path


def agent_uid() -> int:
    """A fresh uid for one agent program (see `AGENT_UID_BASE`)."""
    return AGENT_UID_BASE + secrets.randbelow(AGENT_UID_SPAN)


def sandbox_tools() -> tuple[str, str]:
    """Absolute paths of `setpriv` and `bwrap`; raises `AgentConfigError` naming the
    missing one (Debian packages util-linux and bubblewrap)."""
    found = []
    for tool, package in (("setpriv", "util-linux"), ("bwrap", "bubblewrap")):
        path = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
        if path is None:
            raise AgentConfigError(
                f"cannot confine a command agent: {tool} is missing (apt-get install {package})"
            )
        found.append(path)
    return found[0], found[1]


def sandbox_argv(
    argv: Sequence[str],
    *,
    uid: int,
    view: Path,
    read_only: Sequence[str] = (),
    network: bool = False,
    tools: tuple[str, str] | None = None,
    scratch_bytes: int = SCRATCH_BYTES,
    seccomp_fd: int | None = None,
) -> list[str]:
    """The command line that runs `argv` as `uid` in its own namespaces (see the module
    docstring), with `view` at `SANDBOX_ROOT` and every path of `read_only` at its own
    place, read-only; `/tmp` and the home are tmpfs of `scratch_bytes` each. With
    `seccomp_fd` (an inherited descriptor to read `seccomp_program()` from), the program
    runs under that filter. The environment is the caller's to give (it passes through
    whole).

    Three stages, all the arena's own binaries: `bwrap`, run by root, builds the view
    (so it can bind paths under directories only root may traverse) and the pid, ipc,
    uts, cgroup and (unless `network`) network namespaces; in there `setpriv` becomes
    `uid` with no capability, no supplementary group and no_new_privs; then an
    unprivileged `bwrap` puts the program in a user namespace of its own in which no
    further user namespace can be made."""
    setpriv, bwrap = tools or sandbox_tools()
    words = [
        bwrap,
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup",
        *([] if network else ["--unshare-net"]),
        "--new-session",
        "--hostname",
        "opsarena-agent",
        "--ro-bind",
        "/usr",
        "/usr",
        "--tmpfs",
        "/usr/local",
    ]
    for link in TOP_LINKS:
        if os.path.islink(link):
            words += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            words += ["--ro-bind", link, link]
    words += ["--perms", "0755", "--dir", "/etc"]
    for path in ETC_FILES:
        words += ["--ro-bind-try", path, path]
    words += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(scratch_bytes),
        "--tmpfs",
        "/tmp",
        "--perms",
        "0755",
        "--dir",
        "/home",
        "--perms",
        "1777",
        "--size",
        str(scratch_bytes),
        "--tmpfs",
        SANDBOX_HOME,
        "--ro-bind",
        str(view),
        SANDBOX_ROOT,
    ]
    made = {"/", "/tmp", "/etc", "/home", SANDBOX_HOME, SANDBOX_ROOT}
    for path in read_only:
        for parent in reversed(Path(path).parents):
            if str(parent) not in made:
                made.add(str(parent))
                words += ["--perms", "0755", "--dir", str(parent)]
        words += ["--ro-bind", path, path]
    words += [
        "--chdir",
        SANDBOX_HOME,
        "--",
        setpriv,
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        bwrap,
        "--unshare-user",
        "--disable-userns",
        *([] if seccomp_fd is None else ["--seccomp", str(seccomp_fd)]),
        "--dev-bind",
        "/",
        "/",
        "--chdir",
        SANDBOX_HOME,
        "--",
        *argv,
    ]
    return words
