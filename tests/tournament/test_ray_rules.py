"""The rules behind `--ray` that need no cluster: lost matches in the tournament fold (no
retry charged, the same seed replayed), a worker node's capacity and what it lacks, and
the one-line refusals of `--ray` and `worker check`."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from opsarena.tournament import fold_tournament
from opsarena.tournament.capacity import (
    TERRITORIES_PER_CORE,
    NodeFacts,
    node_problems,
    node_territories,
)
from opsarena.tournament.record import LOST_REPLAYS
from tests.tournament.logs import created, log, started

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]


def ended(slot: int, attempt: int, match_id: str, **data: Any) -> tuple[str, dict[str, Any]]:
    return "slot_match_ended", {"slot": slot, "attempt": attempt, "match_id": match_id, **data}


def test_a_lost_match_charges_no_retry_and_its_replay_plays_the_same_seed() -> None:
    events = log(
        ("tournament_created", created()),
        ("tournament_started", {"parallel": 2}),
        started(1, 1, "tx-1"),
        ended(1, 1, "tx-1", counted=True, lost=True, why="lost to infrastructure: x"),
    )
    slot = fold_tournament(events).slots[0]
    assert slot.state == "void" and slot.attempts[0].lost and slot.attempts[0].counted is False
    assert (slot.charged_attempts, slot.lost_attempts) == (0, 1)
    assert not slot.settled(retries=0)  # a lost match is replayed even without retries
    assert slot.next_seed_attempt() == 1
    replay = ("slot_match_started", {"slot": 1, "attempt": 2, "match_id": "tx-1r1",
                                     "seed_attempt": 1})  # fmt: skip
    events = log(*[(e.type, e.data) for e in events], replay,
                 ended(1, 2, "tx-1r1", counted=False, why="the match was aborted"))  # fmt: skip
    slot = fold_tournament(events).slots[0]
    assert slot.attempts[1].seed_attempt == 1 and not slot.attempts[1].lost
    assert slot.next_seed_attempt() == 3  # a void (not lost) match: a fresh seed next
    assert (slot.charged_attempts, slot.settled(retries=1), slot.settled(retries=0)) == (
        1, False, True,
    )  # fmt: skip


def test_a_slot_that_keeps_losing_its_node_is_left_void() -> None:
    events: list[tuple[str, dict[str, Any]]] = [("tournament_created", created())]
    for attempt in range(1, LOST_REPLAYS + 2):
        mid = "tx-1" + (f"r{attempt - 1}" if attempt > 1 else "")
        events += [started(1, attempt, mid), ended(1, attempt, mid, counted=False, lost=True)]
    slot = fold_tournament(log(*events)).slots[0]
    assert slot.lost_attempts == LOST_REPLAYS + 1 and slot.settled(retries=5)
    shorter = fold_tournament(log(*events[:-2])).slots[0]
    assert not shorter.settled(retries=5)


FACTS = NodeFacts(
    podman="4.3.1", runc=True, image="localhost/opsarena-host:bookworm", image_present=True,
    cgroups="v2", cgroup_controllers=frozenset({"cpu", "memory", "pids", "io"}), cpus=2,
    memory_available_mb=22000, host_memory_mb=512,
)  # fmt: skip


def test_a_node_holds_territories_by_cores_and_by_memory() -> None:
    assert node_territories(FACTS) == 2 * TERRITORIES_PER_CORE
    assert node_territories(replace(FACTS, memory_available_mb=2000)) == 3  # 1600 // 512
    assert node_territories(replace(FACTS, memory_available_mb=100)) == 0
    assert node_problems(FACTS) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"podman": None}, "podman: missing"),
        ({"runc": False}, "runc: missing"),
        ({"image_present": False}, "not built (opsarena image build)"),
        ({"cgroups": "none", "cgroup_controllers": frozenset()}, "cgroups: none mounted"),
        ({"cgroup_controllers": frozenset({"cpu"})}, "controllers memory, pids missing"),
        ({"memory_available_mb": 300}, "memory: 300 MiB available holds no host"),
    ],
)
def test_each_missing_piece_is_one_line(change: dict[str, Any], expected: str) -> None:
    problems = node_problems(replace(FACTS, **change))
    assert len(problems) == 1 and expected in problems[0], problems


def test_worker_check_on_this_machine_and_with_a_missing_image() -> None:
    done = subprocess.run([*OPSARENA, "worker", "check"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "ready: ray start --address HEAD:6379 --resources=" in done.stdout
    missing = subprocess.run(
        [*OPSARENA, "worker", "check", "--image", "localhost/opsarena-none:x"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "image localhost/opsarena-none:x: not built (opsarena image build)" in missing.stderr
    assert "ready:" not in missing.stdout


def test_ray_needs_a_postgres_log(tmp_path: Path) -> None:
    file = tmp_path / "t.toml"
    file.write_text(
        'challenges = ["durable-records"]\n[territories.a]\nagent = "scripted:idle"\n'
        '[territories.b]\nagent = "scripted:idle"\n'
    )
    done = subprocess.run(
        [*OPSARENA, "tournament", "run", str(file), "--db", str(tmp_path / "x.db"),
         "--ray", "auto"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "opsarena: error: --ray needs a PostgreSQL event log every node can reach: "
        "--db postgresql://..."
    ]
    assert not (tmp_path / "x.db").exists()
