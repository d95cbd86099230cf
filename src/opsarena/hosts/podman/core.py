"""The core of a podman host: its state (boots, the init seen last, whether the arena
stopped it), podman's view of it (`_inspect`), its init's pid and start time (the boot
id every fact and fault starts from), its systemd bus and readiness. `PodmanHost`
(`host.py`) is this plus facts (`facts.py`) and faults (`faults.py`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from opsarena.errors import (
    BootFailedError,
    HostBootError,
    HostDownError,
    HostNotFoundError,
    HostUnavailableError,
)
from opsarena.hosts import kernel, powerdisk
from opsarena.hosts.base import Host, ServiceRestart
from opsarena.hosts.kernel import Proc
from opsarena.hosts.podman.cli import Podman, last_line
from opsarena.hosts.systemd_bus import BusError, KeptBus, SystemdBus

INIT_GONE_GRACE_S = 5.0
"""How long `connect` waits for podman to say whether a host whose init died is down."""
READY_POLL_FIRST_S = 0.02
READY_POLL_MAX_S = 0.5
"""`wait_ready` asks again after 20 ms, then twice as long each time up to 500 ms: a boot
takes seconds, and at a steady 20 ms, with 32 hosts booting, parsing systemd's answers
took 7 % of the controller's Python time (docs/PERFORMANCE.md)."""

_READY_STATES = ("running", "degraded")


class PodmanHostCore(Host):
    """A podman host's state, init, bus and readiness (see the module)."""

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
            raise HostUnavailableError(f"cannot inspect {self.name}: {last_line(result.stderr)}")
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
        self._boot_id = kernel.start_time(self._pid)
        if not self._rebooting:
            self._stopped_by_arena = False
        if self._boot_id is None or not kernel.alive(Proc(self._pid, self._boot_id)):
            # init died (or is a zombie) and podman has not noticed yet
            self._pid = 0
            raise HostUnavailableError(f"{self.name} is not running (init is gone)")
        return self._pid

    async def _bus(self, what: str, timeout: float) -> SystemdBus:
        pid = await self._init_pid()
        try:
            return await asyncio.to_thread(SystemdBus, pid, timeout=timeout)
        except BusError as exc:
            raise HostUnavailableError(f"{what} in {self.name}: {exc}") from exc

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


def printable_state(text: str) -> str:
    """A state string a host's systemd sent, cut short and without control characters
    (it reaches logs and terminals)."""
    return "".join(c if c.isprintable() else "?" for c in text[:40])
