"""The opsarena referee as an Inspect scorer: judged from outside the host, with real faults.

The referee is reached through two adapter functions only, `preflight_host` and
`judge_host`, built on the public `opsarena.referee.Referee`; everything after them
(`score_of`) is pure. After the agent submits, `judge_host` runs the challenge's whole
milestone chain with its faults (unit restart, host reboot, power cut) at the referee's
cadence, with the match's settle window: judging goes on until the territory is durable,
or until `settle_s` seconds pass with no new milestone (each pass restarts the window), so
a slow-starting but correct service gets its verdict.

The seed is the sample's own, as in a match: the sandbox draws it when it makes the host
and places the challenge's setup with it (`sandbox.SampleSeed`); the setup step
(`prepare`) renders the brief the agent reads with it, publishes its commitment in the
sample's metadata and runs the preflight; the scorer judges with the same seed and
reveals it (with the commitment's nonce) in the score's metadata. The agent never sees
the seed, only what the brief derives from it, so it cannot predict the record ids and
values the referee writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from inspect_ai.model import ModelUsage
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer, stderr
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.util import sandbox

from opsarena.challenges.catalog import find_challenge
from opsarena.errors import OpsArenaError, PreflightError
from opsarena.hosts import Host
from opsarena.integrations.inspect.sandbox import OpsarenaSandboxEnvironment, SampleSeed
from opsarena.referee.contract import brief_for
from opsarena.referee.model import VARIABLE_PATTERN, Challenge
from opsarena.referee.referee import Referee

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


async def preflight_host(challenge: Challenge, host: Host, *, seed: bytes) -> None:
    """Check that the fresh `host` (its setup placed with `seed`) FAILS the challenge's
    first milestone, as every match does before it starts. Raises `PreflightError`
    saying why when it does not."""
    referee = Referee(challenge, seed=seed, emit=_discard, clock=lambda: 0)
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


# ---- the sample's input (pure) ---------------------------------------------------------


def sample_input(brief: str, total_points: int, settle_s: float) -> str:
    """The challenge's brief, plus when the judging happens here: in a match the
    referee judges while the competitor works; in an Inspect sample it starts after the
    agent submits, and goes on for the settle window. Pure."""
    return (
        f"{brief.strip()}\n\n"
        "WHEN YOU ARE JUDGED HERE\n"
        "In this evaluation the referee judges your host after you call submit(): it runs "
        "every milestone in order, with its faults (such as a unit restart or a host reboot), "
        f"retrying a failed milestone at its cadence for up to {settle_s:g} s after the last "
        f"milestone passed, and your score is the points you earn then (out of {total_points}). "
        "Nothing is checked before you submit and you get no feedback, so test your "
        "service yourself first."
    )


def brief_template(challenge: Challenge) -> str:
    """The brief with each `{{variable}}` shown as `<variable>`: what the dataset's
    sample holds before a host (and its seed) exists. The agent never reads it: the
    setup step replaces it with the brief rendered with the sample's seed. Pure."""
    return re.sub(VARIABLE_PATTERN, lambda m: f"<{m.group(1)}>", challenge.brief)


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


def score_of(
    judgement: Judgement,
    usage: dict[str, ModelUsage],
    answer: str | None,
    seed: SampleSeed | None = None,
) -> Score:
    """The Inspect score of a judgement: points/total points, the explanation, and the
    milestones, failure reasons, details, usage and seed as metadata; with the sample's
    `seed`, also what opens its commitment (`seed_nonce`, `seed_commitment`,
    `match_id`). Pure."""
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
            **(
                {
                    "seed_nonce": seed.nonce.hex(),
                    "seed_commitment": seed.commitment,
                    "match_id": seed.match_id,
                }
                if seed is not None
                else {}
            ),
            "referee_events": judgement.events,
        },
    )


# ---- the sample's steps, on its sandbox -----------------------------------------------


def sample_seed(challenge: Challenge, environment: OpsarenaSandboxEnvironment) -> SampleSeed:
    """The seed `environment`'s host was made with for `challenge`. Raises
    `OpsArenaError` when the sandbox was not made for that challenge (its config names
    no challenge, or another one), since then nothing was placed with a seed."""
    made_for = environment.challenge
    if made_for is None or environment.seed is None or made_for.name != challenge.name:
        what = "no challenge" if made_for is None else f"the challenge {made_for.name!r}"
        raise OpsArenaError(
            f"the opsarena sandbox of this sample was made for {what}, not "
            f"{challenge.name!r}: give it OpsarenaSandboxConfig(challenge=...) of the task"
        )
    return environment.seed


async def prepare_sample(
    challenge: Challenge,
    environment: OpsarenaSandboxEnvironment,
    state: TaskState,
    settle_s: float | None = None,
) -> None:
    """Before the agent starts: replace the sample's prompt with the brief rendered
    with the sample's seed, publish the seed's commitment in the sample's metadata
    (`seed_commitment`, `match_id`), and run the referee's preflight on the host."""
    seed = sample_seed(challenge, environment)
    state.user_prompt.text = sample_input(
        brief_for(challenge, seed.seed),
        challenge.total_points,
        challenge.settle_s if settle_s is None else settle_s,
    )
    state.metadata["seed_commitment"] = seed.commitment
    state.metadata["match_id"] = seed.match_id
    await preflight_host(challenge, environment.host, seed=seed.seed)


async def score_sample(
    challenge: Challenge,
    environment: OpsarenaSandboxEnvironment,
    state: TaskState,
    usage: dict[str, ModelUsage],
    settle_s: float | None = None,
) -> Score:
    """After the agent: judge the host with the sample's seed, and reveal it."""
    seed = sample_seed(challenge, environment)
    judgement = await judge_host(challenge, environment.host, seed=seed.seed, settle_s=settle_s)
    answer = state.output.completion if state.output else None
    return score_of(judgement, usage, answer, seed)


# ---- Inspect glue ---------------------------------------------------------------------


def _environment() -> OpsarenaSandboxEnvironment:
    return sandbox().as_type(OpsarenaSandboxEnvironment)


def _sample_usage() -> dict[str, ModelUsage]:
    # Inspect keeps the sample's usage per model in a context variable with no public
    # accessor (TaskState exposes only the token total).
    from inspect_ai.model._model import sample_model_usage

    return dict(sample_model_usage())


@solver
def prepare(challenge: str, settle_s: float | None = None) -> Solver:
    """Setup step, before the agent: the brief rendered with the sample's seed becomes
    the prompt, the seed's commitment goes into the sample's metadata, and the
    referee's preflight refuses a fresh host that already passes the first milestone
    (the image would be solving the challenge)."""
    loaded = find_challenge(challenge)

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        await prepare_sample(loaded, _environment(), state, settle_s)
        return state

    return solve


@scorer(metrics=[mean(), stderr()])
def referee(challenge: str, settle_s: float | None = None) -> Scorer:
    """Score the sample's opsarena host with the referee of `challenge` (a built-in
    name or a path), from outside the host, after the agent has finished, with the
    seed the host was made with; `settle_s` replaces the challenge's settle window."""
    loaded = find_challenge(challenge)

    async def score(state: TaskState, target: Target) -> Score:
        return await score_sample(loaded, _environment(), state, _sample_usage(), settle_s)

    return score
