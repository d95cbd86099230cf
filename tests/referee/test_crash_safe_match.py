"""Issue 14's done-when, in CI: a crash-safe-records match of reference, no-fsync and
ack-before-write on real power-cut hosts, judged by the referee's registered faults."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsarena.agents.competitors import competitor_from_cli
from opsarena.challenges import find_challenge
from opsarena.match.controller import Controller, MatchPlan
from opsarena.store import SqliteEventStore
from tests.conftest import new_match_id

pytestmark = pytest.mark.hosts


async def test_crash_safe_records_tells_the_three_builders_apart(tmp_path: Path) -> None:
    builders = {
        "a": "scripted:reference",
        "b": "scripted:no-fsync",
        "c": "scripted:ack-before-write",
    }
    plan = MatchPlan(
        challenge=find_challenge("crash-safe-records"),
        competitors=[competitor_from_cli(t, a) for t, a in builders.items()],
        time_limit_s=240.0,
        match_id=new_match_id("csr"),
        drain_s=2.0,
        finish="all",
    )
    with SqliteEventStore(tmp_path / "log.db") as store:
        record = await Controller(plan, store).run()
    a, b, c = (record.territories[t] for t in "abc")
    assert (a.milestone_points, a.durable_at_ms is not None) == (100, True)
    assert record.winner == "a"

    # no-fsync: every fault but the power cut leaves its files; the cut loses them.
    assert [m for m, s in b.milestones.items() if not s.passed] == ["power-cut"]
    cut = b.milestones["power-cut"]
    assert cut.failure_reason in ("record_missing", "record_corrupted"), cut.failure_detail
    assert "after the power cut" in (cut.failure_detail or "")
    assert "record-" in (cut.failure_detail or "")  # the detail names a lost record

    # ack-before-write: a clean restart flushes, the crash loses what was acknowledged.
    assert c.milestones["service-restart"].passed
    crash = c.milestones["service-crash"]
    assert not crash.passed and crash.failure_reason == "record_missing"
    assert "after the crash" in (crash.failure_detail or "") and "record-" in (
        crash.failure_detail or ""
    )
    assert a.ledger is not None and a.ledger.lost == 0 and a.ledger.corrupted == 0
    assert b.ledger is not None and b.ledger.lost + b.ledger.corrupted > 0
