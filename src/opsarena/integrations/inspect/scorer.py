"""The opsarena referee as an Inspect scorer: judged from outside the host, with real faults.

The referee is reached through two adapter functions only, `preflight_host` and
`judge_host`, built on the public `opsarena.referee.Referee`; everything after them
(`score_of`) is pure. After the agent submits, `judge_host` runs the challenge's whole
milestone chain with its faults (unit restart, host reboot) at the referee's cadence, with
the match's settle window: judging goes on until the territory is durable, or until
`settle_s` seconds pass with no new milestone (each pass restarts the window), so a
slow-starting but correct service gets its verdict. The seed that derives the record ids and
values is drawn when scoring starts, so nothing the agent saw could predict them; it
is revealed in the score's metadata afterwards for audit.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from inspect_ai.model import ModelUsage
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer, stderr
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.util import sandbox

from opsarena.challenges.catalog import find_challenge
from opsarena.challenges.model import Challenge
from opsarena.errors import PreflightError
from opsarena.hosts import Host
from opsarena.integrations.inspect.sandbox import OpsarenaSandboxEnvironment
from opsarena.referee import Referee

TERRITORY = "default"
SETTLE_POLL_S = 0.1
"""How often the settle watcher looks at the referee's progress."""


@dataclass(frozen=True)
class MilestoneOutcome:
    """Where the territory ended on one milestone."""

    id: str
    title: str
    points: int
    max_points: int
    passed: bool
    attempts: int
    verdict: str | None
    """The last attempt's outcome (passed, failed, referee_error); None if never tried."""
    failure_reason: str | None = None
    failure_category: str | None = None
    failure_detail: str | None = None


@dataclass(frozen=True)
class Judgement:
    """What the referee decided about one host."""

    challenge: str
    points: int
    total_points: int
    durable: bool
    milestones: list[MilestoneOutcome]
    referee_errors: int
    seed_hex: str
    events: list[dict[str, Any]] = field(default_factory=list)


async def preflight_host(challenge: Challenge, host: Host) -> None:
    """Check that the fresh `host` FAILS the challenge's first milestone, as every match
    does before it starts. Raises `PreflightError` saying why when it does not."""
    referee = Referee(challenge, seed=secrets.token_bytes(32), emit=_discard, clock=lambda: 0)
    referee.add_territory(TERRITORY, host)
    result = await referee.preflight(TERRITORY)
    if not result.ok:
        raise PreflightError(result.detail)


async def judge_host(
    challenge: Challenge, host: Host, *, seed: bytes, settle_s: float | None = None
) -> Judgement:
    """Judge `host` against `challenge` with `seed`: the whole milestone chain, with its
    faults, at the referee's cadence, until durable or until `settle_s` (default: the
    challenge's) passes with no new milestone — the settle window a match gives a
    competitor whose agent has ended. The one call into the referee; re-point it here
    when the referee's API changes."""
    events: list[dict[str, Any]] = []
    started = time.monotonic()

    async def emit(kind: str, data: dict[str, Any]) -> None:
        events.append({"type": kind, **data})

    referee = Referee(
        challenge,
        seed=seed,
        emit=emit,
        clock=lambda: int((time.monotonic() - started) * 1000),
    )
    referee.add_territory(TERRITORY, host)
    await _judge_until_settled(referee, challenge.settle_s if settle_s is None else settle_s)
    outcomes = []
    for milestone in challenge.milestones:
        state = referee.milestone_state(TERRITORY, milestone.id)
        last = state.last
        outcomes.append(
            MilestoneOutcome(
                id=milestone.id,
                title=milestone.title,
                points=state.points,
                max_points=milestone.points,
                passed=state.passed,
                attempts=state.attempts,
                verdict=last.outcome if last is not None else None,
                failure_reason=last.failure_reason if last is not None else None,
                failure_category=last.failure_category if last is not None else None,
                failure_detail=last.failure_detail if last is not None else None,
            )
        )
    return Judgement(
        challenge=challenge.name,
        points=referee.points(TERRITORY),
        total_points=challenge.total_points,
        durable=referee.is_durable(TERRITORY),
        milestones=outcomes,
        referee_errors=referee.referee_errors(TERRITORY),
        seed_hex=seed.hex(),
        events=events,
    )


async def _judge_until_settled(referee: Referee, window: float) -> None:
    """Run the referee on the one territory until it is durable, or until `window` s pass
    without a new milestone; an attempt in flight at the deadline runs to its end."""
    running = asyncio.create_task(referee.run())

    def passed() -> int:
        return sum(
            referee.milestone_state(TERRITORY, m.id).passed for m in referee.challenge.milestones
        )

    try:
        count, deadline = passed(), time.monotonic() + window
        while not running.done() and not referee.is_durable(TERRITORY):
            if passed() > count:
                count, deadline = passed(), time.monotonic() + window
            if time.monotonic() >= deadline:
                if await referee.stop_judging(TERRITORY, unless_passed_beyond=count):
                    break
                continue  # the attempt in flight passed a milestone: a new window
            await asyncio.sleep(min(SETTLE_POLL_S, max(0.0, deadline - time.monotonic())))
        if running.done():
            running.result()  # a bug in the referee is raised, not scored
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def _discard(kind: str, data: dict[str, Any]) -> None:
    return None


# ---- deciding the score (pure) --------------------------------------------------------


def explanation_of(judgement: Judgement) -> str:
    """The score's explanation: the points, then one line per milestone. Pure."""
    verdict = "durable" if judgement.durable else "not durable"
    lines = [f"{judgement.points}/{judgement.total_points} points ({verdict})"]
    for m in judgement.milestones:
        if m.passed:
            lines.append(f"- {m.id}: passed, {m.points} points (attempt {m.attempts})")
        elif m.verdict is None:
            lines.append(f"- {m.id}: not attempted (an earlier milestone did not pass)")
        else:
            lines.append(
                f"- {m.id}: {m.verdict} ({m.failure_reason}) after {m.attempts} "
                f"attempt(s): {m.failure_detail}"
            )
    if judgement.referee_errors:
        lines.append(
            f"The referee had {judgement.referee_errors} infrastructure failure(s); they "
            "awarded and took nothing."
        )
    return "\n".join(lines)


def usage_summary(usage: dict[str, ModelUsage]) -> dict[str, Any]:
    """Tokens per model and the total cost in integer micro-USD (None when Inspect has
    no price for a model). Pure."""
    costs = [u.total_cost for u in usage.values()]
    return {
        "models": {name: u.model_dump(exclude_none=True) for name, u in usage.items()},
        "total_tokens": sum(u.total_tokens for u in usage.values()),
        "cost_micro_usd": (
            round(sum(c for c in costs if c is not None) * 1_000_000)
            if costs and all(c is not None for c in costs)
            else None
        ),
    }


def score_of(judgement: Judgement, usage: dict[str, ModelUsage], answer: str | None) -> Score:
    """The Inspect score of a judgement: points/total points, the explanation, and the
    milestones, failure reasons, details, usage and seed as metadata. Pure."""
    failures = [
        {"milestone": m.id, "reason": m.failure_reason, "detail": m.failure_detail}
        for m in judgement.milestones
        if not m.passed and m.verdict is not None
    ]
    return Score(
        value=judgement.points / judgement.total_points if judgement.total_points else 0.0,
        answer=answer,
        explanation=explanation_of(judgement),
        metadata={
            "challenge": judgement.challenge,
            "points": judgement.points,
            "total_points": judgement.total_points,
            "durable": judgement.durable,
            "milestones": [asdict(m) for m in judgement.milestones],
            "failure_reasons": [f["reason"] for f in failures],
            "failures": failures,
            "referee_errors": judgement.referee_errors,
            "usage": usage_summary(usage),
            "seed": judgement.seed_hex,
            "referee_events": judgement.events,
        },
    )


# ---- Inspect glue ---------------------------------------------------------------------


def _host() -> Host:
    return sandbox().as_type(OpsarenaSandboxEnvironment).host


def _sample_usage() -> dict[str, ModelUsage]:
    # Inspect keeps the sample's usage per model in a context variable with no public
    # accessor (TaskState exposes only the token total).
    from inspect_ai.model._model import sample_model_usage

    return dict(sample_model_usage())


@solver
def preflight(challenge: str) -> Solver:
    """Setup step: refuse to start a sample whose fresh host already passes the first
    milestone (the image would be solving the challenge)."""
    loaded = find_challenge(challenge)

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        await preflight_host(loaded, _host())
        return state

    return solve


@scorer(metrics=[mean(), stderr()])
def referee(challenge: str, settle_s: float | None = None) -> Scorer:
    """Score the sample's opsarena host with the referee of `challenge` (a built-in
    name or a path), from outside the host, after the agent has finished; `settle_s`
    replaces the challenge's settle window."""
    loaded = find_challenge(challenge)

    async def score(state: TaskState, target: Target) -> Score:
        judgement = await judge_host(
            loaded, _host(), seed=secrets.token_bytes(32), settle_s=settle_s
        )
        answer = state.output.completion if state.output else None
        return score_of(judgement, _sample_usage(), answer)

    return score
