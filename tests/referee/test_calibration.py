"""The referee's calibration matrix: every scripted builder on a real host, every verdict.

Each builder's designed outcome per milestone is asserted: which milestones pass, and for
the first one that does not, its exact failure_reason. A calibration run must need no
retries: a referee_error here is a failure of the arena and fails the test.
"""

from __future__ import annotations

import time

import pytest

from opsarena.agents.base import AgentContext
from opsarena.agents.scripted import get_scripted
from opsarena.challenges import Challenge
from tests.conftest import HostFactory
from tests.referee.conftest import EventLog, make_referee

PASS = "passed"

# builder -> the outcome of each milestone it reaches, in order; milestones after the
# first failure are never evaluated.
MATRIX: dict[str, list[str]] = {
    "reference": [PASS, PASS, PASS, PASS],
    "webdav": [PASS, PASS, PASS, PASS],
    "in-memory": [PASS, PASS, "record_missing"],
    "volatile": [PASS, PASS, PASS, "record_missing"],
    "not-enabled": [PASS, PASS, PASS, "not_ready_after_fault"],
    "wrong-health": ["wrong_body"],
    "idle": ["connection_refused"],
    "ignore-ids": [PASS, "wrong_record"],
    "newest-only": [PASS, "record_missing"],
    "binary-unsafe": [PASS, "record_corrupted"],
    "size-limited": [PASS, "record_corrupted"],
    "found-for-missing": [PASS, "found_unwritten"],
    "no-overwrite": [PASS, "stale_value"],
    "racy": [PASS, "wrong_record"],
}
"""`slow-start` is not here: it needs the settle window of a real match
(tests/referee/test_settle.py)."""

DETAIL_STEP = {
    "ignore-ids": "parallel GET",
    "newest-only": "parallel GET",
    "binary-unsafe": "binary: GET",
    "size-limited": "large: GET",
    "found-for-missing": "unwritten: GET",
    "no-overwrite": "overwrite: GET",
    "racy": "parallel GET",
}
"""The sub-check each flawed builder must be caught by, as its failure_detail names it."""


@pytest.mark.hosts
@pytest.mark.parametrize("builder", sorted(MATRIX))
async def test_calibration_matrix(
    builder: str, challenge: Challenge, host_factory: HostFactory, match_id: str
) -> None:
    host = await host_factory("builder")
    log = EventLog()
    referee = make_referee(challenge, log)
    referee.add_territory("builder", host)

    preflight = await referee.preflight("builder")
    assert preflight.ok, preflight.detail
    assert preflight.verdict.failure_reason == "connection_refused"

    context = AgentContext(
        match_id=match_id, territory="builder", brief=challenge.brief, host=host,
        deadline=time.monotonic() + 120, params={"port": challenge.port, "unit": challenge.unit},
    )  # fmt: skip
    await get_scripted(builder).run(context)

    outcomes: list[str] = []
    while (verdict := await referee.evaluate_next("builder")) is not None:
        assert verdict.outcome != "referee_error", verdict
        if verdict.outcome == "failed":
            assert verdict.failure_category == "verification_failed"
            assert verdict.failure_detail
            outcomes.append(verdict.failure_reason or "")
            break
        outcomes.append(PASS)

    assert outcomes == MATRIX[builder], [d["failure_detail"] for d in log.of("attempt_result")]
    reached = zip(challenge.milestones, outcomes, strict=False)
    expected_points = sum(m.points for m, outcome in reached if outcome == PASS)
    assert referee.points("builder") == expected_points
    assert referee.is_durable("builder") == (outcomes == [PASS] * len(challenge.milestones))
    assert referee.infrastructure_failures == 0
    faults = log.of("fault_injected")
    assert all(fault["ok"] for fault in faults), faults
    if builder in DETAIL_STEP:
        detail = referee.milestone_state("builder", "write-read").last
        assert detail is not None and (detail.failure_detail or "").startswith(
            DETAIL_STEP[builder]
        ), detail
        assert "reproduce inside the host:" in (detail.failure_detail or "")
    if outcomes == [PASS] * len(challenge.milestones):
        # The ledger re-read after each fault found every acknowledged record.
        summary = referee.ledger_summary("builder")
        assert summary.acknowledged > 0 and summary.verified >= summary.acknowledged
        assert summary.lost == summary.corrupted == summary.stale == summary.unexpected == 0
