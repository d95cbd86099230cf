"""The records workload's checks: write-read, and durability across faults.

Registered as `write-read`, `restart-durability` (default fault: restart),
`reboot-durability` (default: reboot) and `fault-durability` (the fault its milestone
names). Each probes the service only through the engine's `request` (h11 over
`Host.connect`) and injects faults only through `ctx.inject_fault`. Every acknowledged
PUT goes into the territory's ledger (`ctx.pending`); a fault lands at a seeded moment
inside seeded traffic (`opsarena.workloads.records.workload.plan_traffic`: nothing tells
a service whether or when one comes); after every fault the whole ledger is re-read
(bounded, see `opsarena.ledger`). The failure reasons of records (`record_missing`,
`record_corrupted`, `wrong_record`, `stale_value`, `found_unwritten`) are this
workload's rows of the engine's failure table, registered here
(`opsarena.referee.failures.register_reasons`). Importing this module registers the
engine's `health` check too (`opsarena.referee.checks`), which every records challenge
uses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import time
from collections.abc import Mapping, Sequence, Set
from typing import Any

from opsarena.hosts import Host
from opsarena.ledger import (
    UNWRITTEN_AFTER_FAULT,
    Entry,
    Ledger,
    LedgerSummary,
    Outcome,
    Pending,
    Slot,
    classify,
)
from opsarena.referee.checks import (
    Decided,
    decide,
    failure,
    in_order,
    inject,
    request,
    wait_healthy,
)
from opsarena.referee.contract import VERIFICATION_FAILED, CheckContext, Verdict, register_check
from opsarena.referee.failures import (
    Observation,
    Reason,
    body_summary,
    curl_line,
    register_reasons,
)
from opsarena.referee.nemesis import Fault, get_fault, milestone_fault
from opsarena.referee.ownership import port_ownership_verdict
from opsarena.referee.probe import HttpResponse
from opsarena.workloads.records.derive import derive_record
from opsarena.workloads.records.workload import (
    Op,
    Record,
    TrafficPlan,
    first_difference,
    plan_attempt,
    plan_traffic,
    regenerate,
    slot_value,
    unwritten_id,
)

REASONS = register_reasons(
    [
        Reason("record_missing", VERIFICATION_FAILED,
               "GET of a record the service acknowledged answered 404"),
        Reason("record_corrupted", VERIFICATION_FAILED,
               "GET of a record answered 200 with other bytes"),
        Reason("wrong_record", VERIFICATION_FAILED,
               "GET of a record answered with the value of another id"),
        Reason("stale_value", VERIFICATION_FAILED,
               "GET after an overwrite answered with the older value"),
        Reason("found_unwritten", VERIFICATION_FAILED,
               "GET of an id never written answered 200, not 404"),
    ]
)  # fmt: skip
"""The records workload's rows of the failure table."""

REREAD_PARALLEL = 4
"""The ledger's re-read after a fault runs this many GETs at once."""


def judge_read(
    response: HttpResponse,
    expected: bytes,
    *,
    step: str,
    reproduce: str,
    also: Sequence[bytes] = (),
    older: Sequence[bytes] = (),
    others: Mapping[str, str] | None = None,
) -> Verdict | None:
    """None when a GET of a record returned exactly `expected` (or one of `also`: any
    of several concurrent writes); else the failed verdict: `record_missing` for 404,
    `bad_status` for another status, `stale_value` for an older value in `older`,
    `wrong_record` for the value of another id (`others`: sha256 hex -> id), else
    `record_corrupted`, with the first differing byte offset. Pure."""
    body = response.body
    if response.status == 200 and (body == expected or body in also):
        return None
    digest = hashlib.sha256(body).hexdigest()
    reason = "record_corrupted"
    note = ""
    if response.status == 404:
        reason = "record_missing"
    elif response.status != 200:
        reason = "bad_status"
    elif body in older:
        reason, note = "stale_value", " (an older value of this id: the overwrite was not seen)"
    elif others and digest in others:
        reason, note = "wrong_record", f" (the value stored under {others[digest]})"
    else:
        offset = first_difference(expected, body)
        note = f" (first difference at byte {offset})"
    wanted = f"status 200 with {body_summary(expected)}"
    if also:
        wanted += f" or one of {len(also)} other values written at the same time"
    return Verdict.failed(
        reason,
        Observation(
            step=step,
            elapsed_ms=response.elapsed_ms,
            phase="receive",
            status=response.status,
            expected=wanted,
            received=f"status {response.status} with {body_summary(body)}{note}",
            reproduce=reproduce,
        ).render(),
    )


def pending_of(ctx: CheckContext) -> Pending:
    """This attempt's ledger update (a context without one gets a throw-away one)."""
    if isinstance(ctx.pending, Pending):
        return ctx.pending
    return Pending(ctx.territory, ctx.milestone.id, max(ctx.attempt, 1))


def workload_seed(ctx: CheckContext) -> bytes:
    """The seed the workload derives from: the match seed; for a check run outside a
    referee (no seed), a digest of the attempt's place, so it is still deterministic."""
    if ctx.seed:
        return ctx.seed
    place = f"opsarena-context:{ctx.territory}:{ctx.milestone.id}:{ctx.attempt}"
    return hashlib.sha256(place.encode()).digest()


def attempt_record(ctx: CheckContext) -> tuple[str, str]:
    """This attempt's fresh record (id, value), derived from the seed (`derive_record`):
    the evidence's `record` and `value`, the same in a replay."""
    return derive_record(workload_seed(ctx), ctx.territory, ctx.milestone.id, ctx.attempt)


def text_record(ctx: CheckContext, slot: Slot) -> Record:
    """This attempt's text record under `slot` (`attempt_record`'s id and value)."""
    record_id, value = attempt_record(ctx)
    return Record(slot, record_id, value.encode())


def ledger_of(ctx: CheckContext) -> Ledger:
    return ctx.ledger if isinstance(ctx.ledger, Ledger) else Ledger()


async def put_record(
    host: Host, ctx: CheckContext, record: Record, *, step: str, concurrent: bool = False
) -> int:
    """PUT `record`; a 2xx answer goes into the ledger as acknowledged, a request that
    left but got no answer as indeterminate. Returns the ms. Raises `Decided`."""
    target = f"/records/{record.id}"
    pending = pending_of(ctx)
    try:
        response = await request(host, ctx, "PUT", target, body=record.value, step=step)
    except Decided as decided:
        if decided.sent:
            pending.write(
                record.id, record.value, record.slot, acknowledged=False, concurrent=concurrent
            )
        raise
    if not 200 <= response.status < 300:
        raise _not_stored(ctx, record, response, step=step)
    pending.write(record.id, record.value, record.slot, acknowledged=True, concurrent=concurrent)
    return response.elapsed_ms


def _not_stored(ctx: CheckContext, record: Record, response: HttpResponse, *, step: str) -> Decided:
    """`bad_status` for a PUT of `record` answered with a status that is not 2xx."""
    return failure(
        "bad_status",
        Observation(
            step=step,
            elapsed_ms=response.elapsed_ms,
            phase="receive",
            status=response.status,
            expected="a 2xx status",
            received=f"status {response.status} with {body_summary(response.body)}",
            reproduce=curl_line("PUT", ctx.challenge.port, f"/records/{record.id}",
                                body=record.value),
        ),
    )  # fmt: skip


_OUTCOMES: dict[str, Outcome] = {
    "record_missing": "lost",
    "record_corrupted": "corrupted",
    "wrong_record": "corrupted",
    "stale_value": "stale",
}


def _outcome_of(reason: str | None) -> Outcome | None:
    return _OUTCOMES.get(reason or "")


async def read_record(
    host: Host,
    ctx: CheckContext,
    record_id: str,
    expected: Sequence[bytes],
    *,
    step: str,
    older: Sequence[bytes] = (),
    others: Mapping[str, str] | None = None,
) -> int:
    """GET `record_id`; it must be one of `expected` byte for byte (the ledger counts
    the outcome; a lost, corrupted or stale record is dropped). Returns the ms. Raises
    `Decided`."""
    target = f"/records/{record_id}"
    binary = any(not _printable(v) for v in expected)
    response = await request(host, ctx, "GET", target, step=step)
    reproduce = curl_line("GET", ctx.challenge.port, target, save=binary)
    verdict = judge_read(
        response,
        expected[0],
        step=step,
        reproduce=reproduce,
        also=expected[1:],
        older=older,
        others=others,
    )
    outcome = "ok" if verdict is None else _outcome_of(verdict.failure_reason)
    if outcome is not None:
        pending_of(ctx).count(outcome, record_id)
    if verdict is not None:
        raise Decided(verdict)
    if len(expected) > 1:
        # One of several concurrent writes was read: from now on it is the value (a
        # later read of another one would be an update lost after it was seen).
        pending_of(ctx).settle(record_id, hashlib.sha256(response.body).hexdigest())
    return response.elapsed_ms


def _printable(data: bytes) -> bool:
    return all(0x20 <= byte < 0x7F for byte in data)


async def probe_unwritten(host: Host, ctx: CheckContext, record_id: str, *, step: str) -> None:
    """GET an id nobody wrote: 404 is right, 200 fails `found_unwritten`, anything else
    `bad_status`. Raises `Decided`."""
    target = f"/records/{record_id}"
    response = await request(host, ctx, "GET", target, step=step)
    if response.status == 404:
        return
    reason = "bad_status"
    if response.status == 200:
        pending_of(ctx).count("unexpected")
        reason = "found_unwritten"
    raise failure(
        reason,
        Observation(
            step=step,
            elapsed_ms=response.elapsed_ms,
            phase="receive",
            status=response.status,
            expected="status 404 (this id was never written)",
            received=f"status {response.status} with {body_summary(response.body)}",
            reproduce=curl_line("GET", ctx.challenge.port, target),
        ),
    )


@register_check("write-read")
async def check_write_read(host: Host, ctx: CheckContext) -> Verdict:
    """The whole contract (`opsarena.workloads.records.workload`): text, binary, empty and 1 MiB
    values, an overwrite, 8 parallel PUTs to distinct ids, 4 parallel PUTs to one id,
    and a GET of an id never written. Evidence: record, value (the text record),
    attempt, write_ms, read_ms, steps, bytes_sent."""

    async def run() -> dict[str, Any]:
        seed = workload_seed(ctx)
        plan = plan_attempt(seed, ctx.territory, ctx.milestone.id, max(ctx.attempt, 0))
        plan = dataclasses.replace(plan, text=text_record(ctx, plan.text.slot))
        others = {r.sha256: r.id for r in plan.written() if r.sha256 != EMPTY_SHA256}
        steps: list[str] = []

        async def pair(name: str, record: Record) -> tuple[int, int]:
            write_ms = await put_record(host, ctx, record, step=f"{name}: PUT /records/{record.id}")
            read_ms = await read_record(
                host, ctx, record.id, [record.value], step=f"{name}: GET /records/{record.id}",
                others=others,
            )  # fmt: skip
            steps.append(name)
            return write_ms, read_ms

        write_ms, read_ms = await pair("text", plan.text)
        await pair("binary", plan.binary)
        await pair("empty", plan.empty)
        await pair("large", plan.large)

        first, second = plan.overwrite
        await pair("overwrite (first value)", first)
        await put_record(
            host, ctx, second, step=f"overwrite (second value): PUT /records/{second.id}"
        )
        await read_record(
            host, ctx, second.id, [second.value],
            step=f"overwrite: GET /records/{second.id} after the second PUT",
            older=[first.value], others=others,
        )  # fmt: skip
        steps.append("overwrite")

        await in_order(
            [
                put_record(host, ctx, r, step=f"parallel PUT {i + 1}/{len(plan.parallel)}: "
                           f"PUT /records/{r.id}")
                for i, r in enumerate(plan.parallel)
            ]
        )  # fmt: skip
        await in_order(
            [
                read_record(host, ctx, r.id, [r.value], others=others,
                            step=f"parallel GET {i + 1}/{len(plan.parallel)}: GET /records/{r.id}")
                for i, r in enumerate(plan.parallel)
            ]
        )  # fmt: skip
        steps.append("parallel")

        same = plan.same_id
        await in_order(
            [
                put_record(host, ctx, r, concurrent=True,
                           step=f"same-id PUT {i + 1}/{len(same)}: PUT /records/{r.id}")
                for i, r in enumerate(same)
            ]
        )  # fmt: skip
        await read_record(
            host, ctx, same[0].id, [r.value for r in same],
            step=f"same-id: GET /records/{same[0].id} after {len(same)} parallel PUTs",
        )  # fmt: skip
        steps.append("same-id")

        for record_id in plan.unwritten:
            await probe_unwritten(
                host, ctx, record_id, step=f"unwritten: GET /records/{record_id} (never written)"
            )
        steps.append("unwritten")

        # Then a stretch of the fault rounds' own traffic (no fault), so that what a
        # service sees before a fault is what it sees here too.
        tail = plan_traffic(
            seed, ctx.territory, ctx.milestone.id, max(ctx.attempt, 0), "traffic", decoy=True
        )
        await run_decoy(host, ctx, tail, step="traffic: ")
        steps.append("traffic")
        return {
            "record": plan.text.id,
            "value": plan.text.value.decode(),
            "attempt": ctx.attempt,
            "write_ms": write_ms,
            "read_ms": read_ms,
            "steps": steps,
            "bytes_sent": sum(len(r.value) for r in plan.written()),
        }

    return await decide(run())


EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
"""An empty body names no record: it is never reported as another id's value."""


async def reread_ledger(
    host: Host,
    ctx: CheckContext,
    fault: Fault,
    must: set[str],
    *,
    forgiven: Set[str] = frozenset(),
    outcomes: dict[str, str] | None = None,
) -> dict[str, Any]:
    """After `fault`: GET every ledger record (or the bounded, deterministic sample of
    them), then a few ids never written. Every record is read even after a failure (a
    GET that gets no answer does not hide the records found lost beside it), so the
    detail counts and names them all; the attempt then fails with the first lost,
    corrupted or stale record's reason, else with the first probe error's. A record in
    `forgiven` may be lost or stale without failing (a loss the challenge allows, e.g.
    inside a recovery point objective); it is dropped like any other. `outcomes`, when
    given, gets each re-read id's outcome (ok, lost, corrupted, stale, no answer, ...),
    also when this raises. Returns evidence. Raises `Decided`."""
    ledger = ledger_of(ctx)
    pending = pending_of(ctx)
    total = len(ledger.entries)
    seed = workload_seed(ctx)
    entries = ledger.sample(seed, ctx.territory, f"{ctx.milestone.id}:{ctx.attempt}", must)
    others = {h: e.id for e in ledger.entries.values() for h in e.accepted if h != EMPTY_SHA256}
    gate = asyncio.Semaphore(REREAD_PARALLEL)
    failures: list[tuple[str, Decided]] = []
    unanswered: list[tuple[str, Decided]] = []
    counts: dict[str, int] = {}
    seen = outcomes if outcomes is not None else {}
    excused: list[str] = []

    async def reread(entry: Entry) -> None:
        target = f"/records/{entry.id}"
        step = f"{fault.after}, ledger re-read: GET {target}"
        async with gate:
            try:
                response = await request(host, ctx, "GET", target, step=step)
            except Decided as decided:
                counts["no answer"] = counts.get("no answer", 0) + 1
                seen[entry.id] = "no answer"
                unanswered.append((entry.id, decided))
                return
        outcome = classify(entry, response.status, hashlib.sha256(response.body).hexdigest())
        seen[entry.id] = outcome or "bad_status"
        if outcome in ("lost", "stale") and entry.id in forgiven:
            counts[f"{outcome} (allowed)"] = counts.get(f"{outcome} (allowed)", 0) + 1
            pending.forgive(entry.id)
            excused.append(entry.id)
            return
        counts[outcome or "bad_status"] = counts.get(outcome or "bad_status", 0) + 1
        if outcome == "ok":
            pending.count("ok", entry.id)
            return
        if outcome is not None:
            pending.count(outcome, entry.id)
        # The ledger keeps hashes only: a stale body is known by its hash already. The
        # values are regenerated only now, to say how the body differs: a 1 MiB value
        # takes milliseconds, and regenerating every entry re-read was most of the
        # re-read's CPU at 32 territories (docs/PERFORMANCE.md).
        values = [regenerate(seed, dataclasses.replace(s, territory=ctx.territory))
                  for s in entry.slots]  # fmt: skip
        older = [response.body] if outcome == "stale" else []
        verdict = judge_read(
            response, values[0], step=step, also=values[1:], older=older,
            others={h: i for h, i in others.items() if i != entry.id},
            reproduce=curl_line("GET", ctx.challenge.port, target,
                                save=any(not _printable(v) for v in values)),
        )  # fmt: skip
        assert verdict is not None
        failures.append((entry.id, Decided(verdict)))

    await in_order([reread(e) for e in entries])
    if failures or unanswered:
        order = {e.id: i for i, e in enumerate(entries)}
        failures.sort(key=lambda f: order[f[0]])
        unanswered.sort(key=lambda f: order[f[0]])
        first = (failures or unanswered)[0][1].verdict
        tally = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        failing = failures + unanswered
        names = ", ".join(record_id for record_id, _ in failing[:5])
        more = f" and {len(failing) - 5} more" if len(failing) > 5 else ""
        dropped = " (each lost, corrupted or stale one is dropped from the ledger now)"
        detail = (
            f"{fault.after}, the ledger re-read {len(entries)} of {total} records: "
            f"{tally}; failing: {names}{more}{dropped if failures else ''}. "
            f"First: {first.failure_detail}"
        )
        reason = first.failure_reason or "record_corrupted"
        if not failures and first.outcome == "referee_error":
            raise Decided(Verdict.referee_error(reason, detail))
        raise Decided(Verdict.failed(reason, detail))
    for index in range(UNWRITTEN_AFTER_FAULT):
        record_id = unwritten_id(seed, ctx.territory, ctx.milestone.id, ctx.attempt, 100 + index)
        await probe_unwritten(
            host, ctx, record_id, step=f"{fault.after}, GET /records/{record_id} (never written)"
        )
    return {
        "reread": len(entries),
        "ledger_records": total,
        "sampled": len(entries) < total,
        **({"allowed_losses": len(excused)} if excused else {}),
    }


FAULT_ROUNDS = 2
"""Fault rounds in every attempt, all of which must pass. One fault is one sample: a
service lazy for a fraction f of its acks (careful only after some feature of the
traffic, or lazy only for some kind of value) is caught by one round with a chance of
about f, so an attempt takes two."""
CONFIRM_ROUNDS = 3
CONFIRM_MAX = 10
"""Once the territory's service has lost, corrupted or served a stale acknowledged record
anywhere in the match, a fault attempt needs `CONFIRM_ROUNDS` + that many records clean
rounds (at most `CONFIRM_MAX`): a service that loses writes now and then must not pass on
one lucky attempt, and one that keeps losing them must not pass by trying often (the
rounds grow with its losses, so the odds of a lucky pass shrink with every try)."""
MAX_DECOYS = 1
"""At most this many decoy rounds (traffic, no fault) in one attempt."""
ERROR_PAUSE_S = 0.02
"""A lane waits this long after a request that got no answer (during a fault)."""


class _Traffic:
    """One round's traffic (`opsarena.workloads.records.workload.plan_traffic`): its steps in order,
    a step's requests at once. Until the fault begins every answer is judged: a wrong one
    stops the round (the first in plan order is reported). A PUT answered 2xx before the
    fault began enters the ledger at once; from then on only the destructive instant
    (`Host.last_fault_at`, read by `settle`) decides: answered before it, acknowledged;
    later or never, indeterminate. Reads after the fault began are not judged."""

    def __init__(
        self,
        host: Host,
        ctx: CheckContext,
        plan: TrafficPlan,
        *,
        step: str,
        text: Record | None,
    ) -> None:
        self.host, self.ctx, self.plan, self.step, self.text = host, ctx, plan, step, text
        self.seed = workload_seed(ctx)
        self.pending = pending_of(ctx)
        ledger = ledger_of(ctx)
        fresh = {op.id for op in plan.puts()}
        self.olds = sorted(
            (e for e in ledger.entries.values() if e.id not in fresh),
            key=lambda e: hmac.new(self.seed, f"opsarena-old:{step}:{e.id}".encode(),
                                   hashlib.sha256).digest(),
        )  # fmt: skip
        self.others = {
            h: e.id for e in ledger.entries.values() for h in e.accepted if h != EMPTY_SHA256
        }
        self.crashed: list[Exception] = []
        self.ran = 0
        self.acked = 0
        self.stopped = False
        self.fault_began: float | None = None
        self.reached = asyncio.Event()
        self.failures: list[tuple[int, Decided]] = []
        self.late: list[tuple[Record, float | None]] = []
        """PUTs answered (time) or sent without an answer (None) once the fault began."""
        self.acknowledged: list[Record] = []
        self.current: dict[str, Record | None] = {}
        """Id -> its last acknowledged record this round (None: a write without answer)."""
        self.older: dict[str, list[bytes]] = {}

    @property
    def judging(self) -> bool:
        return self.fault_began is None

    def _record(self, op: Op) -> Record:
        assert op.slot is not None
        if self.text is not None and op.slot == self.text.slot:
            return self.text
        return Record(op.slot, op.id, slot_value(self.seed, op.slot))

    async def run(self) -> None:
        """Send the steps in order (a step's requests at once) until the plan ends or
        `stopped`; sets `reached` when the fault is due, a request failed, or at the end."""
        try:
            for index, step in enumerate(self.plan.steps):
                if self.stopped:
                    return
                results = await asyncio.gather(
                    *(self._run(op) for op in step.ops), return_exceptions=True
                )
                self.ran += len(step.ops)
                for result in results:
                    if isinstance(result, Decided):
                        self.failures.append((index, result))
                    elif isinstance(result, BaseException):
                        raise result
                if self.failures:
                    return
                if False in results:  # no answer once the fault began: not so fast
                    await asyncio.sleep(ERROR_PAUSE_S)
                elif step.pause_ms:
                    await asyncio.sleep(step.pause_ms / 1000)
        except Exception as exc:  # a bug of ours: reported by `first_failure`, never hidden
            self.crashed.append(exc)
        finally:
            self.reached.set()

    async def _run(self, op: Op) -> bool:
        """One request; False when it got no answer once the fault began. Raises
        `Decided` for a wrong answer (or none) while answers are judged."""
        judging = self.judging
        try:
            await self._send(op)
        except Decided:
            if judging and self.judging:
                raise
            return False
        return True

    async def _send(self, op: Op) -> None:
        target = f"/records/{op.id}"
        step = f"{self.step}{op.label}: {'PUT' if op.kind == 'put' else 'GET'} {target}"
        if op.kind == "put":
            await self._put(op, target, step)
        elif op.kind == "get":
            await self._get(op, target, step)
        elif op.kind == "old" and self.olds:
            await self._old(self.olds[op.pick % len(self.olds)], step)
        else:
            record_id = op.id or unwritten_id(
                self.seed, self.ctx.territory, self.ctx.milestone.id, self.ctx.attempt,
                2000 + op.pick % 1000,
            )  # fmt: skip
            step = f"{self.step}never written: GET /records/{record_id}"
            await probe_unwritten(self.host, self.ctx, record_id, step=step)

    async def _put(self, op: Op, target: str, step: str) -> None:
        record = self._record(op)
        try:
            response = await request(
                self.host, self.ctx, "PUT", target, body=record.value, step=step
            )
        except Decided as decided:
            if decided.sent:
                self._unanswered(record)
            self.current[op.id] = None
            raise
        except asyncio.CancelledError:
            # The round stopped (`_stop`) with this PUT in flight: it may have reached the
            # service, which may store it, so it counts as written without an answer.
            # Left out, a re-read finding its value would call a correct service corrupt.
            self._unanswered(record)
            self.current[op.id] = None
            raise
        answered = time.monotonic()
        ok = 200 <= response.status < 300
        if self.fault_began is not None:
            # Answered once the fault began: the destructive instant decides (`settle`).
            self.late.append((record, answered if ok else None))
            self.current[op.id] = None
            return
        if not ok:
            raise _not_stored(self.ctx, record, response, step=step)
        self.pending.write(record.id, record.value, record.slot, acknowledged=True)
        previous = self.current.get(op.id)
        if previous is not None and previous.value != record.value:
            self.older.setdefault(op.id, []).append(previous.value)
        self.current[op.id] = record
        self.acknowledged.append(record)
        if record.sha256 != EMPTY_SHA256:
            self.others[record.sha256] = record.id
        self.acked += 1
        if self.plan.fault_after and self.acked >= self.plan.fault_after:
            # A hushed round sends nothing more: the fault lands on this write with no
            # later request to prompt the service (requests of its step still in flight
            # go on).
            self.stopped = self.stopped or self.plan.hush
            self.reached.set()

    def _unanswered(self, record: Record) -> None:
        """`record` was sent and got no answer: indeterminate (settled with the other
        late writes once the fault began)."""
        if self.fault_began is not None:
            self.late.append((record, None))
        else:
            self.pending.write(record.id, record.value, record.slot, acknowledged=False)

    async def _get(self, op: Op, target: str, step: str) -> None:
        expected = self.current.get(op.id)
        response = await request(self.host, self.ctx, "GET", target, step=step)
        if not self.judging or expected is None:
            return
        verdict = judge_read(
            response, expected.value, step=step, older=self.older.get(op.id, []),
            others={h: i for h, i in self.others.items() if i != op.id},
            reproduce=curl_line("GET", self.ctx.challenge.port, target,
                                save=not _printable(expected.value)),
        )  # fmt: skip
        outcome = "ok" if verdict is None else _outcome_of(verdict.failure_reason)
        if outcome is not None:
            self.pending.count(outcome, op.id)
        if verdict is not None:
            raise Decided(verdict)

    async def _old(self, entry: Entry, step: str) -> None:
        target = f"/records/{entry.id}"
        step = f"{self.step}older record: GET {target}"
        response = await request(self.host, self.ctx, "GET", target, step=step)
        if not self.judging or entry.id not in ledger_of(self.ctx).entries:
            return
        outcome = classify(entry, response.status, hashlib.sha256(response.body).hexdigest())
        if outcome == "ok":
            self.pending.count("ok", entry.id)
            return
        if outcome is not None:
            self.pending.count(outcome, entry.id)
        values = [regenerate(self.seed, dataclasses.replace(s, territory=self.ctx.territory))
                  for s in entry.slots]  # fmt: skip
        verdict = judge_read(
            response, values[0], step=step, also=values[1:],
            older=[response.body] if outcome == "stale" else [],
            others={h: i for h, i in self.others.items() if i != entry.id},
            reproduce=curl_line("GET", self.ctx.challenge.port, target,
                                save=any(not _printable(v) for v in values)),
        )  # fmt: skip
        assert verdict is not None
        raise Decided(verdict)

    def first_failure(self) -> Decided | None:
        if self.crashed:
            raise self.crashed[0]
        return min(self.failures, key=lambda f: f[0])[1] if self.failures else None

    def settle(self, cutoff: float) -> tuple[int, int]:
        """Put the PUTs answered or sent once the fault began into the ledger:
        acknowledged when answered before `cutoff`, else indeterminate. Returns
        (acknowledged before the cutoff in all, indeterminate)."""
        late = 0
        indeterminate = 0
        for record, answered in self.late:
            sure = answered is not None and answered < cutoff
            self.pending.write(record.id, record.value, record.slot, acknowledged=sure)
            late += sure
            indeterminate += not sure
        self.late.clear()
        return len(self.acknowledged) + late, indeterminate

    def ids(self) -> set[str]:
        return {op.id for op in self.plan.puts()}


async def _stop(traffic: _Traffic, task: asyncio.Task[None]) -> None:
    traffic.stopped = True
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def run_decoy(host: Host, ctx: CheckContext, plan: TrafficPlan, *, step: str,
                    text: Record | None = None) -> int:  # fmt: skip
    """Run `plan`'s traffic with no fault, every answer judged; returns the operations
    run. Raises `Decided` with the first failure in plan order."""
    traffic = _Traffic(host, ctx, plan, step=step, text=text)
    await traffic.run()
    if (failure := traffic.first_failure()) is not None:
        raise failure
    return traffic.ran


async def _fault_round(
    host: Host, ctx: CheckContext, fault: Fault, plan: TrafficPlan, text: Record | None
) -> dict[str, Any]:
    """One round: the seeded traffic starts; once its `plan.fault_after`-th PUT is
    acknowledged, `fault` is injected while the traffic goes on (or, in a hushed round,
    with nothing more sent: `TrafficPlan.hush`); then wait for health,
    check who holds the port (processes started after the fault began), and re-read the
    ledger (every record written in this round among it). Returns evidence; raises
    `Decided`."""
    before = f"before the {fault.name}, "
    traffic = _Traffic(host, ctx, plan, step=before, text=text)
    since = host.clock_ticks()
    began = time.monotonic()
    task = asyncio.create_task(traffic.run())
    fault_ms = 0
    try:
        await traffic.reached.wait()
        if (failure := traffic.first_failure()) is not None:
            raise failure
        traffic.fault_began = time.monotonic()
        fault_ms = await inject(host, ctx, fault)
    finally:
        await _stop(traffic, task)
        at = host.last_fault_at
        # No destructive step after the traffic began: every answer came before any fault.
        cutoff = at if at is not None and at >= began else float("inf")
        acknowledged, indeterminate = traffic.settle(cutoff)
    ready_ms = await wait_healthy(host, ctx, fault)
    step = f"{fault.after}, owner of port {ctx.challenge.port}"
    if owned := await port_ownership_verdict(host, ctx, step=step, since=since, fault=fault.name):
        raise Decided(owned)
    started = time.monotonic()
    reread = await reread_ledger(host, ctx, fault, traffic.ids())
    return {
        fault.name: True,
        "attempt": ctx.attempt,
        "fault_ms": fault_ms,
        "ready_ms": ready_ms,
        "read_ms": int((time.monotonic() - started) * 1000),
        "traffic_ops": traffic.ran,
        "fault_after_acknowledged": plan.fault_after,
        "hushed": plan.hush,
        "acknowledged_before_fault": acknowledged,
        "indeterminate": indeterminate,
        **reread,
    }


def rounds_needed(summary: LedgerSummary) -> int:
    """Fault rounds the next attempt needs (`FAULT_ROUNDS`, `CONFIRM_ROUNDS`). Pure."""
    bad = summary.lost + summary.corrupted + summary.stale
    return FAULT_ROUNDS if bad == 0 else min(CONFIRM_MAX, CONFIRM_ROUNDS + bad)


async def _durability(host: Host, ctx: CheckContext, fault: Fault) -> Verdict:
    async def run() -> dict[str, Any]:
        rounds = rounds_needed(ledger_of(ctx).summary)
        seed = workload_seed(ctx)
        text = text_record(ctx, Slot(ctx.territory, ctx.milestone.id, ctx.attempt, "text"))
        evidence: dict[str, Any] = {}
        decoys = faults = 0
        while faults < rounds:
            name = f"round-{faults + decoys + 1}"
            plan = plan_traffic(
                seed, ctx.territory, ctx.milestone.id, ctx.attempt, name,
                text=text.slot if faults + decoys == 0 else None,
                decoy=None if decoys < MAX_DECOYS else False,
            )  # fmt: skip
            first = text if faults + decoys == 0 else None
            if plan.fault_after == 0:
                await run_decoy(host, ctx, plan, step=f"before the {fault.name}, ", text=first)
                decoys += 1
                continue
            evidence = await _fault_round(host, ctx, fault, plan, first)
            faults += 1
        return {
            "record": text.id, "value": text.value.decode(), **evidence,
            "rounds": rounds, "decoys": decoys,
        }  # fmt: skip

    return await decide(run())


def _fault_of(check: str, ctx: CheckContext) -> Fault:
    return get_fault(milestone_fault(check, ctx.milestone.fault) or "")


@register_check("restart-durability", fault="restart")
async def check_restart_durability(host: Host, ctx: CheckContext) -> Verdict:
    """Write and read a fresh record, inject the milestone's fault (default: restart the
    unit), wait for health within the budget, re-read the whole ledger and probe ids
    never written. Evidence: record, value, `"restart": true`, reread counts."""
    return await _durability(host, ctx, _fault_of("restart-durability", ctx))


@register_check("reboot-durability", fault="reboot")
async def check_reboot_durability(host: Host, ctx: CheckContext) -> Verdict:
    """As restart-durability, around a reboot of the host. Evidence: `"reboot": true`."""
    return await _durability(host, ctx, _fault_of("reboot-durability", ctx))


@register_check("fault-durability")
async def check_fault_durability(host: Host, ctx: CheckContext) -> Verdict:
    """As restart-durability, around the fault the milestone names (`fault = "..."`; a
    milestone of this check without one is refused at match start)."""
    return await _durability(host, ctx, get_fault(ctx.milestone.fault or ""))
