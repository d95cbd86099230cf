"""The referee's use of kernel facts: whether the process answering on the service's port
is the competitor's unit, and (after a fault that killed it) a new one.

A server the unit does not own (a decoy started outside it, or a `KillMode=process`
child that outlived a restart) can answer every probe while the unit itself is
restarted under it; so after the probes pass, the referee asks the host driver who
holds the listening socket (read from outside: the host's socket table and its
processes' fds) and which processes are in the unit's cgroup (the arena's cgroupfs).
`judge_port_ownership` decides from those facts and is pure.
"""

from __future__ import annotations

import time

from opsarena.errors import HostError
from opsarena.hosts import Host, Proc
from opsarena.referee.contract import CheckContext, Verdict
from opsarena.referee.failures import REASONS, Observation, classify_error, describe_error

REASON = "port_not_owned_by_unit"


def _names(procs: list[Proc]) -> str:
    return ", ".join(str(proc.inner or proc.pid) for proc in procs)


def judge_port_ownership(
    port: int,
    unit: str,
    owners: list[Proc],
    members: list[Proc],
    *,
    init: Proc | None = None,
    since: int | None = None,
    fault: str = "restart",
) -> str | None:
    """None when `port` is held by the unit: every holder of its listening socket is a
    process of `unit` (`members`) or the host's `init` (socket activation), at least one
    is of the unit, and (given `since`, the instant a fault that killed the service
    began, in the unit of `Proc.start`) every one of the unit's holders started at or
    after it: a process kept outside the unit over the `fault` and moved back in is not
    new. Else one line saying what is wrong. Pids in the text are the host's own
    numbers. Pure."""
    if not owners:
        return f"no process of the host holds a socket listening on port {port}"
    unit_set = set(members)
    outsiders = [proc for proc in owners if proc not in unit_set and proc != init]
    if outsiders:
        return (
            f"port {port} is held by PID {_names(outsiders)}, which is not in {unit} "
            f"(the unit's processes: {_names(members) or 'none'})"
        )
    of_unit = [proc for proc in owners if proc in unit_set]
    if not of_unit:
        return f"port {port} is held only by the host's init, no process of {unit} holds it"
    if since is not None:
        stale = [proc for proc in of_unit if proc.start < since]
        if stale:
            return (
                f"port {port} is held by PID {_names(stale)}, a process from before the "
                f"{fault} of {unit}"
            )
    return None


async def port_ownership_verdict(
    host: Host,
    ctx: CheckContext,
    *,
    step: str,
    since: int | None = None,
    fault: str = "restart",
) -> Verdict | None:
    """None when the challenge's port is held by its unit (see `judge_port_ownership`;
    with `since`, by processes started at or after that instant, `Host.clock_ticks()`
    taken before the `fault`); else the verdict: `port_not_owned_by_unit`, or the
    failure table's row for a host error."""
    port, unit = ctx.challenge.port, ctx.challenge.unit
    started = time.monotonic()
    try:
        owners = await host.port_owners(port)
        members = await host.unit_members(unit)
    except HostError as exc:
        elapsed = int((time.monotonic() - started) * 1000)
        row = classify_error(exc)
        detail = Observation(step=step, elapsed_ms=elapsed, error=describe_error(exc)).render()
        if row.category == "referee_error":
            return Verdict.referee_error(row.reason, detail)
        return Verdict.failed(row.reason, detail)
    problem = judge_port_ownership(
        port, unit, owners, members, init=host.init_process, since=since, fault=fault
    )
    if problem is None:
        return None
    assert REASONS[REASON].category == "verification_failed"
    elapsed = int((time.monotonic() - started) * 1000)
    return Verdict.failed(
        REASON, Observation(step=step, elapsed_ms=elapsed, error=problem).render()
    )
