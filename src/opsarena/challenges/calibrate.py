"""A challenge's calibration: its scripted builders on real hosts, against its matrix.

A challenge directory's `calibration.toml` says, for each of its builders
(`builders.py`), what the referee must measure when that builder plays alone on a fresh
host: the points it ends with, and where it stops (the first milestone it fails, and
the failure reason) unless it passes every milestone:

    seed = "my-calibration-seed"        # optional: the match seed (default below)
    preflight = "connection_refused"    # optional: how the fresh host fails milestone 1

    [check_params.disk-loss-restore]    # optional: params merged into the milestones
    rpo_s = 5.0                         # of that check, for this calibration only

    [builders.reference]
    points = 100                        # passes every milestone

    [builders.in-memory]
    points = 30
    stops_at = "service-restart"
    reason = "record_missing"
    detail = "GET /records/"            # optional: the failure detail contains this
    seeds = ["a", "b"]                  # optional: calibrate once per seed, each alike

`calibrate_builder` runs one builder: place the challenge, check the fresh host fails
its first milestone, let the builder deploy, then judge milestone by milestone until
the first failure, as a match would (no referee error may happen). `run_calibration`
runs a plan's builders, each on a host of its own, and compares; `opsarena challenges
calibrate` prints the comparison and CI runs it for every built-in challenge.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import tomllib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from opsarena.agents.base import AgentContext
from opsarena.agents.scripted import challenge_builders, get_scripted
from opsarena.challenges.catalog import place_challenge
from opsarena.errors import ChallengeError, OpsArenaError
from opsarena.hosts import FAULT_POWER_CUT, Host, HostSpec, get_driver
from opsarena.referee.contract import agent_params, brief_for
from opsarena.referee.failures import table_for
from opsarena.referee.model import Challenge
from opsarena.referee.nemesis import faults_needed
from opsarena.referee.referee import Referee

CALIBRATION_FILE = "calibration.toml"
DEFAULT_SEED = "calibration-seed"
PASS = "passed"
AGENT_DEADLINE_S = 120.0
"""How long a builder may take to deploy."""

_BUILDER_KEYS = {"points", "stops_at", "reason", "detail", "seeds"}
_TOP_KEYS = {"seed", "preflight", "check_params", "builders"}


@dataclass(frozen=True)
class Expected:
    """One builder's row of the matrix."""

    builder: str
    points: int
    stops_at: str | None = None
    reason: str | None = None
    detail: str | None = None
    seeds: tuple[bytes, ...] = ()

    def outcomes(self, challenge: Challenge) -> list[str]:
        """Each milestone's outcome in order until the stop (`PASS` or the reason)."""
        outcomes: list[str] = []
        for milestone in challenge.milestones:
            if milestone.id == self.stops_at:
                outcomes.append(self.reason or "")
                break
            outcomes.append(PASS)
        return outcomes


@dataclass(frozen=True)
class CalibrationPlan:
    """A challenge (with the calibration's `check_params` applied) and its matrix."""

    challenge: Challenge
    seed: bytes
    preflight: str | None
    expected: dict[str, Expected]

    def select(self, builders: Sequence[str] | None) -> list[Expected]:
        """The rows of `builders` (every row when None), in the matrix's order. Raises
        `ChallengeError` naming a builder the matrix has no row for."""
        if builders is None:
            return list(self.expected.values())
        unknown = [b for b in builders if b not in self.expected]
        if unknown:
            raise ChallengeError(
                f"--builders: {', '.join(unknown)} not in {self.challenge.name}'s "
                f"{CALIBRATION_FILE} (it has {', '.join(self.expected)})"
            )
        return [self.expected[b] for b in dict.fromkeys(builders)]


def _problems(challenge: Challenge, data: dict[str, Any]) -> list[str]:
    problems = [f"{key}: unknown field" for key in sorted(set(data) - _TOP_KEYS)]
    for key in ("seed", "preflight"):
        if key in data and not isinstance(data[key], str):
            problems.append(f"{key}: must be text")
    checks = {m.check for m in challenge.milestones}
    params = data.get("check_params", {})
    if not isinstance(params, dict) or not all(isinstance(v, dict) for v in params.values()):
        problems.append("check_params: must be tables of params by check name")
    else:
        problems += [
            f"check_params.{name}: no milestone of the challenge uses that check"
            for name in params
            if name not in checks
        ]
    builders = data.get("builders")
    if not isinstance(builders, dict) or not builders:
        return [*problems, "builders: at least one [builders.NAME] table is required"]
    ids = [m.id for m in challenge.milestones]
    try:
        table = table_for(challenge)
    except OpsArenaError as exc:
        return [*problems, f"(challenge): {exc}"]
    known = challenge_builders(challenge.directory)
    for name, row in builders.items():
        where = f"builders.{name}"
        if name not in known:
            problems.append(f"{where}: no such builder in builders.py ({', '.join(sorted(known))})")
        if not isinstance(row, dict):
            problems.append(f"{where}: must be a table")
            continue
        problems += [f"{where}.{key}: unknown field" for key in sorted(set(row) - _BUILDER_KEYS)]
        points, stop, reason = row.get("points"), row.get("stops_at"), row.get("reason")
        if isinstance(points, bool) or not isinstance(points, int):
            problems.append(f"{where}.points: is required (an integer)")
        if (stop is None) != (reason is None):
            problems.append(f"{where}: stops_at and reason go together")
        if stop is not None and stop not in ids:
            problems.append(f"{where}.stops_at: no milestone {stop!r} ({', '.join(ids)})")
        elif isinstance(points, int) and not isinstance(points, bool):
            upto = ids.index(stop) if stop is not None else len(ids)
            earned = sum(m.points for m in challenge.milestones[:upto])
            if points != earned:
                problems.append(
                    f"{where}.points: {points}, but the milestones before "
                    f"{stop or 'the end'} are worth {earned}"
                )
        if reason is not None and (not isinstance(reason, str) or reason not in table):
            problems.append(f"{where}.reason: {reason!r} is not in the challenge's failure table")
        if "detail" in row and not isinstance(row["detail"], str):
            problems.append(f"{where}.detail: must be text")
        seeds = row.get("seeds", [])
        if not isinstance(seeds, list) or not all(isinstance(s, str) and s for s in seeds):
            problems.append(f"{where}.seeds: must be a list of non-empty texts")
    return problems


def load_calibration(challenge: Challenge) -> CalibrationPlan:
    """The challenge directory's calibration. Raises `ChallengeError` (one line per
    problem, each naming the file and the field) when it is missing or wrong."""
    if challenge.directory is None:
        raise ChallengeError(f"{challenge.name}: a lone challenge file has no {CALIBRATION_FILE}")
    path = challenge.directory / CALIBRATION_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ChallengeError(f"{path}: (file): no such file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ChallengeError(f"{path}: (file): cannot be read: {exc}") from None
    try:
        problems = _problems(challenge, data)
    except OpsArenaError as exc:
        problems = [str(exc)]
    if problems:
        lines = [f"{path}: {line}" for line in problems]
        raise ChallengeError(
            f"{path} is not a valid calibration ({len(lines)} problem(s)): " + "; ".join(problems),
            lines,
        )
    overrides: dict[str, dict[str, Any]] = data.get("check_params", {})
    milestones = [
        m.model_copy(update={"params": {**m.params, **overrides[m.check]}})
        if m.check in overrides
        else m
        for m in challenge.milestones
    ]
    tuned = challenge.model_copy(update={"milestones": milestones})
    expected = {
        name: Expected(
            builder=name,
            points=row["points"],
            stops_at=row.get("stops_at"),
            reason=row.get("reason"),
            detail=row.get("detail"),
            seeds=tuple(s.encode() for s in row.get("seeds", [])),
        )
        for name, row in data["builders"].items()
    }
    return CalibrationPlan(
        tuned, str(data.get("seed", DEFAULT_SEED)).encode(), data.get("preflight"), expected
    )


@dataclass
class EventLog:
    """What the referee emits, in order, as (type, data)."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def emit(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append((kind, data))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [data for k, data in self.events if k == kind]


@dataclass
class Run:
    """What one builder's run gave: each milestone's outcome in order (`PASS`, or the
    failure reason of the first failing one, where it stopped), the events, the referee,
    and how the fresh host failed its first milestone."""

    outcomes: list[str]
    log: EventLog
    referee: Referee
    preflight_reason: str | None
    problems: list[str] = field(default_factory=list)
    """What went wrong beyond the outcomes (a referee error, a failed fault)."""

    def details(self, tail: int = 600) -> list[str]:
        """Each attempt's failure detail (its end)."""
        return [(d.get("failure_detail") or "")[-tail:] for d in self.log.of("attempt_result")]

    @property
    def stop_detail(self) -> str:
        return (self.log.of("attempt_result") or [{}])[-1].get("failure_detail") or ""


def make_referee(challenge: Challenge, log: EventLog, seed: bytes) -> Referee:
    """A referee of `challenge` emitting into `log`, its clock from now."""
    started = time.monotonic()
    return Referee(
        challenge,
        seed=seed,
        emit=log.emit,
        clock=lambda: int((time.monotonic() - started) * 1000),
    )


async def calibrate_builder(
    challenge: Challenge, host: Host, builder: str, seed: bytes, match_id: str
) -> Run:
    """Place the challenge on the fresh `host`, preflight it, let `builder` (of the
    challenge's builders) deploy, then judge until the first failure. Raises
    `OpsArenaError` when the host or the builder cannot do its part."""
    await place_challenge(challenge, host, seed)
    log = EventLog()
    referee = make_referee(challenge, log, seed)
    referee.add_territory("builder", host)
    problems: list[str] = []
    preflight = await referee.preflight("builder")
    if not preflight.ok:
        problems.append(f"preflight: {preflight.detail}")
    context = AgentContext(
        match_id=match_id,
        territory="builder",
        brief=brief_for(challenge, seed),
        host=host,
        deadline=time.monotonic() + AGENT_DEADLINE_S,
        params=agent_params(challenge, seed),
    )
    outcome = await get_scripted(builder, challenge.directory).run(context)
    if not outcome.successful:
        problems.append(f"the builder did not deploy: {outcome.terminal_detail}")
    outcomes: list[str] = []
    while (verdict := await referee.evaluate_next("builder")) is not None:
        if verdict.outcome == "referee_error":
            problems.append(f"referee error: {verdict.failure_detail}")
            break
        if verdict.outcome == "failed":
            outcomes.append(verdict.failure_reason or "")
            break
        outcomes.append(PASS)
    if referee.infrastructure_failures:
        problems.append(f"{referee.infrastructure_failures} referee error(s)")
    problems += [f"fault {f.get('fault')} failed" for f in log.of("fault_injected") if not f["ok"]]
    reason = preflight.verdict.failure_reason if preflight.ok else None
    return Run(outcomes, log, referee, reason, problems)


@dataclass
class Measured:
    """One builder's calibration next to its expectation."""

    expected: Expected
    seed: bytes
    points: int | None = None
    stops_at: str | None = None
    reason: str | None = None
    preflight_reason: str | None = None
    mismatches: list[str] = field(default_factory=list)
    run: Run | None = None

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def line(self) -> str:
        """`builder: expected ... measured ... ok|MISMATCH (why)`."""
        e = self.expected
        want = f"{e.points} pts, " + (f"stops at {e.stops_at}: {e.reason}" if e.stops_at else "all")
        got = (
            "nothing"
            if self.points is None
            else f"{self.points} pts, "
            + (f"stops at {self.stops_at}: {self.reason}" if self.stops_at else "all")
        )
        verdict = "ok" if self.ok else "MISMATCH: " + "; ".join(self.mismatches)
        return f"{e.builder}: expected {want} | measured {got} | {verdict}"


def compare(plan: CalibrationPlan, expected: Expected, seed: bytes, run: Run) -> Measured:
    """What `run` measured against `expected` (pure)."""
    challenge = plan.challenge
    ids = [m.id for m in challenge.milestones]
    stopped = run.outcomes and run.outcomes[-1] != PASS
    measured = Measured(
        expected,
        seed,
        points=run.referee.points("builder"),
        stops_at=ids[len(run.outcomes) - 1] if stopped else None,
        reason=run.outcomes[-1] if stopped else None,
        preflight_reason=run.preflight_reason,
        run=run,
    )
    mismatches = list(run.problems)
    if run.outcomes != expected.outcomes(challenge):
        mismatches.append(f"outcomes {run.outcomes}, expected {expected.outcomes(challenge)}")
    earned = sum(
        m.points for m, o in zip(challenge.milestones, run.outcomes, strict=False) if o == PASS
    )
    if measured.points != expected.points or measured.points != earned:
        mismatches.append(f"points {measured.points}, expected {expected.points}")
    if plan.preflight is not None and run.preflight_reason != plan.preflight:
        mismatches.append(f"preflight {run.preflight_reason}, expected {plan.preflight}")
    if expected.detail is not None and expected.detail not in run.stop_detail:
        mismatches.append(f"the stop's detail lacks {expected.detail!r}: {run.stop_detail[-300:]}")
    if not stopped and run.outcomes:
        summary = run.referee.ledger_summary("builder")
        if summary.lost or summary.corrupted or summary.stale:
            mismatches.append(f"passed everything with a ledger of {summary}")
    measured.mismatches = mismatches
    return measured


HostMaker = Callable[[str], AbstractAsyncContextManager[tuple[Host, str]]]
"""`async with make_host(label) as (host, match_id)`: a fresh host for the challenge,
removed at the end whatever happened."""


async def run_calibration(
    plan: CalibrationPlan,
    make_host: HostMaker,
    builders: Sequence[str] | None = None,
    *,
    parallel: int = 1,
    report: Callable[[Measured], None] | None = None,
) -> list[Measured]:
    """Calibrate each selected builder (once per seed), `parallel` at a time, each on a
    host of its own; `report` sees each result as it comes. An `OpsArenaError` of one
    run is that run's mismatch. Results in the matrix's order."""
    return await run_jobs(
        plan, calibration_jobs(plan, builders), make_host, parallel=parallel, report=report
    )


def calibration_jobs(
    plan: CalibrationPlan, builders: Sequence[str] | None = None
) -> list[tuple[Expected, bytes]]:
    """Each selected builder once per seed (its own `seeds`, else the plan's)."""
    return [
        (expected, seed)
        for expected in plan.select(builders)
        for seed in (expected.seeds or (plan.seed,))
    ]


async def run_jobs(
    plan: CalibrationPlan,
    jobs: Sequence[tuple[Expected, bytes]],
    make_host: HostMaker,
    *,
    parallel: int = 1,
    report: Callable[[Measured], None] | None = None,
) -> list[Measured]:
    """Calibrate each (builder, seed) job, `parallel` at a time (see `run_calibration`)."""
    gate = asyncio.Semaphore(max(1, parallel))

    async def one(expected: Expected, seed: bytes) -> Measured:
        async with gate:
            try:
                async with make_host(expected.builder) as (host, match_id):
                    run = await calibrate_builder(
                        plan.challenge, host, expected.builder, seed, match_id
                    )
                measured = compare(plan, expected, seed, run)
            except OpsArenaError as exc:
                measured = Measured(expected, seed, mismatches=[f"could not run: {exc}"])
        if report is not None:
            report(measured)
        return measured

    return list(await asyncio.gather(*(one(e, s) for e, s in jobs)))


def podman_hosts(
    challenge: Challenge, *, driver: str = "podman", image: str | None = None
) -> HostMaker:
    """Fresh hosts for `challenge` (a disk that can lose power when it cuts the power),
    each in a match of its own (`cal...`), removed when its run ends."""

    @contextlib.asynccontextmanager
    async def make_host(label: str) -> AsyncIterator[tuple[Host, str]]:
        hosts = get_driver(driver)
        match_id = f"cal{secrets.token_hex(4)}"
        spec = HostSpec(
            match_id=match_id,
            territory="builder",
            image=image or challenge.image,
            power_cut=FAULT_POWER_CUT in faults_needed(challenge),
        )
        try:
            yield await hosts.create(spec), match_id
        finally:
            await asyncio.shield(hosts.cleanup(match_id=match_id))

    return make_host
