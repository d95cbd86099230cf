"""The scoreboard's pure decisions: where a stream resumes, what a list row says."""

from __future__ import annotations

from opsarena.match.record import MatchRecord
from opsarena.store import MatchSummary
from opsarena.web.app import MAX_SEQ, resume_after
from opsarena.web.records import list_item


def test_resume_after_prefers_a_valid_last_event_id() -> None:
    assert resume_after(0, None) == 0
    assert resume_after(7, None) == 7
    assert resume_after(7, "42") == 42
    assert resume_after(7, "0") == 0
    for bad in ("", "-1", "4.2", "x", "٣", str(MAX_SEQ + 1)):
        assert resume_after(7, bad) == 7


SUMMARY = MatchSummary("m1", "2026-01-01T00:00:00.000Z", "2026-01-01T00:01:00.000Z", 9, 5, "x")


def test_list_item_of_a_broken_log_names_the_problem() -> None:
    item = list_item(SUMMARY, None, "match m1 seq 3 (x): impossible")
    assert item.error == "match m1 seq 3 (x): impossible"
    assert item.state is None and item.challenge is None and item.duration_ms is None
    assert item.last_seq == 9 and item.created == SUMMARY.created_wall


def test_list_item_duration_only_once_started() -> None:
    record = MatchRecord(
        match_id="m1",
        challenge="durable-records",
        challenge_title="Durable records",
        seed="00",
        finish_mode="first-durable",
        time_limit_s=60,
        drain_s=5,
        created_at=SUMMARY.created_wall,
        match_state="provisioning",
        territories={},
        agents={},
    )
    waiting = list_item(SUMMARY, record, None)
    assert waiting.state == "provisioning" and waiting.duration_ms is None
    started = record.model_copy(
        update={
            "match_state": "finished",
            "started_at": "2026-01-01T00:00:02.000Z",
            "elapsed_ms": 4100,
            "winner": "a",
            "finish_reason": "first durable deployment",
        }
    )
    row = list_item(SUMMARY, started, None)
    assert (row.state, row.winner, row.duration_ms) == ("finished", "a", 4100)
    assert row.started_at == "2026-01-01T00:00:02.000Z"
