"""backup-restore: a disk loss, the competitor's restore, and the recovery point objective.

`disk-loss-restore` writes fresh records at a steady pace for `write_s` seconds (longer
than the RPO, so that some are older than it when the disk goes), then injects the
milestone's `disk-loss` fault (`Host.lose_directory`: every process of the host killed
at once, everything below the data directory deleted from outside, the host booted).
Then, all from outside the host:

1. the enabled service must answer /health on the empty directory within the ready
   budget, and GETs of the oldest records of the stream must answer 404: a record
   still served is kept somewhere the loss did not reach (`loss_not_effective`);
2. the competitor's restore command runs inside the host as root (its own program, as
   confined as the competitor; only its exit status is used: `restore_failed`);
3. /health again, the port held by the unit's processes started after the loss;
4. the whole ledger is re-read: every record acknowledged more than `rpo_s` before the
   loss must be back byte for byte; one acknowledged within the RPO may be lost
   (forgiven, and dropped). The evidence and the failure detail carry the measured RPO
   (how old, at the loss, the newest stream record was that came back together with
   every older one) and the restore time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from opsarena.errors import HostError
from opsarena.hosts import Host
from opsarena.ledger import Slot
from opsarena.referee.checks import Decided, error_verdict, inject, request, wait_healthy
from opsarena.referee.contract import CheckContext, Verdict, register_check
from opsarena.referee.failures import Observation, body_summary, curl_line, describe_error
from opsarena.referee.nemesis import milestone_fault_object
from opsarena.referee.ownership import port_ownership_verdict
from opsarena.workloads.records.checks import pending_of, put_record, reread_ledger, workload_seed
from opsarena.workloads.records.workload import Record, make_record

RPO_S = 10.0
WRITE_S = 13.0
WRITE_RATE_PER_S = 4.0
RESTORE_COMMAND = "/usr/local/sbin/restore-records"
RESTORE_TIMEOUT_S = 60.0
LOSS_PROBES = 3
"""How many of the stream's oldest records must answer 404 between the loss and the
restore."""


def measured_rpo_ms(acks: list[tuple[str, float]], ok: set[str], lost_at: float) -> int | None:
    """How old (ms, at `lost_at`) the newest record is that came back together with every
    record acknowledged before it: `acks` is (id, acknowledged at) in the order written,
    `ok` the ids read back intact. None when even the oldest did not come back. Pure."""
    newest: float | None = None
    for record_id, acked in acks:
        if record_id not in ok:
            break
        newest = acked
    return None if newest is None else max(0, int((lost_at - newest) * 1000))


def forgiven_ids(acks: list[tuple[str, float]], lost_at: float, rpo_s: float) -> set[str]:
    """The ids acknowledged less than `rpo_s` before `lost_at`: they may be lost. Pure."""
    return {record_id for record_id, acked in acks if lost_at - acked < rpo_s}


def _failed(reason: str, observation: Observation) -> Decided:
    return Decided(Verdict.failed(reason, observation.render()))


async def _confirm_loss(host: Host, ctx: CheckContext, oldest: list[Record]) -> None:
    """The oldest stream records must answer 404 now: the loss took them."""
    for record in oldest:
        target = f"/records/{record.id}"
        step = f"after the disk loss, before the restore: GET {target}"
        response = await request(host, ctx, "GET", target, step=step)
        if response.status == 404:
            continue
        kept = response.status == 200 and response.body == record.value
        raise _failed(
            "loss_not_effective" if kept else "bad_status",
            Observation(
                step=step,
                elapsed_ms=response.elapsed_ms,
                phase="receive",
                status=response.status,
                expected="status 404: the data directory was emptied and nothing is "
                "restored yet",
                received=f"status {response.status} with {body_summary(response.body)}"
                + (" (the record as written: it is kept outside the data directory)"
                   if kept else ""),
                reproduce=curl_line("GET", ctx.challenge.port, target),
            ),
        )  # fmt: skip


async def _restore(host: Host, ctx: CheckContext, command: str, timeout: float) -> int:
    """Run the competitor's restore command; returns its ms. Raises `Decided`."""
    step = f"after the disk loss: {command}"
    started = time.monotonic()
    try:
        result = await host.exec([command], timeout=timeout)
    except HostError as exc:
        elapsed = int((time.monotonic() - started) * 1000)
        observation = Observation(step=step, elapsed_ms=elapsed, error=describe_error(exc))
        raise Decided(error_verdict(exc, observation)) from exc
    if result.ok:
        return result.duration_ms
    tail = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
    why = (
        f"ran over its {timeout:g} s budget"
        if result.timed_out
        else f"exited {result.exit_code}"
        + (" (not found or not executable)" if result.exit_code in (126, 127) else "")
    )
    raise _failed(
        "restore_failed",
        Observation(
            step=step,
            elapsed_ms=result.duration_ms,
            error=f"the restore command {why}; its last line on stderr: "
            f"{''.join(c if c.isprintable() else '?' for c in tail[0][:200])}",
        ),
    )


@register_check("disk-loss-restore")
async def check_disk_loss_restore(host: Host, ctx: CheckContext) -> Verdict:
    """See the module docstring. Params: `rpo_s`, `write_s`, `restore_command`,
    `restore_timeout_s` (and the fault's `path`). Evidence: `disk-loss`, rpo_s,
    measured_rpo_ms, restore_ms, recovered_ms, written, forgiven, reread counts."""

    async def run() -> dict[str, Any]:
        rpo_s = float(ctx.milestone.param("rpo_s", RPO_S))
        write_s = max(float(ctx.milestone.param("write_s", WRITE_S)), rpo_s + 1.0)
        command = str(ctx.milestone.param("restore_command", RESTORE_COMMAND))
        timeout = float(ctx.milestone.param("restore_timeout_s", RESTORE_TIMEOUT_S))
        fault = milestone_fault_object(ctx.milestone)
        seed = workload_seed(ctx)
        written: list[Record] = []
        acks: list[tuple[str, float]] = []
        end = time.monotonic() + write_s
        while time.monotonic() < end:
            slot = Slot(ctx.territory, ctx.milestone.id, ctx.attempt, f"stream-{len(written)}")
            record = make_record(seed, slot)
            await put_record(
                host, ctx, record, step=f"before the disk loss, PUT /records/{record.id}"
            )
            written.append(record)
            acks.append((record.id, time.monotonic()))
            await asyncio.sleep(1 / WRITE_RATE_PER_S)
        since = host.clock_ticks()
        began = time.monotonic()
        loss_ms = await inject(host, ctx, fault)
        at = host.last_fault_at
        lost_at = at if at is not None and at >= began else began
        ready_ms = await wait_healthy(host, ctx, fault)
        await _confirm_loss(host, ctx, written[:LOSS_PROBES])
        restore_ms = await _restore(host, ctx, command, timeout)
        await wait_healthy(host, ctx, fault)
        recovered_ms = int((time.monotonic() - lost_at) * 1000)
        step = f"after the restore, owner of port {ctx.challenge.port}"
        owned = await port_ownership_verdict(host, ctx, step=step, since=since, fault=fault.name)
        if owned is not None:
            raise Decided(owned)
        forgiven = forgiven_ids(acks, lost_at, rpo_s)
        outcomes: dict[str, str] = {}
        try:
            reread = await reread_ledger(
                host, ctx, fault, {r.id for r in written}, forgiven=forgiven, outcomes=outcomes
            )
        except Decided as decided:
            ok = {i for i, outcome in outcomes.items() if outcome == "ok"}
            measured = measured_rpo_ms(acks, ok, lost_at)
            said = f"more than {write_s:g} s" if measured is None else f"{measured} ms"
            detail = (
                f"measured RPO {said} (allowed: {rpo_s:g} s), restore {restore_ms} ms; "
                f"{decided.verdict.failure_detail}"
            )
            raise Decided(dataclasses.replace(decided.verdict, failure_detail=detail)) from None
        ok = {i for i, outcome in outcomes.items() if outcome == "ok"}
        return {
            fault.name: True,
            "attempt": ctx.attempt,
            "rpo_s": rpo_s,
            "measured_rpo_ms": measured_rpo_ms(acks, ok, lost_at),
            "loss_ms": loss_ms,
            "ready_ms": ready_ms,
            "restore_ms": restore_ms,
            "recovered_ms": recovered_ms,
            "written": len(written),
            "forgiven": pending_of(ctx).checked.forgiven,
            **reread,
        }

    try:
        return Verdict.passed(await run())
    except Decided as decided:
        return decided.verdict
