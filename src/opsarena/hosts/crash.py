"""The service-crash fault, from outside the host: freeze the host, kill a unit's cgroup.

Everything here is read from the arena's own view of the kernel (`/proc`, this machine's
cgroupfs), never from a program inside the host. Which cgroup is the unit's is systemd's
answer over the host's bus (the podman driver asks; a directory named like the unit
somewhere else in the host's tree is not it), accepted only below the host's own cgroup.
The kill freezes the host's cgroup (so no process of the unit can fork or exit
meanwhile), sends SIGKILL to every member of the unit's cgroup, and thaws: the whole
unit dies at once.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

from opsarena.errors import HostUnavailableError, UnitMissingError
from opsarena.hosts import kernel
from opsarena.hosts.kernel import Proc

CGROUP_ROOT = Path(kernel.CGROUP_ROOT)
_UNIT_RE = re.compile(r"^[A-Za-z0-9:_@\\-][A-Za-z0-9:_.@\\-]*$")
_UNIT_SUFFIXES = (".service", ".socket", ".scope", ".mount", ".timer", ".target", ".slice")
FREEZE_TIMEOUT = 5.0


def unit_name(unit: str) -> str:
    """`unit` as systemd names it (`records` → `records.service`). Raises
    `UnitMissingError` for something that cannot be a unit name (a path, `..`)."""
    if not _UNIT_RE.match(unit) or ".." in unit:
        raise UnitMissingError(f"{unit!r} is not a systemd unit name")
    return unit if unit.endswith(_UNIT_SUFFIXES) else unit + ".service"


def host_freezer(init_pid: int, root: Path = CGROUP_ROOT) -> Path | None:
    """The file that freezes the whole host of `init_pid` (v1 `freezer.state` or v2
    `cgroup.freeze` of its cgroup), or None when the machine has neither."""
    with open(f"/proc/{init_pid}/cgroup", errors="surrogateescape") as cgroup_file:
        lines = [line.rstrip("\n").split(":", 2) for line in cgroup_file]
    by_name = {controllers: path for _id, controllers, path in lines}
    freezer: Path | None = None
    if "freezer" in by_name and (root / "freezer").is_dir():
        freezer = root / "freezer" / by_name["freezer"].lstrip("/") / "freezer.state"
    else:
        host = Path(kernel.cgroup_dir(kernel.container_cgroup(init_pid)))
        freezer = host / "cgroup.freeze"
    return freezer if freezer.exists() else None


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


def kill_unit(cgroup: str, init_pid: int, freezer: Path | None) -> tuple[list[Proc], int]:
    """SIGKILL every process of the host of `init_pid` in `cgroup` (as this machine names
    it) and below, all at once under the host's freezer. Returns whom it reached and the
    instant of the kill in the unit of `Proc.start`."""
    with frozen(freezer):
        victims = kernel.cgroup_members(cgroup, init_pid)
        instant = kernel.now_ticks()
        for victim in victims:
            kernel.signal_process(victim)
    return victims, instant


def gone(victims: list[Proc]) -> bool:
    """True when none of `victims` is alive (a reused pid with another start time is
    another process)."""
    return not any(kernel.alive(victim) for victim in victims)


def new_main_process(cgroup: str, init_pid: int, victims: list[Proc], since: int) -> Proc | None:
    """A process in `cgroup` that is none of `victims`, started at or after `since`, whose
    parent is the host's init (a main process systemd started, not a straggler), or None."""
    old = set(victims)
    for member in kernel.cgroup_members(cgroup, init_pid):
        fresh = member not in old and member.start >= since
        if fresh and kernel.parent_pid(member.pid) == init_pid:
            return member
    return None


def require_alive(init: Proc) -> None:
    if not kernel.alive(init):
        raise HostUnavailableError("the host's init went away during the crash")
