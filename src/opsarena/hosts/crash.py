"""The service-crash fault, from outside the host: a unit's cgroup, its members, the kill.

Everything here is read from the arena's own view of the kernel (`/proc`, this machine's
cgroupfs), never from a program inside the host. A host's systemd keeps each unit in a
cgroup `<the host's cgroup>/<slice>/<unit>`; on a cgroup v1/v2 hybrid that is in the
named `systemd` hierarchy, on a pure v2 machine in the unified one. The kill freezes
the host's cgroup (so no process of the unit can fork or exit meanwhile), sends SIGKILL
to every member of the unit's cgroup, and thaws: the whole unit dies at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opsarena.errors import HostUnavailableError, UnitMissingError

CGROUP_ROOT = Path("/sys/fs/cgroup")
_UNIT_RE = re.compile(r"^[A-Za-z0-9:_@\\-][A-Za-z0-9:_.@\\-]*$")
_UNIT_SUFFIXES = (".service", ".socket", ".scope", ".mount", ".timer", ".target", ".slice")
FREEZE_TIMEOUT = 5.0


def unit_name(unit: str) -> str:
    """`unit` as systemd names it (`records` → `records.service`). Raises
    `UnitMissingError` for something that cannot be a unit name (a path, `..`)."""
    if not _UNIT_RE.match(unit) or ".." in unit:
        raise UnitMissingError(f"{unit!r} is not a systemd unit name")
    return unit if unit.endswith(_UNIT_SUFFIXES) else unit + ".service"


@dataclass(frozen=True)
class Process:
    """A process as this machine numbers it, with its start time (clock ticks since the
    machine booted): the pair names one process even after its pid is reused."""

    pid: int
    start: int


def start_time(pid: int) -> int | None:
    """Start time of `pid`, or None when no such process is alive."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == b"Z":
        return None  # dead, not yet reaped
    return int(fields[19])


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def namespace_pid(pid: int) -> int:
    """`pid` as the innermost PID namespace it lives in numbers it."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return pid


def host_cgroups(init_pid: int, root: Path = CGROUP_ROOT) -> tuple[Path, Path | None]:
    """(the host's cgroup in the hierarchy its systemd runs units in, the file that
    freezes the host or None) for a host whose init is `init_pid` (this machine's pid)."""
    with open(f"/proc/{init_pid}/cgroup") as cgroup_file:
        lines = [line.rstrip("\n").split(":", 2) for line in cgroup_file]
    by_name = {controllers: path for _id, controllers, path in lines}
    if "name=systemd" in by_name and (root / "systemd").is_dir():
        units = root / "systemd" / by_name["name=systemd"].lstrip("/")
    else:
        base = root / "unified" if (root / "unified").is_dir() else root
        units = base / by_name.get("", "/").lstrip("/")
    if units.name == "init.scope":  # init sits in a leaf of the host's own cgroup
        units = units.parent
    freezer: Path | None = None
    if "freezer" in by_name and (root / "freezer").is_dir():
        freezer = root / "freezer" / by_name["freezer"].lstrip("/") / "freezer.state"
    elif (units / "cgroup.freeze").exists():
        freezer = units / "cgroup.freeze"
    if freezer is not None and not freezer.exists():
        freezer = None
    return units, freezer


def unit_cgroup(host_cgroup: Path, unit: str) -> Path | None:
    """The cgroup of `unit` under the host's cgroup (its slice may be any), or None."""
    direct = host_cgroup / "system.slice" / unit
    if direct.is_dir():
        return direct
    for dirpath, dirnames, _files in os.walk(host_cgroup):
        if unit in dirnames:
            return Path(dirpath) / unit
        dirnames[:] = [name for name in dirnames if name.endswith(".slice")]
    return None


def members(cgroup: Path) -> set[Process]:
    """Every live process in `cgroup` and the cgroups below it."""
    found: set[Process] = set()
    for dirpath, _dirs, _files in os.walk(cgroup):
        with contextlib.suppress(OSError):
            for line in (Path(dirpath) / "cgroup.procs").read_text().split():
                start = start_time(int(line))
                if start is not None:
                    found.add(Process(int(line), start))
    return found


@contextlib.contextmanager
def frozen(freezer: Path | None) -> Iterator[None]:
    """Freeze the host's cgroup for the duration (nothing when there is no freezer)."""
    if freezer is None:
        yield
        return
    v1 = freezer.name == "freezer.state"
    freezer.write_text("FROZEN" if v1 else "1")
    try:
        deadline = time.monotonic() + FREEZE_TIMEOUT
        while time.monotonic() < deadline:
            state = freezer.read_text().strip()
            if state == "FROZEN" or (not v1 and _v2_frozen(freezer.parent)):
                break
            time.sleep(0.001)
        yield
    finally:
        freezer.write_text("THAWED" if v1 else "0")


def _v2_frozen(cgroup: Path) -> bool:
    with contextlib.suppress(OSError):
        return "frozen 1" in (cgroup / "cgroup.events").read_text()
    return False


def kill_unit(cgroup: Path, freezer: Path | None) -> set[Process]:
    """SIGKILL every process of the unit's cgroup at once; return whom it reached."""
    with frozen(freezer):
        victims = members(cgroup)
        for victim in victims:
            if start_time(victim.pid) == victim.start:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim.pid, signal.SIGKILL)
    return victims


def gone(victims: set[Process]) -> bool:
    """True when none of `victims` is alive (a reused pid with another start time is
    another process)."""
    return all(start_time(victim.pid) != victim.start for victim in victims)


def new_process(cgroup: Path, old: set[Process], init_pid: int) -> Process | None:
    """A process in the unit's cgroup that is not one of `old` and that the host's
    init started (a main process, not a straggler), or None."""
    for member in members(cgroup):
        if member not in old and parent_pid(member.pid) == init_pid:
            return member
    return None


def require_alive(init_pid: int, boot: int | None) -> None:
    if start_time(init_pid) != boot:
        raise HostUnavailableError("the host's init went away during the crash")
