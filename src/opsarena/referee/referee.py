"""The referee of one match: evaluates milestones per territory, injects faults, emits events.

For every territory it evaluates the first unpassed milestone at the challenge's cadence,
in order; the territories run concurrently, so a reboot in one never delays another. A
passed milestone stays passed with its evidence. Every attempt is reported through
`emit` as `attempt_started` then `attempt_result` (plus `milestone_passed`,
`fault_injected` and `host_state` as they happen), in the match's event vocabulary.

Whose fault: `failed` verdicts (category `verification_failed`) are the competitor's and
are answered by another attempt at the cadence; `referee_error` verdicts (host or podman
failures, a fault that could not be confirmed, any exception in a check) award nothing,
take nothing away, are counted in `infrastructure_failures`, and the milestone is
attempted again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from opsarena.challenges.checks import (
    Check,
    CheckContext,
    FaultKind,
    Verdict,
    get_check,
    load_checks_module,
)
from opsarena.challenges.model import Challenge, Milestone
from opsarena.errors import HostBootError, HostError
from opsarena.hosts import Host
from opsarena.referee.checks import FAULT_TIMEOUT_S
from opsarena.referee.failures import REASONS, describe_error
from opsarena.referee.records import derive_record

log = logging.getLogger(__name__)

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
Clock = Callable[[], int]

PREFLIGHT_LOOKS = 3
PREFLIGHT_GAP_S = 1.0
"""The preflight looks at a fresh host this many times, this far apart."""

VERIFY_REFEREE_ERROR_RETRIES = 2
"""`verify` repeats a milestone at most this many more times after a referee_error."""


@dataclass
class MilestoneState:
    """Where one territory stands on one milestone."""

    attempts: int = 0
    passed: bool = False
    points: int = 0
    evidence: dict[str, Any] | None = None
    passed_at_ms: int | None = None
    last: Verdict | None = None


@dataclass
class TerritoryState:
    host: Host
    milestones: dict[str, MilestoneState]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    durable: asyncio.Event = field(default_factory=asyncio.Event)
    durable_at_ms: int | None = None
    referee_errors: int = 0


@dataclass(frozen=True)
class PreflightResult:
    """`ok` when the fresh host FAILS the first milestone (as it must); `detail` says what
    was seen, in one line, for the `preflight` event."""

    ok: bool
    detail: str
    verdict: Verdict


def enforce_table(verdict: Verdict) -> Verdict:
    """`verdict` when its failure_reason is a row of the failure table whose category
    matches the outcome; otherwise a referee_error `internal_error` saying so. Pure."""
    if verdict.outcome == "passed":
        return verdict
    row = REASONS.get(verdict.failure_reason or "")
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

    def add_territory(self, territory: str, host: Host) -> None:
        """Judge `host` as `territory`. Must be called before `run()`; a territory added
        twice is a bug (`ValueError`)."""
        if territory in self._territories:
            raise ValueError(f"territory {territory!r} was added already")
        if self._running:
            raise RuntimeError("add every territory before run() starts")
        self._territories[territory] = TerritoryState(
            host=host, milestones={m.id: MilestoneState() for m in self.challenge.milestones}
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
            if milestone is None:
                return None
            return await self._attempt(territory, milestone)

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
        cadence = self.challenge.cadence_s
        while True:
            started = time.monotonic()
            verdict = await self.evaluate_next(territory)
            if verdict is None:
                return
            if verdict.outcome == "passed":
                continue
            await asyncio.sleep(max(0.0, started + cadence - time.monotonic()))

    async def verify(self, territory: str) -> bool:
        """One immediate evaluation pass (final verification after an agent ended):
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
        state = self._state(territory)
        mstate = state.milestones[milestone.id]
        mstate.attempts += 1
        attempt = mstate.attempts
        ids = {"territory": territory, "milestone": milestone.id, "attempt": attempt}
        await self.emit("attempt_started", dict(ids))
        started = time.monotonic()
        verdict = await self._run_check(territory, milestone, attempt=attempt, faults=True)
        duration_ms = int((time.monotonic() - started) * 1000)
        mstate.last = verdict
        passed = verdict.outcome == "passed"
        points = milestone.points if passed else 0
        if verdict.outcome == "referee_error":
            state.referee_errors += 1
            self.infrastructure_failures += 1
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
        if passed:
            mstate.passed, mstate.points, mstate.evidence = True, points, verdict.evidence
            mstate.passed_at_ms = self.clock()
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
            if self.first_unpassed(territory) is None:
                state.durable_at_ms = mstate.passed_at_ms
                self.durable_order.append(territory)
                state.durable.set()
                self.any_durable.set()
        return verdict

    async def _run_check(
        self, territory: str, milestone: Milestone, *, attempt: int, faults: bool
    ) -> Verdict:
        state = self._state(territory)
        record_id, record_value = derive_record(self.seed, territory, milestone.id, attempt)

        async def inject_fault(kind: FaultKind) -> int:
            if not faults:
                raise RuntimeError("a preflight never injects faults")
            return await self._inject_fault(territory, milestone.id, attempt, kind)

        ctx = CheckContext(
            challenge=self.challenge,
            milestone=milestone,
            territory=territory,
            attempt=attempt,
            record_id=record_id,
            record_value=record_value,
            inject_fault=inject_fault,
        )
        try:
            verdict = await self._checks[milestone.id](state.host, ctx)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("check %s failed on %s", milestone.check, territory)
            verdict = Verdict.referee_error(
                "internal_error", f"check {milestone.check} raised {describe_error(exc)}"
            )
        return enforce_table(verdict)

    async def _inject_fault(
        self, territory: str, milestone: str, attempt: int, kind: FaultKind
    ) -> int:
        host = self._state(territory).host
        unit = self.challenge.unit
        ids = {"territory": territory, "milestone": milestone, "attempt": attempt, "fault": kind}
        if kind == "reboot":
            await self.emit("host_state", {"territory": territory, "state": "rebooting"})
        started = time.monotonic()
        try:
            if kind == "restart":
                restart = await host.restart_service(unit, timeout=FAULT_TIMEOUT_S["restart"])
                detail = restart.describe()
            else:
                boots = host.boots
                await host.reboot(timeout=FAULT_TIMEOUT_S["reboot"])
                if host.boots != boots + 1:
                    raise HostBootError(
                        f"{host.name} reported no new boot after the reboot "
                        f"(boots {boots} -> {host.boots})"
                    )
                detail = f"{host.name} rebooted and is ready (boot {host.boots})"
        except Exception as exc:
            duration_ms = int((time.monotonic() - started) * 1000)
            await self.emit(
                "fault_injected",
                {
                    **ids,
                    "ok": False,
                    "detail": describe_error(exc),
                    "duration_ms": duration_ms,
                },
            )
            if kind == "reboot":
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
            "fault_injected", {**ids, "ok": True, "detail": detail, "duration_ms": duration_ms}
        )
        if kind == "reboot":
            await self.emit("host_state", {"territory": territory, "state": "ready"})
        return duration_ms

    @staticmethod
    async def _state_after_failed_reboot(host: Host) -> str:
        try:
            await host.wait_ready(5.0)
        except HostError:
            return "lost"
        return "ready"
