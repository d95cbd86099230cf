"""One territory's failure stays that territory's: an exception while judging an attempt,
logging its result included, is its referee_error; a territory's judging that dies ends
as `judging_stopped` referee_error; the other territories are judged on, and the
referee's run never raises for it.

The events go through the controller's path (typed by `parse_data`, appended to a real
SQLite log): a result the log refuses is refused there, as in a match.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from opsarena.challenges import Challenge
from opsarena.hosts import Host
from opsarena.match.events import parse_data
from opsarena.referee.contract import CheckContext, Verdict, register_check
from opsarena.referee.referee import Referee
from opsarena.store import MAX_EVENT_BYTES, SqliteEventStore, StoredEvent, chain_problems
from tests.referee.conftest import one_milestone

HOSTILE, HONEST = "hostile", "honest"


@register_check("test-refused-evidence")
async def refused_evidence(host: Host, ctx: CheckContext) -> Verdict:
    """Passes everyone; the hostile territory's evidence is more than the log takes (a
    host's answer quoted whole, say), and on its second attempt not even JSON."""
    if ctx.territory != HOSTILE:
        return Verdict.passed({"health": "ready"})
    if ctx.attempt == 1:
        return Verdict.passed({"body": "x" * MAX_EVENT_BYTES})
    return Verdict.passed({"raw": object()})


def judging(challenge: Challenge, check: str, log: Log, *territories: str) -> Referee:
    """A referee of `territories` on `challenge`'s first milestone, judged by `check` at a
    short cadence, its events in `log`."""
    quick = one_milestone(challenge, check).model_copy(update={"cadence_s": 0.05})
    referee = Referee(quick, seed=b"s", emit=log.emit, clock=lambda: 0)
    for territory in territories:
        referee.add_territory(territory, object())  # type: ignore[arg-type]
    return referee


class Log:
    """A real SQLite log written as the controller writes the referee's events; `refuse`
    makes the log refuse a territory's events of some types (a store failing)."""

    def __init__(self, path: Path) -> None:
        self.store = SqliteEventStore(path)
        self.refuse: dict[str, set[str]] = {}

    async def emit(self, kind: str, data: dict[str, Any]) -> None:
        if kind in self.refuse.get(str(data.get("territory")), set()):
            raise OSError(f"the log refuses {kind}")
        event = parse_data(kind, data)
        await self.store.append("m", event.event_type, event.model_dump(mode="json"), 0)

    async def events(self) -> list[StoredEvent]:
        events = await self.store.read("m")
        assert not chain_problems([e.link() for e in events])
        return events


def results(events: list[StoredEvent], territory: str) -> list[dict[str, Any]]:
    return [
        e.data for e in events if e.type == "attempt_result" and e.data["territory"] == territory
    ]


async def test_a_result_the_log_refuses_is_that_territorys_referee_error(
    challenge: Challenge, tmp_path: Path
) -> None:
    log = Log(tmp_path / "log.db")
    referee = judging(challenge, "test-refused-evidence", log, HOSTILE, HONEST)
    for _ in range(2):
        verdict = await referee.evaluate_next(HOSTILE)
        assert verdict is not None and verdict.outcome == "referee_error", verdict
    assert await referee.verify(HONEST)  # the neighbour is judged as ever

    events = await log.events()
    hostile = results(events, HOSTILE)
    assert [(r["attempt"], r["verdict"], r["failure_reason"], r["points"]) for r in hostile] == [
        (1, "referee_error", "internal_error", 0),
        (2, "referee_error", "internal_error", 0),
    ]
    assert "over the" in hostile[0]["failure_detail"]  # what failed, bounded
    assert all(len(r["failure_detail"]) <= 1000 for r in hostile)
    assert [r["verdict"] for r in results(events, HONEST)] == ["passed"]
    assert referee.referee_errors(HOSTILE) == 2 and not referee.is_durable(HOSTILE)
    assert referee.is_durable(HONEST)


async def test_a_territory_whose_judging_dies_stops_alone(
    challenge: Challenge, tmp_path: Path
) -> None:
    """The log refuses every result of one territory (so not even its referee_error can
    be logged): its judging ends as `judging_stopped` referee_error; the other territory
    is judged to the end, and the referee's run returns without raising."""
    log = Log(tmp_path / "log.db")
    log.refuse[HOSTILE] = {"attempt_result"}
    referee = judging(challenge, "test-refused-evidence", log, HOSTILE, HONEST)
    async with asyncio.timeout(30):
        await referee.run()  # returns: the honest territory durable, the hostile one stopped

    assert referee.is_durable(HONEST)
    assert referee.judging_failed(HOSTILE) is not None
    events = await log.events()
    (stopped,) = [e.data for e in events if e.type == "judging_stopped"]
    assert (stopped["territory"], stopped["reason"]) == (HOSTILE, "referee_error")
    assert "the log refuses attempt_result" in stopped["detail"], stopped
    assert results(events, HOSTILE) == []
    assert await referee.evaluate_next(HOSTILE) is None  # nothing more is judged there


async def test_cancelling_the_referee_still_cancels_it(
    challenge: Challenge, tmp_path: Path
) -> None:
    log = Log(tmp_path / "log.db")
    referee = judging(challenge, "test-hang", log, HOSTILE)
    task = asyncio.create_task(referee.run())
    while not [e for e in await log.events() if e.type == "attempt_started"]:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [e.type for e in await log.events()] == ["attempt_started"]  # nothing swallowed it
    assert referee.judging_failed(HOSTILE) is None
