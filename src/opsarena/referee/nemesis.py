"""The faults (Jepsen's nemesis): one registered class per fault, found by name.

A fault has three steps, run in order by `run_fault`: `inject` (through one `Host`
method, named by `host_method`), `confirm` (from outside the host: a new main PID, a new
boot; never what a program inside the host prints) and `heal` (whatever must hold before
the service is probed again). A challenge names faults by these names (a milestone's
`fault`); a host driver declares the names it supports (`HostDriver.faults`), and a
challenge needing one its driver lacks is refused at match start (`missing_faults`).

Faults are a `Registry` (entry point group `opsarena.faults`). A new fault takes: its
class with `@register_fault` (here for a built-in, or in a package's module named by an
`opsarena.faults` entry point); when it needs a `Host` method no offered fault uses, that
method in `hosts/base.py` and each driver that can do it, and its name in those drivers'
`HostDriver.faults`; a line in docs/REFEREE.md. A driver offers a fault it names, and
every fault performed by the `Host` method of one it names (`offered_faults`), so a
plug-in fault built on an existing method needs no driver change. Nothing else
dispatches on a fault's name: a check names its default fault where it registers
(`register_check(..., fault=...)`), and a fault that needs a power-cut disk says so
(`Fault.needs_power_cut_disk`), which the controller and the Inspect sandbox ask
(`needs_power_cut_disk`). Registering another
fault under a taken name is a `RegistryError`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from opsarena.errors import HostBootError
from opsarena.hosts import Host
from opsarena.referee.contract import default_fault
from opsarena.referee.model import Challenge, Milestone
from opsarena.registry import Registry


@dataclass(frozen=True)
class FaultRun:
    """What one injected fault did: a one-line detail for the `fault_injected` event."""

    detail: str


class Fault(abc.ABC):
    """One kind of fault. Subclasses set the class attributes and the three steps."""

    name: ClassVar[str]
    host_method: ClassVar[str]
    """The `Host` method that performs it (a driver without it cannot offer the fault)."""
    timeout_s: ClassVar[float]
    """Bound on the whole fault (separate from the readiness budget after it)."""
    after: ClassVar[str]
    """How a failure_detail names the time after it: "after the restart"."""
    host_state: ClassVar[str | None] = None
    """The host state logged while the fault is in flight ("rebooting"), if any."""
    needs_power_cut_disk: ClassVar[bool] = False
    """Hosts it is injected on need a disk that can lose power (`HostSpec.power_cut`):
    a host is given one only when a fault of its challenge says so (`needs_power_cut_disk`)."""

    def describe(self, host: Host, unit: str) -> str:
        """What the fault does, as a failure_detail step."""
        return f"{self.name} of {host.name}"

    async def before(self, host: Host, unit: str) -> int:
        """What `confirm` compares against, read before the fault (default: nothing)."""
        return 0

    @abc.abstractmethod
    async def inject(self, host: Host, unit: str) -> int:
        """Perform the fault; returns what `confirm` needs (a PID, a boot count...)."""

    @abc.abstractmethod
    async def confirm(self, host: Host, unit: str, before: int, injected: int) -> FaultRun:
        """Confirm from outside that the fault happened; raise the host contract's error
        when it did not."""

    async def heal(self, host: Host, unit: str) -> None:  # noqa: B027 (optional step)
        """Bring the host back to where the service can be probed (default: nothing)."""

    def with_params(self, params: Mapping[str, object]) -> Fault:
        """This fault as a milestone configures it (its `[milestones.params]`); the
        default takes no parameter and returns itself."""
        return self

    def param_problems(self, params: Mapping[str, object]) -> list[str]:
        """One line per problem with what this fault needs from a milestone's params
        (checked before a match starts and by `challenges validate`); none by default."""
        return []


FAULTS: Registry[type[Fault]] = Registry("fault", "opsarena.faults")
"""Fault classes by name; `get_fault` makes the instance (constructible without arguments;
`with_params` configures it for a milestone)."""


def register_fault(cls: type[Fault]) -> type[Fault]:
    """Class decorator: register `cls` under `cls.name`; `RegistryError` when another
    fault has the name already."""
    return FAULTS.register(cls.name, cls)


def fault_names() -> list[str]:
    """Every fault's name, the installed packages' included, sorted."""
    return FAULTS.names()


def get_fault(name: str) -> Fault:
    """The fault registered as `name`; `KeyError` (a bug: challenges are checked first)."""
    cls = FAULTS.get(name)
    if cls is None:
        raise KeyError(name)
    return cls()


def offered_faults(supported: Iterable[str]) -> set[str]:
    """The faults a host driver declaring `supported` (its `HostDriver.faults`) can
    inject: those, and every registered fault performed by the `Host` method of one of
    them (a plug-in fault built on `restart_service` is offered wherever `restart` is)."""
    offered = set(supported)
    methods = {cls.host_method for name in offered if (cls := FAULTS.get(name)) is not None}
    return offered | {name for name, cls in FAULTS.items() if cls.host_method in methods}


async def run_fault(fault: Fault, host: Host, unit: str) -> FaultRun:
    """Inject, confirm and heal `fault` on `host`; raises whatever a step raised."""
    before = await fault.before(host, unit)
    injected = await fault.inject(host, unit)
    run = await fault.confirm(host, unit, before, injected)
    await fault.heal(host, unit)
    return run


def milestone_fault_object(milestone: Milestone) -> Fault:
    """The fault `milestone` injects, configured with its params. `KeyError` when it
    injects none (a bug: only fault milestones ask)."""
    name = milestone_fault(milestone.check, milestone.fault)
    if name is None:
        raise KeyError(f"milestone {milestone.id} injects no fault")
    return get_fault(name).with_params(milestone.params)


def milestone_fault(check: str, fault: str | None) -> str | None:
    """The fault a milestone injects: its own `fault`, else the default its check
    declared where it registered (`register_check(name, fault=...)`)."""
    return fault if fault is not None else default_fault(check)


def faults_needed(challenge: Challenge) -> list[str]:
    """Every fault `challenge` injects, in milestone order, without repeats."""
    needed: list[str] = []
    for m in challenge.milestones:
        name = milestone_fault(m.check, m.fault)
        if name is not None and name not in needed:
            needed.append(name)
    return needed


def needs_power_cut_disk(challenge: Challenge) -> bool:
    """Whether hosts made for `challenge` need a disk that can lose power: a fault one of
    its milestones injects declares it (`Fault.needs_power_cut_disk`). A fault that is not
    registered needs nothing (`missing_faults` refuses it first). Pure."""
    known = set(fault_names())
    return any(
        get_fault(name).needs_power_cut_disk for name in faults_needed(challenge) if name in known
    )


def missing_faults(challenge: Challenge, supported: Iterable[str], driver: str) -> str | None:
    """One line saying which faults `challenge` needs that are unknown or that the host
    driver `driver` does not support; None when every one is there. Pure apart from
    loading the `opsarena.faults` plug-ins."""
    offered = offered_faults(supported)
    unknown = [f for f in faults_needed(challenge) if FAULTS.get(f) is None]
    if unknown:
        return (
            f"challenge {challenge.name!r} names unknown faults {', '.join(unknown)} "
            f"(known: {', '.join(fault_names())})"
        )
    bare = [m.id for m in challenge.milestones if m.check == "fault-durability" and not m.fault]
    if bare:
        return (
            f"challenge {challenge.name!r}: milestones {', '.join(bare)} use the check "
            'fault-durability but name no fault (add fault = "...")'
        )
    for m in challenge.milestones:
        name = milestone_fault(m.check, m.fault)
        problems = get_fault(name).param_problems(m.params) if name is not None else []
        if problems:
            return f"challenge {challenge.name!r}: milestone {m.id}: {problems[0]}"
    lacking = [f for f in faults_needed(challenge) if f not in offered]
    if lacking:
        return (
            f"challenge {challenge.name!r} needs the faults {', '.join(lacking)}, which the "
            f"host driver {driver!r} does not support (it offers: "
            f"{', '.join(sorted(offered)) or 'none'})"
        )
    return None


@register_fault
class RestartFault(Fault):
    """`systemctl restart` of the competitor's unit; confirmed by a new main PID."""

    name = "restart"
    host_method = "restart_service"
    timeout_s = 30.0
    after = "after the restart"

    def describe(self, host: Host, unit: str) -> str:
        return f"systemctl restart {unit}"

    async def inject(self, host: Host, unit: str) -> int:
        restart = await host.restart_service(unit, timeout=self.timeout_s)
        return restart.main_pid

    async def confirm(self, host: Host, unit: str, before: int, injected: int) -> FaultRun:
        # `restart_service` returns only once the unit's old processes (by pid and start
        # time, read from outside) are gone, killing survivors itself, and a new main
        # process is in the unit's cgroup; `describe` says what it saw.
        restart = host.last_restart
        if restart is not None and restart.main_pid == injected:
            return FaultRun(restart.describe())
        return FaultRun(f"{unit} restarted; its new main PID is {injected}")


@register_fault
class RebootFault(Fault):
    """A reset of the whole host: every process killed at once (no shutdown, no SIGTERM:
    a service that keeps records in memory and writes them out when asked to stop loses
    them), then a boot; confirmed by a new boot of its init. Files are kept as written
    (the machine's page cache survives: losing un-synced writes is `power-cut`'s)."""

    name = "reboot"
    host_method = "reboot"
    timeout_s = 90.0
    after = "after the reboot"
    host_state = "rebooting"

    def describe(self, host: Host, unit: str) -> str:
        return "reboot of the host (every process killed at once, then a boot)"

    async def before(self, host: Host, unit: str) -> int:
        return host.boots

    async def inject(self, host: Host, unit: str) -> int:
        await host.reboot(hard=True, timeout=self.timeout_s)
        return host.boots

    async def confirm(self, host: Host, unit: str, before: int, injected: int) -> FaultRun:
        if injected != before + 1:
            raise HostBootError(
                f"{host.name} reported no new boot after the reboot (boots {before} -> {injected})"
            )
        return FaultRun(f"{host.name} rebooted and is ready (boot {injected})")


@register_fault
class CrashFault(Fault):
    """Every process of the unit SIGKILLed at once from outside (its cgroup); confirmed
    by the driver seeing the old processes gone and a new one that the host's init started
    by itself (the unit's own `Restart=`). `ServiceNotRestartedError` otherwise."""

    name = "crash"
    host_method = "crash_service"
    timeout_s = 10.0
    after = "after the crash"

    def describe(self, host: Host, unit: str) -> str:
        return f"SIGKILL of every process of {unit}"

    async def inject(self, host: Host, unit: str) -> int:
        return await host.crash_service(unit, timeout=self.timeout_s)

    async def confirm(self, host: Host, unit: str, before: int, injected: int) -> FaultRun:
        # `crash_service` returns only once the killed pids (with their start times) are
        # gone and a new process is in the unit's cgroup: read from outside the host.
        return FaultRun(f"{unit} killed; systemd restarted it, new main PID {injected}")


@register_fault
class PowerCutFault(Fault):
    """Every process of the host dies at once and its disk loses what was not made
    durable; the host boots again. Confirmed by a new boot of its init."""

    name = "power-cut"
    host_method = "power_cut"
    timeout_s = 90.0
    after = "after the power cut"
    host_state = "rebooting"
    needs_power_cut_disk = True

    def describe(self, host: Host, unit: str) -> str:
        return "power cut of the host (un-synced writes may be lost)"

    async def before(self, host: Host, unit: str) -> int:
        return host.boots

    async def inject(self, host: Host, unit: str) -> int:
        await host.power_cut(timeout=self.timeout_s)
        return host.boots

    async def confirm(self, host: Host, unit: str, before: int, injected: int) -> FaultRun:
        if injected != before + 1:
            raise HostBootError(
                f"{host.name} reported no new boot after the power cut "
                f"(boots {before} -> {injected})"
            )
        return FaultRun(f"{host.name} lost power, booted and is ready (boot {injected})")


@register_fault
class DiskLossFault(Fault):
    """The disk holding the milestone's `path` lost and replaced by an empty one
    (`Host.lose_directory`): every process killed at once, everything below `path`
    deleted from outside, then a boot; confirmed by a new boot of the host's init."""

    name = "disk-loss"
    host_method = "lose_directory"
    timeout_s = 90.0
    after = "after the disk loss"
    host_state = "rebooting"

    def __init__(self, path: str = "") -> None:
        self.path = path

    def with_params(self, params: Mapping[str, object]) -> Fault:
        return DiskLossFault(str(params.get("path", "")))

    def param_problems(self, params: Mapping[str, object]) -> list[str]:
        path = params.get("path")
        if not isinstance(path, str) or not path.startswith("/") or path.rstrip("/") == "":
            return [f"the disk-loss fault needs params.path, an absolute directory below / "
                    f"(not {path!r})"]  # fmt: skip
        return []

    def describe(self, host: Host, unit: str) -> str:
        where = self.path or "the data"
        return f"loss of the disk holding {where} (every process killed, it emptied, a boot)"

    async def before(self, host: Host, unit: str) -> int:
        return host.boots

    async def inject(self, host: Host, unit: str) -> int:
        await host.lose_directory(self.path, timeout=self.timeout_s)
        return host.boots

    async def confirm(self, host: Host, unit: str, before: int, injected: int) -> FaultRun:
        if injected != before + 1:
            raise HostBootError(
                f"{host.name} reported no new boot after the disk loss "
                f"(boots {before} -> {injected})"
            )
        return FaultRun(f"{self.path} in {host.name} emptied, the host booted (boot {injected})")
