"""Facts about a podman host read from outside (`hosts/kernel.py`): the processes of a
unit's cgroup and of a listening port, its init, and what it wrote to its disk.
"""

from __future__ import annotations

import asyncio
import os
import re
import time

from opsarena.errors import (
    DiskMeasureError,
    HostUnavailableError,
    ServiceRestartError,
    UnitMissingError,
)
from opsarena.hosts import diskcount, kernel
from opsarena.hosts.base import DiskUse
from opsarena.hosts.kernel import Proc
from opsarena.hosts.podman.cli import last_line
from opsarena.hosts.podman.core import PodmanHostCore
from opsarena.hosts.systemd_bus import BusError

UNIT_RE = re.compile(r"^[A-Za-z0-9:_.@\\-]+$")

DISK_COUNT_S = 30.0
"""`disk_use` counts a host's writable layer (bytes, then inodes) within this long."""


class PodmanFacts(PodmanHostCore):
    """Kernel facts of a podman host (see the module)."""

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
        if not UNIT_RE.match(unit):
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

    async def disk_use(self, *, within: float | None = None) -> DiskUse:
        bound = DISK_COUNT_S if within is None else within
        upper = await self._upper_dir()
        # The upper directory is the arena's, outside the host's view: the host cannot
        # remove it. It is missing only while a power-cut disk is unmounted.
        cutting = self.disk is not None and self._rebooting
        if cutting or not await asyncio.to_thread(os.path.isdir, upper):
            raise HostUnavailableError(f"the disk of {self.name} is not mounted now")
        deadline = time.monotonic() + bound
        (used, inodes), partial = await self._du(upper, deadline, bound)
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

    async def _du(self, upper: str, deadline: float, bound: float) -> tuple[tuple[int, int], bool]:
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
            raise DiskMeasureError(f"counting the disk of {self.name} took over {bound:g}s")
        totals = [line.split()[0] for line in counted.out.splitlines() if line]
        if len(totals) != 2 or not all(total.isdigit() for total in totals):
            raise DiskMeasureError(
                f"cannot measure the disk of {self.name}: {last_line(counted.err.encode())}"
            )
        return (int(totals[0]), int(totals[1])), counted.code != 0
