"""A challenge's calibration run, shared by the catalog's tests: one scripted builder on a
fresh host, judged milestone by milestone until the first failure."""

from __future__ import annotations

import time
from dataclasses import dataclass

from opsarena.agents.base import AgentContext
from opsarena.agents.scripted import get_scripted
from opsarena.challenges.catalog import place_challenge
from opsarena.hosts import Host
from opsarena.referee.contract import agent_params, brief_for
from opsarena.referee.model import Challenge
from opsarena.referee.referee import Referee
from tests.referee.conftest import EventLog, make_referee

PASS = "passed"


@dataclass
class Calibration:
    """What one builder's run gave: each milestone's outcome in order (`PASS`, or the
    failure reason of the first failing one, where it stopped), the events and the
    referee."""

    outcomes: list[str]
    log: EventLog
    referee: Referee
    preflight_reason: str | None
    """Why the fresh host failed its first milestone (it must fail it)."""

    def details(self, tail: int = 600) -> list[str]:
        """Each attempt's failure detail (its end), for an assertion's message."""
        return [(d.get("failure_detail") or "")[-tail:] for d in self.log.of("attempt_result")]

    def points_match(self, challenge: Challenge) -> bool:
        """The referee's points are exactly those of the milestones passed."""
        reached = zip(challenge.milestones, self.outcomes, strict=False)
        return self.referee.points("builder") == sum(m.points for m, o in reached if o == PASS)


async def calibrate(
    challenge: Challenge, host: Host, builder: str, seed: bytes, match_id: str
) -> Calibration:
    """Place the challenge, check the fresh host fails its first milestone, let `builder`
    deploy, then judge until the first failure (no referee error may happen)."""
    await place_challenge(challenge, host, seed)
    log = EventLog()
    referee = make_referee(challenge, log, seed=seed)
    referee.add_territory("builder", host)
    preflight = await referee.preflight("builder")
    assert preflight.ok, preflight.detail
    context = AgentContext(
        match_id=match_id, territory="builder", brief=brief_for(challenge, seed), host=host,
        deadline=time.monotonic() + 120, params=agent_params(challenge, seed),
    )  # fmt: skip
    outcome = await get_scripted(builder).run(context)
    assert outcome.successful, outcome.terminal_detail
    outcomes: list[str] = []
    while (verdict := await referee.evaluate_next("builder")) is not None:
        assert verdict.outcome != "referee_error", verdict
        if verdict.outcome == "failed":
            assert verdict.failure_detail
            outcomes.append(verdict.failure_reason or "")
            break
        outcomes.append(PASS)
    assert referee.infrastructure_failures == 0
    return Calibration(outcomes, log, referee, preflight.verdict.failure_reason)
