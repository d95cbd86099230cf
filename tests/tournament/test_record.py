"""The tournament fold, its refusals, and the rules that decide capacity and the ETA."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from opsarena.errors import EventLogError, TournamentError
from opsarena.match.record import AgentRecord, MatchRecord, MilestoneRecord, TerritoryRecord
from opsarena.store import SqliteEventStore
from opsarena.tournament import (
    eta_s,
    fold_tournament,
    machine_parallel,
    outcome_of,
    seed_commitment,
    void_reason,
)
from opsarena.tournament.record import TournamentFolder
from opsarena.tournament.runner import TournamentRunner, _start_ticks, is_alive, this_process
from tests.tournament.logs import SEED, created, ended, log, started


def test_a_whole_tournament_folds_and_reveals_its_seed_at_the_end() -> None:
    events = [
        ("tournament_created", created()),
        ("tournament_started", {"parallel": 2}),
        started(1, 1, "tx-1"),
        started(2, 1, "tx-2"),
        ended(2, 1, "tx-2", False),
        ended(1, 1, "tx-1", True),
        started(2, 2, "tx-2r1"),
    ]
    running = fold_tournament(log(*events))
    assert running.state == "running"
    assert running.seed is None
    assert running.seed_commitment == seed_commitment(bytes.fromhex(SEED))
    assert running.summary_counts() == {"pending": 0, "playing": 1, "counted": 1, "void": 0}
    assert running.counted_matches() == ["tx-1"]
    events += [ended(2, 2, "tx-2r1", True), ("tournament_finished", {})]
    done = fold_tournament(log(*events))
    assert done.state == "finished"
    assert done.seed == SEED
    assert done.counted_matches() == ["tx-1", "tx-2r1"]
    assert done.parallel == 2
    assert done.runs == 1
    assert done.last_sequence == len(events)


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([started(1, 1, "m")], "starts with tournament_created"),
        (
            [("tournament_created", created()), started(1, 1, "m"), started(1, 2, "m2")],
            "playing already",
        ),
        (
            [
                ("tournament_created", created()),
                started(1, 1, "m"),
                ended(1, 1, "m", False),
                started(2, 1, "m"),
            ],
            "played a second time",
        ),
        ([("tournament_created", created()), ended(1, 1, "m", True)], "no match m playing"),
        ([("tournament_created", created()), started(3, 1, "m")], "no slot 3"),
        ([("tournament_created", created()), started(1, 2, "m")], "out of order"),
        (
            [
                ("tournament_created", created()),
                ("tournament_finished", {}),
                ("tournament_started", {"parallel": 1}),
            ],
            "finished already",
        ),
        ([("tournament_created", created()), ("slot_exploded", {})], "unknown tournament event"),
    ],
)
def test_an_impossible_log_is_refused(
    events: list[tuple[str, dict[str, Any]]], message: str
) -> None:
    with pytest.raises(EventLogError, match=message):
        fold_tournament(log(*events))


def test_a_counted_slot_cannot_be_played_again() -> None:
    events = [("tournament_created", created()), started(1, 1, "m"), ended(1, 1, "m", True),
              started(1, 2, "m2")]  # fmt: skip
    with pytest.raises(EventLogError, match="counted already"):
        fold_tournament(log(*events))


def test_machine_parallel_is_bounded_by_cpus_and_memory() -> None:
    common = {"territories_per_match": 4, "host_memory_mb": 512}
    assert machine_parallel(2, cpus=2, memory_available_mb=20_000, **common) == 2
    assert machine_parallel(8, cpus=2, memory_available_mb=20_000, **common) == 2
    assert machine_parallel(8, cpus=16, memory_available_mb=5_000, **common) == 1
    assert machine_parallel(8, cpus=16, memory_available_mb=6_000, **common) == 2
    assert machine_parallel(3, cpus=1, memory_available_mb=100, **common) == 1


def test_eta_from_the_median_finished_match() -> None:
    assert eta_s([], pending=3, running_elapsed_s=[], parallel=2) is None
    assert eta_s([10.0, 12.0, 50.0], pending=4, running_elapsed_s=[3.0, 20.0], parallel=2) == (
        pytest.approx((4 * 12.0 + 9.0 + 0.0) / 2)
    )


def record(**changes: Any) -> MatchRecord:
    milestone = MilestoneRecord(passed=True, points=10, passed_at_ms=1500)
    base = MatchRecord(
        match_id="m",
        challenge="durable-records",
        challenge_title="t",
        seed=SEED,
        finish_mode="all",
        time_limit_s=60,
        drain_s=1,
        created_at="x",
        match_state="finished",
        finish_reason="all competitors finished",
        territories={
            "a": TerritoryRecord(
                agent="alpha",
                state="removed",
                competitor_state="durable",
                milestones={"m1": milestone},
                milestone_points=100,
                durable_at_ms=4000,
            ),
            "b": TerritoryRecord(
                agent="b",
                state="removed",
                competitor_state="failed",
                milestones={"m1": MilestoneRecord()},
            ),
        },
        agents={
            "alpha": AgentRecord(
                territory="a",
                model="scripted/reference",
                kind="scripted",
                terminal_state="completed",
                input_tokens=7,
                output_tokens=3,
                cost_microusd=1200,
            ),
            "b": AgentRecord(
                territory="b",
                model="scripted/idle",
                kind="scripted",
                terminal_state="completed",
                cost_known=False,
            ),
        },
    )
    return base.model_copy(update=changes)


def test_which_matches_count() -> None:
    assert void_reason(record()) is None
    assert void_reason(None) == "the match never started"
    assert "aborted" in str(void_reason(record(finish_reason="aborted")))
    assert "running" in str(void_reason(record(match_state="running")))
    spoiled = record()
    spoiled.agents["b"] = spoiled.agents["b"].model_copy(update={"terminal_state": "interrupted"})
    assert void_reason(spoiled) == "the arena interrupted b"


def test_an_outcome_is_named_by_agent_and_carries_usage() -> None:
    outcome = outcome_of(record())
    alpha, b = outcome.entries
    assert (alpha.competitor, alpha.durable_at_ms, alpha.points, alpha.last_passed_at_ms) == (
        "alpha", 4000, 100, 1500,
    )  # fmt: skip
    assert (alpha.input_tokens, alpha.output_tokens, alpha.cost_microusd) == (7, 3, 1200)
    assert (b.durable_at_ms, b.last_passed_at_ms, b.cost_known) == (None, None, False)
    assert outcome.ranked() == [("alpha", 1), ("b", 2)]


def test_a_live_controller_is_recognised_and_a_dead_one_is_not() -> None:
    me = this_process()
    assert me is not None and is_alive(me)
    assert not is_alive(me.model_copy(update={"start_ticks": me.start_ticks + 1}))
    assert not is_alive(me.model_copy(update={"boot_id": "another boot"}))
    child = subprocess.Popen(["true"])
    child.wait()
    assert _start_ticks(child.pid) is None


async def test_resume_refuses_a_tournament_whose_controller_still_runs(tmp_path: Path) -> None:
    me = this_process()
    assert me is not None
    with SqliteEventStore(tmp_path / "log.db") as store:
        await store.append("tournament:tx", "tournament_created", created(), 0)
        started = {"parallel": 1, "controller": me.model_dump()}
        await store.append("tournament:tx", "tournament_started", started, 1)
        with pytest.raises(TournamentError, match=f"being played by process {me.pid}"):
            await TournamentRunner.resume(store, "tx")


def test_the_incremental_folder_agrees_with_the_whole_fold() -> None:
    events = log(
        ("tournament_created", created()),
        ("tournament_started", {"parallel": 2}),
        started(1, 1, "tx-1"),
        ended(1, 1, "tx-1", False),
        started(1, 2, "tx-1r1"),
        ended(1, 2, "tx-1r1", True),
    )
    folder = TournamentFolder()
    for count, event in enumerate(events, 1):
        folder.apply(event)
        whole = fold_tournament(events[:count], reveal_seed=True)
        assert folder.record(reveal_seed=True).model_dump() == whole.model_dump()
    assert folder.record().seed is None  # still running: not revealed unless asked
    with pytest.raises(EventLogError, match="expected seq 7"):
        folder.apply(events[0].__class__(**{**events[2].__dict__, "seq": 9}))
