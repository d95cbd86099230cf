"""The settle window on real hosts: a finished competitor is judged fairly, then judging stops.

`slow-start` is correct but its unit sleeps 6 s before its server starts, and its agent
ends right after `systemctl enable --now`: only the window lets it reach 100. An idle
competitor is judged at the cadence through its window, then judging stops and the record
says why. A competitor ignoring ids never becomes durable, so the match never ends on a
durable deployment.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from opsarena.agents.competitors import competitor_from_cli
from opsarena.challenges.catalog import find_challenge
from opsarena.match.controller import Controller, MatchPlan
from opsarena.store import SqliteEventStore
from tests.conftest import new_match_id, podman_names

pytestmark = pytest.mark.hosts


def plan_of(builders: dict[str, str], **extra: object) -> MatchPlan:
    return MatchPlan(
        challenge=find_challenge("durable-records"),
        competitors=[competitor_from_cli(t, a) for t, a in builders.items()],
        time_limit_s=float(extra.pop("time_limit_s", 150.0)),  # type: ignore[arg-type]
        match_id=new_match_id("s"),
        drain_s=2.0,
        **extra,  # type: ignore[arg-type]
    )


async def test_slow_start_reaches_100_inside_the_settle_window(tmp_path: Path) -> None:
    plan = plan_of({"slow": "scripted:slow-start"}, finish="all")
    with SqliteEventStore(tmp_path / "log.db") as store:
        controller = Controller(plan, store)
        record = await asyncio.wait_for(controller.run(), 240)
        events = await store.read(plan.match_id)

    territory = record.territories["slow"]
    agent = record.agents[territory.agent]
    assert agent.terminal_state == "completed"
    assert territory.milestone_points == 100, territory.milestones
    assert (record.finish_reason, record.winner) == ("all competitors finished", "slow")
    # The agent had ended before the service could answer: judging went on after it.
    assert agent.ended_at_ms is not None and territory.durable_at_ms is not None
    assert agent.ended_at_ms < territory.milestones["service-up"].passed_at_ms  # type: ignore[operator]
    assert territory.judging_stopped_reason == "durable"
    assert territory.judging_stopped_at_ms == territory.durable_at_ms
    assert "judging_stopped" not in [e.type for e in events]
    assert territory.ledger.acknowledged > 0 and territory.ledger.lost == 0
    # The fold rebuilds from ledger_update events exactly the ledger the referee kept.
    assert territory.ledger.model_dump() == controller.referee.ledger_summary("slow").model_dump()
    assert territory.ledger.verified >= territory.ledger.acknowledged
    assert podman_names(plan.match_id) == []
    shown = subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", "show", plan.match_id,
         "--db", str(tmp_path / "log.db")],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    lines = shown.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("ledger "))
    assert lines[header].split()[1:3] == ["acknowledged", "verified"]
    row = lines[header + 1].split()
    assert row[:3] == ["slow", str(territory.ledger.acknowledged), str(territory.ledger.verified)]
    assert "durable" in lines[header + 1]  # when judging stopped, and why


async def test_an_idle_territory_is_judged_through_its_window_then_stopped(
    tmp_path: Path,
) -> None:
    plan = plan_of({"idle": "scripted:idle"}, finish="all")
    plan.challenge = plan.challenge.model_copy(update={"settle_s": 4.0})
    with SqliteEventStore(tmp_path / "log.db") as store:
        record = await asyncio.wait_for(Controller(plan, store).run(), 120)
        events = await store.read(plan.match_id)

    territory = record.territories["idle"]
    assert record.finish_reason == "all competitors finished"
    assert territory.judging_stopped_reason == "window_expired"
    assert territory.judging_stopped_detail == (
        "the 4 s settle window expired after service-up failed with connection_refused"
    )
    assert territory.competitor_state == "no-score"
    # Judged at the cadence inside the window, not once.
    assert territory.milestones["service-up"].attempts >= 3
    stopped = next(e for e in events if e.type == "judging_stopped")
    assert not any(e.type == "attempt_started" for e in events if e.seq > stopped.seq)


async def test_a_service_ignoring_ids_never_becomes_durable(tmp_path: Path) -> None:
    plan = plan_of({"lazy": "scripted:ignore-ids"}, time_limit_s=40.0)
    with SqliteEventStore(tmp_path / "log.db") as store:
        record = await asyncio.wait_for(Controller(plan, store).run(), 180)

    territory = record.territories["lazy"]
    assert record.finish_reason != "first durable deployment"
    assert territory.durable_at_ms is None
    assert not territory.milestones["write-read"].passed
    assert territory.milestones["write-read"].failure_reason == "wrong_record"
    assert territory.milestone_points == 10
