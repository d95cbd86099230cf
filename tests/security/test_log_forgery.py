"""Red team: rows forged into the event log are found, named and set aside; nothing crashes.

The issue's attack: a command agent inserted ten rows for its own match, and the
controller died on `UNIQUE constraint failed`, a neighbour's durable result was never
recorded, and `opsarena resume` failed the same way. A command agent can no longer reach
the log at all (the agent cage; tests/security/test_agents_cage.py); so here the same rows
are forged by a process outside the cage (the worst case: someone who got write access to
the file) into a running match (real hosts), and into the log of a match whose controller
died (resume).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsarena.challenges.catalog import find_challenge
from opsarena.match.commitment import new_nonce, seed_commitment
from opsarena.match.events import (
    AgentStarted,
    EventData,
    HostProvisioned,
    HostProvisioning,
    MatchCreated,
    MatchStarted,
    MilestoneSpec,
    Preflight,
    TerritorySpec,
)
from opsarena.store import SqliteEventStore
from tests.conftest import ArenaRuns, new_match_id
from tests.security.hunters import CAREFUL_FORGER, FORGER

pytestmark = pytest.mark.hosts

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OPSARENA, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def play_while_forging(runs: ArenaRuns, db: Path, work: Path) -> subprocess.CompletedProcess[str]:
    """`opsarena run` of `ref` (reference) and `idle`, with the forger in `work` run from
    outside the cage once the match has started; returns the run's result."""
    run = runs.start(
        db,
        [*OPSARENA, "run", "--quiet", "--db", str(db), "--time-limit", "120",
         "--builder", "idle=scripted:idle", "--builder", "ref=scripted:reference"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        match_id = _started_match(db, run)
        forged = subprocess.run(
            [sys.executable, str(work / "forger.py"), str(work)],
            env={**os.environ, "OPSARENA_MATCH": match_id},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert forged.returncode == 0, forged.stderr
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    return subprocess.CompletedProcess(run.args, run.returncode, out, err)


def _started_match(db: Path, run: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert run.poll() is None, "the match ended before it could be forged"
        if db.exists():
            try:
                with sqlite3.connect(db) as conn:
                    row = conn.execute(
                        "SELECT match_id FROM events WHERE type = 'match_started' LIMIT 1"
                    ).fetchone()
            except sqlite3.OperationalError:  # the run is still creating the schema
                row = None
            if row is not None:
                return str(row[0])
        time.sleep(0.2)
    raise AssertionError("the match did not start")


def test_ten_forged_rows_in_a_running_match_are_quarantined_and_the_match_goes_on(
    arena_runs: ArenaRuns,
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    work = tmp_path / "forger"
    work.mkdir()
    (work / "forger.py").write_text(FORGER)
    (work / "db").write_text(str(db))
    played = play_while_forging(arena_runs, db, work)
    assert played.returncode == 0, played.stderr
    first = int((work / "forged").read_text())
    match_id = cli("ls", "--db", str(db)).stdout.splitlines()[1].split()[0]
    record = json.loads(cli("show", match_id, "--json", "--db", str(db)).stdout)
    # The neighbour's durable result is recorded; the forged "done" changed nothing.
    assert record["match_state"] == "finished" and record["winner"] == "ref"
    assert record["territories"]["ref"]["durable_at_ms"] is not None
    assert record["territories"]["ref"]["done_by"] is None
    assert record["log_quarantined"] == [f"seq {first}: 10 rows"]
    verified = cli("verify", match_id, "--db", str(db))
    assert verified.returncode == 1, verified.stdout + verified.stderr
    lines = verified.stdout.splitlines()
    assert len(lines) == 10, lines
    assert lines[0].startswith(f"match {match_id} seq {first}: a competitor_done row")
    assert "did not append, quarantined" in lines[0]


def test_an_edit_with_the_chain_redone_is_still_found_by_the_controller_at_the_close(
    arena_runs: ArenaRuns,
    tmp_path: Path,
) -> None:
    """The chain holds no secret: a forger with the file can edit an event and redo every
    hash after it, and the chain verifies. The controller remembers what it wrote and
    finds the edit at the close; `verify` then names the seq from the log itself."""
    db = tmp_path / "log.db"
    work = tmp_path / "careful"
    work.mkdir()
    (work / "forger.py").write_text(CAREFUL_FORGER)
    (work / "db").write_text(str(db))
    played = play_while_forging(arena_runs, db, work)
    assert played.returncode == 0, played.stderr
    edited = int((work / "forged").read_text())
    match_id = cli("ls", "--db", str(db)).stdout.splitlines()[1].split()[0]
    record = json.loads(cli("show", match_id, "--json", "--db", str(db)).stdout)
    assert record["match_state"] == "finished" and record["winner"] == "ref"
    assert record["log_altered"] == [edited]
    verified = cli("verify", match_id, "--db", str(db))
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert verified.stdout.splitlines() == [
        f"match {match_id} seq {edited}: altered after the arena appended it (found at the "
        f"close, log_tampered at seq {record['last_sequence'] - 1})"
    ]


def _append(store: SqliteEventStore, match_id: str, event: EventData, t_ms: int = 0) -> int:
    return store.append_blocking(match_id, event.event_type, event.model_dump(mode="json"), t_ms)


def _dead_controller_log(db: Path) -> tuple[str, bytes]:
    """The log of a started match whose controller died, as it wrote it: (id, seed)."""
    challenge = find_challenge("durable-records")
    match_id = new_match_id("forged")
    seed, nonce = b"\x5e\xed" * 8, new_nonce()
    with SqliteEventStore(db) as store:
        store.vault().put(match_id, {"seed": seed.hex(), "nonce": nonce.hex()})
        created = MatchCreated(
            match_id=match_id,
            challenge=challenge.name,
            challenge_title=challenge.title,
            seed_commitment=seed_commitment(match_id, nonce, seed),
            finish_mode="first-durable",
            time_limit_s=60,
            drain_s=1,
            milestones=[MilestoneSpec(id=m.id, points=m.points) for m in challenge.milestones],
            territories={"a": TerritorySpec(agent="a", model="scripted:idle", kind="scripted")},
        )
        for event in (
            created,
            HostProvisioning(territory="a"),
            HostProvisioned(territory="a", host=f"opsarena-{match_id}-gone", provision_ms=1),
            Preflight(territory="a", ok=True),
            MatchStarted(),
            AgentStarted(agent="a", territory="a"),
        ):
            _append(store, match_id, event)
    return match_id, seed


def _forge_ten(db: Path, match_id: str, first: int) -> None:
    with sqlite3.connect(db) as conn:
        for seq in range(first, first + 10):
            conn.execute(
                "INSERT INTO events (match_id, seq, type, t_ms, wall, data) VALUES (?,?,?,?,?,?)",
                (match_id, seq, "competitor_done", 1, "w", json.dumps({"territory": "a"})),
            )


def test_resume_sets_a_forged_tail_aside_and_closes_the_match(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    match_id, seed = _dead_controller_log(db)
    _forge_ten(db, match_id, 7)
    resumed = cli("resume", match_id, "--quiet", "--db", str(db))
    assert resumed.returncode == 0, resumed.stderr
    record = json.loads(cli("show", match_id, "--json", "--db", str(db)).stdout)
    # Its host is gone (it never existed): the match is aborted and closed, not stuck.
    assert record["match_state"] == "finished" and record["finish_reason"] == "aborted"
    assert record["log_quarantined"] == ["seq 7: 10 rows"]
    assert record["seed"] == seed.hex()
    verified = cli("verify", match_id, "--db", str(db))
    assert verified.returncode == 1
    assert verified.stdout.splitlines()[0].startswith(f"match {match_id} seq 7: a competitor_done")


def test_resume_refuses_a_log_edited_below_later_events_naming_the_seq(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    match_id, _ = _dead_controller_log(db)
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE events SET data = json_set(data, '$.ok', json('false')) "
            "WHERE match_id = ? AND seq = 4",
            (match_id,),
        )
        before = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    resumed = cli("resume", match_id, "--quiet", "--db", str(db))
    assert resumed.returncode == 2
    assert resumed.stderr.strip().splitlines() == [
        f"opsarena: error: match {match_id}: the event log is broken at seq 4 (the preflight "
        f"row does not match its hash (edited)), below events appended after it; the record "
        f"cannot be trusted, so it is not resumed: opsarena verify {match_id}"
    ]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == before
    verified = cli("verify", match_id, "--db", str(db))
    assert verified.returncode == 1
    assert verified.stdout.splitlines() == [
        f"match {match_id} seq 4: the preflight row does not match its hash (edited)"
    ]
