"""The fold on synthetic event streams (`tests/match/simulated.py`): expected records,
determinism, impossible logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsarena.challenges import builtin_challenge
from opsarena.errors import EventLogError
from opsarena.match import states
from opsarena.match.controller import MatchPlan, resumed_plan
from opsarena.match.events import parse_event
from opsarena.match.fold import RecordFolder, fold_events
from opsarena.store import StoredEvent
from tests.match.simulated import (
    Envelope,
    Log,
    Plan,
    demo_events,
    fold_dicts,
    match_strategy,
    simulate,
)

REPO = Path(__file__).resolve().parents[2]


def test_demo_record_has_the_expected_outcome() -> None:
    record = fold_dicts(demo_events())
    assert record.match_state == "finished"
    assert record.finish_reason == "first durable deployment"
    assert record.winner == "reference"
    reference = record.territories["reference"]
    assert reference.milestone_points == 100
    assert reference.competitor_state == "durable"
    assert reference.durable_at_ms == reference.milestones["host-reboot"].passed_at_ms
    assert reference.milestones["service-up"].attempts == 3  # a referee error, a failure, a pass
    assert reference.last_health == "ready"
    assert record.territories["in-memory"].milestone_points == 30
    assert record.territories["in-memory"].competitor_state == "scored"
    in_memory_restart = record.territories["in-memory"].milestones["service-restart"]
    assert (in_memory_restart.passed, in_memory_restart.failure_reason) == (False, "record_missing")
    assert in_memory_restart.failure_category == "verification_failed"
    idle = record.territories["idle"]
    assert (idle.competitor_state, idle.milestone_points, idle.durable_at_ms) == (
        "no-score",
        0,
        None,
    )
    assert idle.last_health == "connection_refused"
    assert idle.milestones["write-read"].model_dump() == {
        "evaluating": False, "passed": False, "points": 0, "evidence": None,
        "failure_category": None, "failure_detail": None, "failure_reason": None,
        "attempts": 0, "passed_at_ms": None, "points_available": 20,
    }  # fmt: skip
    assert {t.state for t in record.territories.values()} == {"removed"}
    assert all(t.resources == 1 for t in record.territories.values())
    assert record.infrastructure_failures == 1
    assert record.agents["reference-agent"].terminal_state == "completed"
    idle_agent = record.agents["idle-agent"]
    assert (idle_agent.terminal_state, idle_agent.failure_source) == ("terminated", "controller")
    assert idle_agent.terminal_detail == "post-match drain deadline expired"
    assert (idle_agent.input_tokens, idle_agent.output_tokens, idle_agent.cached_tokens) == (
        1210, 305, 100
    )  # fmt: skip
    assert (idle_agent.cost_microusd, idle_agent.cost_known) == (450, False)
    assert idle_agent.resource_units_used == 1
    assert record.elapsed_ms == record.finished_at_ms
    assert record.last_sequence == len(demo_events())
    assert record.started_at is not None and record.started_at.endswith("Z")


def test_time_limit_and_all_finished_without_a_durable_territory_have_no_winner() -> None:
    plans = {
        "a": Plan(passes=1, ends="completed"),
        "b": Plan(passes=2, ends="failed"),
        "c": Plan(passes=2, fails=(0, 3, 0, 0, 1), ends="completed"),
    }
    record = fold_dicts(simulate("m2", plans))
    assert record.finish_reason == "all competitors finished"
    assert record.winner is None  # b has the most points, but nobody is durable
    assert [t.competitor_state for t in record.territories.values()] == ["scored"] * 3
    assert record.agents["b-agent"].failure_source == "player"
    record = fold_dicts(simulate("m3", {"a": Plan(passes=0)}, time_limit_hit=True))
    assert (record.finish_reason, record.winner) == ("time limit", None)
    assert record.territories["a"].competitor_state == "no-score"


def test_kept_hosts_and_finish_all() -> None:
    plans = {"a": Plan(passes=4, ends="completed"), "b": Plan(passes=4, fails=(2, 2, 0, 0, 0))}
    record = fold_dicts(simulate("m4", plans, finish_mode="all", keep_hosts=True))
    assert {t.state for t in record.territories.values()} == {"kept"}
    assert {t.competitor_state for t in record.territories.values()} == {"durable"}
    assert record.winner == "a"


def test_aborted_before_start_leaves_final_states_and_says_why() -> None:
    log = Log("m5")
    log.events = simulate("m5", {"a": Plan(passes=0), "b": Plan(passes=0)})[:1]
    log.add("host_provisioning", {"territory": "a"})
    log.add("host_failed", {"territory": "a", "error": "podman run timed out"})
    log.add("match_finished", {"finish_reason": "aborted", "winner": None})
    log.add("match_closed", {})
    record = fold_dicts(log.events)
    a, b = record.territories["a"], record.territories["b"]
    assert (a.state, a.competitor_state, a.elimination_source) == ("failed", "eliminated", "arena")
    assert a.elimination_detail == "host failed: podman run timed out"
    assert (b.state, b.competitor_state) == ("not-provisioned", "no-score")
    assert record.match_state == "finished" and record.finish_reason == "aborted"
    assert record.agents["b-agent"].terminal_state == "not-started"
    assert record.agents["b-agent"].terminal_detail == "the match ended (aborted) before it started"
    a_agent = record.agents["a-agent"]
    assert (a_agent.terminal_state, a_agent.failure_source) == ("not-started", "arena")
    assert a_agent.terminal_detail == "never started: host failed: podman run timed out"
    assert record.infrastructure_failures == 1
    assert (record.started_at, record.elapsed_ms) == (None, 0)


def test_a_competitor_done_outside_the_running_match_changes_nothing() -> None:
    events = demo_events()
    closed = fold_dicts(events).model_dump_json()
    late = {**events[-1], "seq": len(events) + 1, "type": "competitor_done"}
    late["data"] = {"territory": "idle", "by": "ann"}
    assert fold_dicts([*events, late]).model_dump_json() == closed
    early = [*events[:3], {**late, "seq": 4}, *({**e, "seq": e["seq"] + 1} for e in events[3:])]
    assert fold_dicts(early).territories["idle"].done_by is None
    with pytest.raises(EventLogError, match="expected seq"):
        fold_dicts([*events, {**late, "seq": len(events) + 2}])


def test_a_pass_whose_confirmation_was_cut_off_still_counts() -> None:
    """The referee may be cancelled between a passed attempt_result and milestone_passed."""
    events = demo_events()
    last = _seq_of(events, "milestone_passed", territory="reference", milestone="host-reboot")
    record = fold_dicts(_drop(events, lambda e: e["seq"] == last))
    assert record.winner == "reference"
    assert record.territories["reference"].milestone_points == 100
    wrong = _mutate(events, last, points=39)
    with pytest.raises(EventLogError, match="passed with 40 points, not 39"):
        fold_dicts(wrong)


def test_a_lost_host_that_comes_back_eliminates_nobody() -> None:
    events = demo_events()
    back = _seq_of(events, "host_state", territory="reference", state="ready")
    lost = {**events[back - 1], "data": {"territory": "reference", "state": "lost"}}
    shifted = [*events[: back - 1], lost, *events[back - 1 :]]
    record = fold_dicts([{**e, "seq": i} for i, e in enumerate(shifted, 1)])
    reference = record.territories["reference"]
    assert (reference.competitor_state, reference.elimination_source) == ("durable", None)
    assert record.infrastructure_failures == 2
    assert record.winner == "reference"


def test_judging_the_referee_could_not_go_on_with_stops_as_its_own_failure() -> None:
    events = demo_events()
    at = _seq_of(events, "attempt_started", territory="in-memory", milestone="write-read")
    stopped = {
        **events[at - 1],
        "type": "judging_stopped",
        "data": {"territory": "in-memory", "reason": "referee_error", "detail": "it died"},
    }
    shifted = [*events[: at - 1], stopped]
    judged = {"attempt_started", "attempt_result", "milestone_passed", "fault_injected"}
    shifted += [
        e
        for e in events[at - 1 :]
        if not (e["type"] in judged and e["data"]["territory"] == "in-memory")
    ]
    record = fold_dicts([{**e, "seq": i} for i, e in enumerate(shifted, 1)])
    in_memory = record.territories["in-memory"]
    assert (in_memory.judging_stopped_reason, in_memory.judging_stopped_detail) == (
        "referee_error",
        "it died",
    )
    assert in_memory.milestone_points == 10  # what it passed before stays
    assert record.infrastructure_failures == 2  # the demo's one, and this one
    assert (record.match_state, record.winner) == ("finished", "reference")


def test_a_running_match_folds_to_a_live_record() -> None:
    events = demo_events()
    cut = _seq_of(events, "attempt_started", territory="in-memory", milestone="write-read")
    live = fold_dicts(events[:cut])
    assert live.match_state == "running"
    assert live.finish_reason is None and live.winner is None
    assert live.agents["idle-agent"].running
    assert live.elapsed_ms == events[cut - 1]["t_ms"]
    in_memory = live.territories["in-memory"]
    assert in_memory.milestones["write-read"].evaluating  # started, not yet judged
    assert in_memory.competitor_state == "building"
    assert in_memory.state == "ready"


def _mutate(events: list[Envelope], seq: int, **data: Any) -> list[Envelope]:
    changed = [dict(e) for e in events]
    changed[seq - 1] = {**changed[seq - 1], "data": {**changed[seq - 1]["data"], **data}}
    return changed


def _drop(events: list[Envelope], predicate: Any) -> list[Envelope]:
    kept = [e for e in events if not predicate(e)]
    return [{**e, "seq": i} for i, e in enumerate(kept, 1)]


def _seq_of(events: list[Envelope], event_type: str, **data: Any) -> int:
    return next(
        e["seq"]
        for e in events
        if e["type"] == event_type and all(e["data"].get(k) == v for k, v in data.items())
    )


def _impossible_logs() -> dict[str, tuple[list[Envelope], str]]:
    ev = demo_events()
    removed = lambda e: e["type"] == "host_state" and e["data"]["state"] == "removed"  # noqa: E731
    idle_end = _seq_of(ev, "agent_ended", agent="idle-agent")
    return {
        "gap": ([e for e in ev if e["seq"] != 5], "expected seq 5"),
        "host still ready at close": (
            _drop(ev, lambda e: removed(e) and e["data"]["territory"] == "idle"),
            "territory 'idle' host is still 'ready'",
        ),
        "terminated without why": (
            _mutate(ev, idle_end, terminal_detail=None),
            "terminated without saying why",
        ),
        "agent never ended": (
            _drop(ev, lambda e: e["type"] == "agent_ended" and e["data"]["agent"] == "idle-agent"),
            "agent 'idle-agent' is still running",
        ),
        "event after close": (
            [*ev, {**ev[-1], "seq": len(ev) + 1}],
            "the match is closed",
        ),
        "unknown type": (
            [*ev[:3], {**ev[3], "type": "host_exploded"}],
            "unknown event type 'host_exploded'",
        ),
        "bad data": (
            _mutate(ev, 2, territory=None),
            "(host_provisioning): invalid data at territory",
        ),
        "not created first": (ev[1:], "the first event of a match must be match_created"),
        "out of order milestone": (
            _drop(
                ev,
                lambda e: (
                    e["type"] in ("attempt_started", "attempt_result", "milestone_passed")
                    and e["data"]["territory"] == "not-enabled"
                    and e["data"]["milestone"] == "write-read"
                ),
            ),
            "service-restart passed before write-read",
        ),
        "pass without passed attempt": (
            _drop(
                ev,
                lambda e: (
                    e["type"] == "attempt_result"
                    and e["data"]["territory"] == "in-memory"
                    and e["data"]["verdict"] == "passed"
                    and e["data"]["milestone"] == "service-up"
                ),
            ),
            "attempt 1 did not pass",
        ),
        "unknown territory": (
            _mutate(ev, _seq_of(ev, "competitor_done") if False else 2, territory="nowhere"),
            "unknown territory 'nowhere'",
        ),
        "winner not durable": (
            _mutate(ev, _seq_of(ev, "match_finished"), winner="idle"),
            "winner 'idle' is not durable",
        ),
        "unknown host state": (
            _mutate(ev, _seq_of(ev, "host_state", territory="idle", state="removed"), state="gone"),
            "unknown host state 'gone'",
        ),
        "provisioned twice": (
            [*ev[:9], {**ev[5], "seq": 10}],
            "territory state cannot go from 'ready' on 'provisioned'",
        ),
    }


@pytest.mark.parametrize("case", sorted(_impossible_logs()))
def test_impossible_logs_raise_a_clear_error(case: str) -> None:
    events, message = _impossible_logs()[case]
    with pytest.raises(EventLogError, match=r"^match demo1 seq \d+ ") as err:
        fold_dicts(events)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_an_empty_log_has_no_record() -> None:
    with pytest.raises(EventLogError, match="empty"):
        fold_events([])


def test_closed_record_states_are_final_for_every_machine() -> None:
    for machine in states.MACHINES:
        for state in machine.final:
            assert state in machine.states()
        # every state can reach a final state
        for state in machine.states():
            frontier, seen = [state], {state}
            while frontier:
                for target in machine.transitions.get(frontier.pop(), {}).values():
                    if target not in seen:
                        seen.add(target)
                        frontier.append(target)
            assert seen & machine.final, f"{machine.name}: {state} never ends"


def test_docs_show_the_state_machines_as_they_are() -> None:
    docs = (REPO / "docs" / "MATCHES.md").read_text()
    for machine in states.MACHINES:
        assert states.mermaid(machine) in docs, f"regenerate the {machine.name} diagram"


@settings(max_examples=150, deadline=None)
@given(events=match_strategy, cut=st.floats(0, 1))
def test_fold_is_deterministic(events: list[Envelope], cut: float) -> None:
    """Same events, same bytes: folded from dicts, from a JSON round trip (what the store
    gives back), and one event at a time; for any prefix of the log too."""
    prefix = events[: max(1, int(len(events) * cut))]
    for log in (events, prefix):
        once = fold_dicts(log).model_dump_json()
        stored = [StoredEvent(**json.loads(json.dumps(e))) for e in log]
        assert fold_events(stored).model_dump_json() == once
        folder = RecordFolder()
        for event in log:
            folder.apply(parse_event(event))
        assert folder.record().model_dump_json() == once


@settings(max_examples=150, deadline=None)
@given(events=match_strategy)
def test_every_closed_record_is_final(events: list[Envelope]) -> None:
    record = fold_dicts(events)
    assert record.match_state == "finished"
    for territory in record.territories.values():
        assert territory.state in states.TERRITORY.final
        assert territory.competitor_state in states.COMPETITOR.final
        assert not any(m.evaluating for m in territory.milestones.values())
        assert territory.milestone_points == sum(m.points for m in territory.milestones.values())
        assert (territory.durable_at_ms is not None) == (territory.competitor_state == "durable")
    for agent in record.agents.values():
        assert not agent.running
        assert agent.terminal_state is not None
        if agent.terminal_state != "completed":
            assert agent.terminal_detail
    if record.winner is not None:
        best = max(t.milestone_points for t in record.territories.values())
        assert record.territories[record.winner].milestone_points == best


def test_fold_bytes_do_not_depend_on_the_process(tmp_path: Path) -> None:
    """The record file is the same when folded by another interpreter with other hash seeds."""
    log = tmp_path / "events.json"
    log.write_text(json.dumps(demo_events()))
    here = fold_dicts(demo_events()).model_dump_json()
    script = (
        "import json, sys\n"
        "from opsarena.match.events import parse_event\n"
        "from opsarena.match.fold import fold_events\n"
        "events = json.load(open(sys.argv[1]))\n"
        "sys.stdout.write(fold_events(parse_event(e) for e in events).model_dump_json())\n"
    )
    for hash_seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", script, str(log)], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout == here


def test_a_resumed_match_keeps_the_quotas_it_was_created_with() -> None:
    challenge = builtin_challenge("durable-records")
    record = fold_dicts(_mutate(demo_events(), 1, disk_quota_mb=300, disk_inode_quota=40_000))
    assert (record.disk_quota_mb, record.disk_inode_quota) == (300, 40_000)
    plan = resumed_plan(record, challenge, b"s" * 16, b"n" * 16, driver="podman")
    assert (plan.disk_quota_mb, plan.disk_inode_quota) == (300, 40_000)
    older = fold_dicts(demo_events())  # logged before the quotas were
    assert (older.disk_quota_mb, older.disk_inode_quota) == (None, None)
    plan = resumed_plan(older, challenge, b"s" * 16, b"n" * 16, driver="podman")
    default = MatchPlan(challenge, [], 60.0)
    assert (plan.disk_quota_mb, plan.disk_inode_quota) == (
        default.disk_quota_mb,
        default.disk_inode_quota,
    )
