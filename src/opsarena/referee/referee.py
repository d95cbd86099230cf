"""The referee of one match: evaluates milestones per territory, injects faults, emits events.

For every territory it evaluates the first unpassed milestone at the challenge's cadence,
in order; the territories run concurrently, so a reboot in one never delays another. A
passed milestone stays passed with its evidence. Every attempt is reported through
`emit` as `attempt_started` then `attempt_result` (plus `milestone_passed`,
`fault_injected`, `host_state` and `ledger_update` as they happen), in the match's event
vocabulary. Each territory keeps a durability ledger (`opsarena.ledger`) that
changes only through the `ledger_update` it emits, so it can be rebuilt from the log
(`restore_ledger`). A fault milestone failing again and again backs off (`retry_delay`).

Whose fault: `failed` verdicts (category `verification_failed`) are the competitor's and
are answered by another attempt at the cadence; `referee_error` verdicts (host or podman
failures, a fault that could not be confirmed, any exception in a check) award nothing,
take nothing away, are counted in `infrastructure_failures`, and the milestone is
attempted again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opsarena.errors import HostError
from opsarena.hosts import Host
from opsarena.ledger import Ledger, LedgerSummary, LedgerUpdate, Pending
from opsarena.referee.contract import (
    Check,
    CheckContext,
    FaultKind,
    Verdict,
    get_check,
    load_checks_module,
)
from opsarena.referee.failures import REASONS, Reason, describe_error, table_for
from opsarena.referee.model import Challenge, Milestone
from opsarena.referee.nemesis import get_fault, milestone_fault, run_fault
from opsarena.text import escape_unencodable, storable

log = logging.getLogger(__name__)

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
Clock = Callable[[], int]
Hold = Callable[[], contextlib.AbstractAsyncContextManager[None]]
"""What the referee enters around a fault attempt (the competitor's operations wait)."""

PREFLIGHT_LOOKS = 3
PREFLIGHT_GAP_S = 1.0
"""The preflight looks at a fresh host this many times, this far apart."""

VERIFY_REFEREE_ERROR_RETRIES = 2
"""`verify` repeats a milestone at most this many more times after a referee_error."""

BACKOFF_AFTER = 3
"""A fault milestone failing this many times in a row starts backing off."""
BACKOFF_CAP_S = 5.0
"""The back-off never waits longer than this between attempts."""


def retry_delay(cadence_s: float, consecutive_failures: int, *, fault: bool) -> float:
    """Seconds from the start of a failed attempt to the start of the next one. Pure.

    The cadence, except for a milestone that injects a fault and has failed
    `BACKOFF_AFTER` or more times in a row: then the cadence doubles with each further
    failure (2x, 4x, ...), capped at `BACKOFF_CAP_S` (never below the cadence). The same
    rule for every competitor; a pass, or any other milestone, resets nothing else."""
    if not fault or consecutive_failures < BACKOFF_AFTER:
        return cadence_s
    factor = 2.0 ** (consecutive_failures - BACKOFF_AFTER + 1)
    return max(cadence_s, min(BACKOFF_CAP_S, cadence_s * factor))


@dataclass
class MilestoneState:
    """Where one territory stands on one milestone."""

    attempts: int = 0
    passed: bool = False
    points: int = 0
    evidence: dict[str, Any] | None = None
    passed_at_ms: int | None = None
    last: Verdict | None = None
    consecutive_failures: int = 0
    next_delay_s: float | None = None


@dataclass
class TerritoryState:
    host: Host
    milestones: dict[str, MilestoneState]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    durable: asyncio.Event = field(default_factory=asyncio.Event)
    durable_at_ms: int | None = None
    referee_errors: int = 0
    ledger: Ledger = field(default_factory=Ledger)
    stopped: bool = False
    """Judging of this territory is over (its settle window ended): no attempt starts."""
    hold: Hold | None = None
    """Entered around every attempt of a milestone that injects a fault: the competitor's
    own handle on the host waits meanwhile (`ThrottledHost.held`)."""
    judging_failed: str | None = None
    """Why judging ended by the referee's own failure (`judging_stopped` referee_error)."""


@dataclass
class _Judged:
    """How far one attempt got: its check's duration, and its verdict once logged."""

    duration_ms: int = 0
    logged: Verdict | None = None


DETAIL_CHARS = 1000
"""A referee error's detail (the exception that ended an attempt or a territory's
judging) is cut to this many characters."""


def _bounded(detail: str) -> str:
    """`detail` escaped (`escape_unencodable`) and cut to `DETAIL_CHARS`. Pure."""
    detail = escape_unencodable(detail)
    return detail if len(detail) <= DETAIL_CHARS else detail[: DETAIL_CHARS - 3] + "..."


@dataclass(frozen=True)
class PreflightResult:
    """`ok` when the fresh host FAILS the first milestone (as it must); `detail` says what
    was seen, in one line, for the `preflight` event."""

    ok: bool
    detail: str
    verdict: Verdict


def enforce_table(verdict: Verdict, table: Mapping[str, Reason] = REASONS) -> Verdict:
    """`verdict` when its failure_reason is a row of the failure table (`table`: the
    challenge's, see `table_for`) whose category matches the outcome; otherwise a
    referee_error `internal_error` saying so. Pure."""
    if verdict.outcome == "passed":
        return verdict
    row = table.get(verdict.failure_reason or "")
    if row is None or row.category != verdict.failure_category:
        return Verdict.referee_error(
            "internal_error",
            f"a check ended {verdict.outcome} with reason {verdict.failure_reason!r}, which is "
            f"not a {verdict.failure_category} row of the failure table: "
            f"{verdict.failure_detail}",
        )
    return verdict


class Referee:
    """Judges every territory of one match against `challenge`.

    `seed` keys the record derivation (HMAC). `emit(type, data)` records one event; the
    referee awaits it and never emits `preflight` (the controller does, from
    `preflight()`'s result). `clock()` is ms since the match clock started; it stamps
    `passed_at_ms` and `durable_at_ms`. Raises `ChallengeError` when a milestone names
    a check that is not registered.
    """

    def __init__(self, challenge: Challenge, *, seed: bytes, emit: Emit, clock: Clock) -> None:
        if not seed:
            raise ValueError("the match seed must not be empty")
        self.challenge = challenge
        self.seed = seed
        self.emit = emit
        self.clock = clock
        load_checks_module(challenge.checks_module)
        self._checks: dict[str, Check] = {m.id: get_check(m.check) for m in challenge.milestones}
        self._territories: dict[str, TerritoryState] = {}
        self.any_durable = asyncio.Event()
        """Set when the first territory becomes durable (every milestone passed)."""
        self.durable_order: list[str] = []
        self.infrastructure_failures = 0
        """How many attempts ended in referee_error, over all territories."""
        self._running = False

    # ---- territories and their state -------------------------------------------------

    def add_territory(self, territory: str, host: Host, *, hold: Hold | None = None) -> None:
        """Judge `host` as `territory`. Must be called before `run()`; a territory added
        twice is a bug (`ValueError`). `hold`, when given, is entered around each attempt
        of a milestone that injects a fault (the controller pauses the competitor's own
        operations on the host meanwhile)."""
        if territory in self._territories:
            raise ValueError(f"territory {territory!r} was added already")
        if self._running:
            raise RuntimeError("add every territory before run() starts")
        self._territories[territory] = TerritoryState(
            host=host,
            milestones={m.id: MilestoneState() for m in self.challenge.milestones},
            hold=hold,
        )

    @property
    def territories(self) -> list[str]:
        return list(self._territories)

    def _state(self, territory: str) -> TerritoryState:
        try:
            return self._territories[territory]
        except KeyError:
            raise KeyError(f"unknown territory {territory!r}") from None

    def milestone_state(self, territory: str, milestone: str) -> MilestoneState:
        return self._state(territory).milestones[milestone]

    def first_unpassed(self, territory: str) -> Milestone | None:
        """The milestone this territory is evaluated on next; None once durable."""
        states = self._state(territory).milestones
        return next((m for m in self.challenge.milestones if not states[m.id].passed), None)

    def points(self, territory: str) -> int:
        return sum(s.points for s in self._state(territory).milestones.values())

    def is_durable(self, territory: str) -> bool:
        return self._state(territory).durable.is_set()

    def durable_at_ms(self, territory: str) -> int | None:
        return self._state(territory).durable_at_ms

    def durable_event(self, territory: str) -> asyncio.Event:
        """Set once every milestone of `territory` has passed."""
        return self._state(territory).durable

    def referee_errors(self, territory: str) -> int:
        return self._state(territory).referee_errors

    def restore(
        self,
        territory: str,
        milestone: str,
        *,
        attempts: int,
        passed: bool,
        points: int,
        evidence: dict[str, Any] | None,
        passed_at_ms: int | None,
    ) -> None:
        """Take up where an earlier referee of this match stopped (`opsarena resume`):
        one milestone's attempts so far and, if it passed, its points and evidence. The
        next attempt gets the next number, so record ids never repeat. Call in milestone
        order, before `run()`."""
        state = self._state(territory)
        mstate = state.milestones[milestone]
        mstate.attempts = attempts
        if passed:
            mstate.passed, mstate.points, mstate.evidence = True, points, evidence
            mstate.passed_at_ms = passed_at_ms
            if self.first_unpassed(territory) is None and not state.durable.is_set():
                state.durable_at_ms = passed_at_ms
                self.durable_order.append(territory)
                state.durable.set()
                self.any_durable.set()

    # ---- evaluation -------------------------------------------------------------------

    async def preflight(
        self, territory: str, *, looks: int = PREFLIGHT_LOOKS, gap_s: float = PREFLIGHT_GAP_S
    ) -> PreflightResult:
        """Run the first milestone's check on the fresh host `looks` times, `gap_s` apart
        (attempt 0, no events, no faults): a service the image starts at boot may take a
        moment to listen, and must still be caught. `ok` only when every look FAILS: a
        host that passes once, or that could not be checked (referee_error), must not
        start a match."""
        milestone = self.challenge.milestones[0]
        for look in range(looks):
            if look:
                await asyncio.sleep(gap_s)
            verdict = await self._run_check(territory, milestone, attempt=0, faults=False)
            if verdict.outcome != "failed":
                break
        if verdict.outcome == "failed":
            return PreflightResult(
                True,
                f"the fresh host fails {milestone.id} as required "
                f"({verdict.failure_reason}: {verdict.failure_detail})",
                verdict,
            )
        if verdict.outcome == "passed":
            return PreflightResult(
                False,
                f"the fresh host already passes {milestone.id} (evidence {verdict.evidence}) "
                f"before any competitor acted: the challenge {self.challenge.name!r} or its "
                f"image {self.challenge.image!r} is broken; fix it before starting a match",
                verdict,
            )
        return PreflightResult(
            False,
            f"the referee could not check the fresh host on {milestone.id} "
            f"({verdict.failure_reason}: {verdict.failure_detail}); retry or replace the host",
            verdict,
        )

    async def evaluate_next(self, territory: str) -> Verdict | None:
        """One attempt at the territory's first unpassed milestone, with its events.
        Returns the verdict, or None when the territory is durable already."""
        state = self._state(territory)
        async with state.lock:
            milestone = self.first_unpassed(territory)
            if milestone is None or state.stopped:
                return None
            return await self._attempt(territory, milestone)

    async def stop_judging(self, territory: str, *, unless_passed_beyond: int) -> bool:
        """End judging of `territory`: waits for an attempt in flight to run to its end,
        then no further attempt starts; returns True. When by then more than
        `unless_passed_beyond` milestones have passed, judging goes on: returns False."""
        state = self._state(territory)
        async with state.lock:
            if sum(m.passed for m in state.milestones.values()) > unless_passed_beyond:
                return False
            state.stopped = True
            return True

    def ledger_summary(self, territory: str) -> LedgerSummary:
        return self._state(territory).ledger.summary.model_copy()

    def restore_ledger(self, territory: str, updates: list[LedgerUpdate]) -> None:
        """Rebuild `territory`'s ledger from its logged updates (`opsarena resume`), in
        log order, exactly as the fold does."""
        ledger = self._state(territory).ledger
        for update in updates:
            ledger.apply(update)

    async def run(self) -> None:
        """Evaluate every territory at the cadence until cancelled (or until every
        territory is durable, when it returns). After a pass the next milestone is
        attempted at once (faults come as soon as earlier milestones pass); after a
        failure or referee_error, the next attempt starts one cadence after the last
        one started. An attempt cut off by cancellation emits no attempt_result."""
        self._running = True
        tasks = [
            asyncio.create_task(self._territory_loop(t), name=f"referee-{t}")
            for t in self._territories
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*tasks, return_exceptions=True)
            self._running = False

    async def _territory_loop(self, territory: str) -> None:
        """Judge `territory` at the cadence. Its loop dying (an error the attempt's own
        handler could not log, say) ends this territory's judging as a referee error,
        logged as `judging_stopped`; never the match, never another territory's judging.
        Cancellation goes through."""
        try:
            await self._judge_at_cadence(territory)
        except Exception as exc:
            log.exception("judging %s failed: its judging ends", territory)
            await self._judging_failed(territory, exc)

    async def _judge_at_cadence(self, territory: str) -> None:
        cadence = self.challenge.cadence_s
        while True:
            started = time.monotonic()
            verdict = await self.evaluate_next(territory)
            if verdict is None:
                return
            if verdict.outcome == "passed":
                continue
            milestone = self.first_unpassed(territory)
            delay = cadence
            if milestone is not None:
                delay = self.milestone_state(territory, milestone.id).next_delay_s or cadence
            await asyncio.sleep(max(0.0, started + delay - time.monotonic()))

    async def _judging_failed(self, territory: str, exc: Exception) -> None:
        state = self._state(territory)
        state.stopped = True
        state.referee_errors += 1
        self.infrastructure_failures += 1
        state.judging_failed = _bounded(
            f"the referee could not go on judging {territory}: {describe_error(exc)}"
        )
        try:
            await self.emit(
                "judging_stopped",
                {"territory": territory, "reason": "referee_error", "detail": state.judging_failed},
            )
        except Exception:
            log.exception("logging the end of %s's judging failed", territory)

    def judging_failed(self, territory: str) -> str | None:
        """Why the referee stopped judging `territory` by its own failure; None if it
        did not (its judging goes on, or ended by the settle window or durability)."""
        return self._state(territory).judging_failed

    async def verify(self, territory: str) -> bool:
        """One immediate evaluation pass (for tools and tests; a match uses the settle
        window instead):
        attempts the first unpassed milestone and, while they pass, the next ones (with
        their faults). A referee_error is retried up to `VERIFY_REFEREE_ERROR_RETRIES`
        times. Returns True when at least one milestone newly passed."""
        changed = False
        retries = 0
        while True:
            verdict = await self.evaluate_next(territory)
            if verdict is None:
                return changed
            if verdict.outcome == "passed":
                changed = True
                continue
            if verdict.outcome == "referee_error" and retries < VERIFY_REFEREE_ERROR_RETRIES:
                retries += 1
                continue
            return changed

    async def _attempt(self, territory: str, milestone: Milestone) -> Verdict:
        """One attempt with its events. Judging it, logging its result included, sits in
        one handler: any exception (a bug, an answer the log refuses) becomes a
        referee_error for this territory, logged as its `attempt_result`, so one hostile
        answer can neither end the match nor leave the attempt without a result."""
        state = self._state(territory)
        mstate = state.milestones[milestone.id]
        mstate.attempts += 1
        attempt = mstate.attempts
        ids = {"territory": territory, "milestone": milestone.id, "attempt": attempt}
        await self.emit("attempt_started", dict(ids))
        judged = _Judged()
        try:
            return await self._judge(territory, milestone, ids, judged)
        except Exception as exc:
            log.exception("judging %s attempt %d on %s failed", milestone.id, attempt, territory)
            if judged.logged is not None:
                return judged.logged  # its result is in the log: only a later step failed
            verdict = Verdict.referee_error(
                "internal_error",
                _bounded(f"judging {milestone.id} attempt {attempt} raised {describe_error(exc)}"),
            )
            self._count(territory, milestone, verdict)
            await self.emit(
                "attempt_result",
                {
                    **ids,
                    "verdict": verdict.outcome,
                    "points": 0,
                    "evidence": None,
                    "failure_category": verdict.failure_category,
                    "failure_reason": verdict.failure_reason,
                    "failure_detail": verdict.failure_detail,
                    "duration_ms": judged.duration_ms,
                },
            )
            return verdict

    def _count(self, territory: str, milestone: Milestone, verdict: Verdict) -> Verdict:
        """Account for one attempt's verdict in the territory's state (errors, the run of
        failures, the back-off); returns the verdict as it is to be logged."""
        verdict, failures, delay = self._with_backoff(territory, milestone, verdict)
        self._note(territory, milestone, verdict, failures, delay)
        return verdict

    def _with_backoff(
        self, territory: str, milestone: Milestone, verdict: Verdict
    ) -> tuple[Verdict, int, float | None]:
        """The verdict as it is logged (a back-off says so), the run of failures it makes
        and the delay before the next attempt when longer than the cadence. Changes
        nothing: the state changes once the result is logged (`_note`)."""
        mstate = self._state(territory).milestones[milestone.id]
        if verdict.outcome == "passed":
            return verdict, 0, None
        failures = mstate.consecutive_failures + 1
        is_fault = milestone_fault(milestone.check, milestone.fault) is not None
        delay = retry_delay(self.challenge.cadence_s, failures, fault=is_fault)
        if delay <= self.challenge.cadence_s:
            return verdict, failures, None
        verdict = dataclasses.replace(
            verdict,
            failure_detail=f"{verdict.failure_detail}; failed {failures} times in a row: the "
            f"next attempt starts {delay:g} s after this one started (back-off)",
        )
        return verdict, failures, delay

    def _note(
        self,
        territory: str,
        milestone: Milestone,
        verdict: Verdict,
        failures: int,
        delay: float | None,
    ) -> None:
        state = self._state(territory)
        mstate = state.milestones[milestone.id]
        if verdict.outcome == "referee_error":
            state.referee_errors += 1
            self.infrastructure_failures += 1
        mstate.consecutive_failures, mstate.next_delay_s, mstate.last = failures, delay, verdict

    async def _judge(
        self, territory: str, milestone: Milestone, ids: dict[str, Any], judged: _Judged
    ) -> Verdict:
        state = self._state(territory)
        mstate = state.milestones[milestone.id]
        attempt = mstate.attempts
        started = time.monotonic()
        pending = Pending(territory, milestone.id, attempt, state.ledger)
        verdict = await self._run_check(
            territory, milestone, attempt=attempt, faults=True, pending=pending
        )
        judged.duration_ms = duration_ms = int((time.monotonic() - started) * 1000)
        # What the host showed is logged as text the log can always hold.
        verdict = dataclasses.replace(
            verdict,
            evidence=storable(verdict.evidence),
            failure_detail=(
                None if verdict.failure_detail is None
                else escape_unencodable(verdict.failure_detail)
            ),
        )  # fmt: skip
        passed = verdict.outcome == "passed"
        points = milestone.points if passed else 0
        verdict, failures, delay = self._with_backoff(territory, milestone, verdict)
        update = pending.update()
        if not update.empty:
            await self.emit("ledger_update", update.model_dump(mode="json"))
            state.ledger.apply(update, writes=False)
        await self.emit(
            "attempt_result",
            {
                **ids,
                "verdict": verdict.outcome,
                "points": points,
                "evidence": verdict.evidence,
                "failure_category": verdict.failure_category,
                "failure_reason": verdict.failure_reason,
                "failure_detail": verdict.failure_detail,
                "duration_ms": duration_ms,
            },
        )
        judged.logged = verdict
        self._note(territory, milestone, verdict, failures, delay)
        if passed:
            mstate.passed, mstate.points, mstate.evidence = True, points, verdict.evidence
            mstate.passed_at_ms = self.clock()
            if self.first_unpassed(territory) is None:
                state.durable_at_ms = mstate.passed_at_ms
                self.durable_order.append(territory)
                state.durable.set()
                self.any_durable.set()
            await self.emit(
                "milestone_passed",
                {
                    "territory": territory,
                    "milestone": milestone.id,
                    "points": points,
                    "evidence": verdict.evidence,
                    "attempt": attempt,
                },
            )
        return verdict

    async def _run_check(
        self,
        territory: str,
        milestone: Milestone,
        *,
        attempt: int,
        faults: bool,
        pending: Pending | None = None,
    ) -> Verdict:
        state = self._state(territory)

        async def inject_fault(kind: FaultKind) -> int:
            if not faults:
                raise RuntimeError("a preflight never injects faults")
            return await self._inject_fault(territory, milestone.id, attempt, kind)

        ctx = CheckContext(
            challenge=self.challenge,
            milestone=milestone,
            territory=territory,
            attempt=attempt,
            inject_fault=inject_fault,
            seed=self.seed,
            # A preflight works on a throw-away ledger: nothing it wrote is ever judged.
            ledger=state.ledger if pending is not None else Ledger(),
            pending=pending or Pending(territory, milestone.id, 1, None),
        )
        faulty = milestone_fault(milestone.check, milestone.fault) is not None
        try:
            if faults and faulty and state.hold is not None:
                async with state.hold():
                    verdict = await self._checks[milestone.id](state.host, ctx)
            else:
                verdict = await self._checks[milestone.id](state.host, ctx)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the referee itself is being stopped: the attempt is cut off
            # A cancellation nobody asked this task for leaked out of a check (an inner
            # timeout's race under load): the attempt still gets its result, as ours.
            log.warning("a stray cancellation ended check %s on %s", milestone.check, territory)
            verdict = Verdict.referee_error(
                "internal_error", f"check {milestone.check} was cancelled from inside"
            )
        except Exception as exc:
            log.exception("check %s failed on %s", milestone.check, territory)
            verdict = Verdict.referee_error(
                "internal_error", f"check {milestone.check} raised {describe_error(exc)}"
            )
        return enforce_table(verdict, table_for(self.challenge))

    async def _inject_fault(
        self, territory: str, milestone: str, attempt: int, kind: FaultKind
    ) -> int:
        host = self._state(territory).host
        configured = self.challenge.milestone(milestone)
        fault = get_fault(kind)
        if milestone_fault(configured.check, configured.fault) == kind:
            fault = fault.with_params(configured.params)
        ids = {"territory": territory, "milestone": milestone, "attempt": attempt, "fault": kind}
        if fault.host_state is not None:
            await self.emit("host_state", {"territory": territory, "state": fault.host_state})
        started = time.monotonic()
        try:
            async with asyncio.timeout(fault.timeout_s + 10.0):
                run = await run_fault(fault, host, self.challenge.unit)
        except Exception as exc:
            duration_ms = int((time.monotonic() - started) * 1000)
            await self.emit(
                "fault_injected",
                {**ids, "ok": False, "detail": describe_error(exc), "duration_ms": duration_ms},
            )
            if fault.host_state is not None:
                await self.emit(
                    "host_state",
                    {
                        "territory": territory,
                        "state": await self._state_after_failed_reboot(host),
                    },
                )
            raise
        duration_ms = int((time.monotonic() - started) * 1000)
        await self.emit(
            "fault_injected",
            {**ids, "ok": True, "detail": run.detail, "duration_ms": duration_ms},
        )
        if fault.host_state is not None:
            await self.emit("host_state", {"territory": territory, "state": "ready"})
        return duration_ms

    @staticmethod
    async def _state_after_failed_reboot(host: Host) -> str:
        try:
            await host.wait_ready(5.0)
        except HostError:
            return "lost"
        return "ready"
