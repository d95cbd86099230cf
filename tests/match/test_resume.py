"""A controller killed with SIGKILL: `opsarena resume` continues or cleanly aborts."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsarena.match.fold import fold_events
from opsarena.match.record import MatchRecord
from opsarena.store import SqliteEventStore
from tests.agents.contexts import script
from tests.conftest import ArenaRuns, podman_names, wait_for_event

pytestmark = pytest.mark.hosts

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]


def start_match(
    runs: ArenaRuns, db: Path, *builders: str, drain_s: int = 10, options: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    args = [arg for b in builders for arg in ("--builder", b)]
    return runs.start(
        db,
        [*OPSARENA, "run", "--quiet", "--db", str(db), "--time-limit", "120",
         "--drain", str(drain_s), *options, *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def kill_after(process: subprocess.Popen[bytes], db: Path, event_type: str) -> str:
    try:
        match_id = wait_for_event(db, event_type)
    except BaseException:
        process.kill()
        raise
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    return match_id


def events_of(db: Path, match_id: str) -> list[tuple[int, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT seq, type FROM events WHERE match_id = ? ORDER BY seq", (match_id,)
        ).fetchall()


def seqs_of(db: Path, match_id: str, event_type: str) -> list[int]:
    return [seq for seq, kind in events_of(db, match_id) if kind == event_type]


def record_of(db: Path, match_id: str) -> MatchRecord:
    with SqliteEventStore(db) as store:
        return fold_events(store.read_blocking(match_id))


def resume(db: Path, match_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OPSARENA, "resume", match_id, "--quiet", "--db", str(db)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_resume_continues_a_match_with_its_hosts(arena_runs: ArenaRuns, tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    quotas = ("--disk-quota", "300", "--inode-quota", "40000")
    process = start_match(
        arena_runs, db, "ref=scripted:reference", "mem=scripted:in-memory", options=quotas
    )
    match_id = kill_after(process, db, "agent_ended")
    truncate_log(db, match_id, seqs_of(db, match_id, "agent_ended")[0])  # as if killed then
    before = events_of(db, match_id)
    assert podman_names(match_id), "the killed controller's hosts should still be there"
    try:
        resumed = resume(db, match_id)
        assert resumed.returncode == 0, resumed.stderr
        after = events_of(db, match_id)
        assert after[: len(before)] == before  # nothing committed was lost or rewritten
        assert [seq for seq, _ in after] == list(range(1, len(after) + 1))
        assert ("match_resumed" in {t for _, t in after}) and after[-1][1] == "match_closed"
        record = record_of(db, match_id)
        assert record.match_state == "finished" and record.winner == "ref"
        assert record.territories["ref"].milestone_points == 100
        assert (record.disk_quota_mb, record.disk_inode_quota) == (300, 40_000)  # resumed so
        for agent in record.agents.values():
            assert agent.terminal_state in ("completed", "interrupted")
        assert "finished already" in resume(db, match_id).stderr
        assert podman_names(match_id) == [], "resume must remove the hosts when it closes"
    finally:
        subprocess.run([*OPSARENA, "hosts", "cleanup", "--match", match_id], check=False)
    assert podman_names(match_id) == []


def test_resume_aborts_when_the_hosts_are_gone(arena_runs: ArenaRuns, tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    process = start_match(arena_runs, db, "a=scripted:idle", "b=scripted:wrong-health")
    match_id = kill_after(process, db, "match_started")
    subprocess.run([*OPSARENA, "hosts", "cleanup", "--match", match_id], check=True)
    resumed = resume(db, match_id)
    assert resumed.returncode == 0, resumed.stderr
    shown = subprocess.run(
        [*OPSARENA, "show", match_id, "--json", "--db", str(db)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    record = json.loads(shown.stdout)
    assert record["finish_reason"] == "aborted" and record["match_state"] == "finished"
    assert record["infrastructure_failures"] >= 1
    assert record["winner"] is None
    assert podman_names(match_id) == []


def test_kill_loop_loses_no_event_and_leaks_no_host(arena_runs: ArenaRuns, tmp_path: Path) -> None:
    """SIGKILL at random moments; every committed event survives, resume closes each."""
    import random

    rng = random.Random(7)
    for round_ in range(3):
        db = tmp_path / f"loop{round_}.db"
        process = start_match(arena_runs, db, "a=scripted:reference", "b=scripted:volatile")
        try:
            wait_for_event(db, "match_created")
            time.sleep(rng.uniform(0.5, 12.0))
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
        with sqlite3.connect(db) as conn:
            match_id = conn.execute("SELECT match_id FROM events LIMIT 1").fetchone()[0]
        before = events_of(db, match_id)
        resumed = resume(db, match_id)
        after = events_of(db, match_id)
        assert after[: len(before)] == before
        assert [seq for seq, _ in after] == list(range(1, len(after) + 1))
        if before[-1][1] != "match_closed":
            assert resumed.returncode == 0, resumed.stderr
            assert after[-1][1] == "match_closed"
        assert podman_names(match_id) == [], "a resumed match leaves no host"
        subprocess.run([*OPSARENA, "hosts", "cleanup", "--match", match_id], check=False)
        assert podman_names(match_id) == []


def test_resume_after_a_kill_during_a_host_reboot(arena_runs: ArenaRuns, tmp_path: Path) -> None:
    """Killed while the referee rebooted a host: the log says "rebooting"; resume must
    see the host ready again and finish the match."""
    db = tmp_path / "log.db"
    process = start_match(arena_runs, db, "ref=scripted:reference")
    match_id = kill_after(process, db, "host_state")  # the first host_state is "rebooting"
    try:
        # The kill lands a poll later; cut the log back so it ends at "rebooting".
        truncate_log(db, match_id, seqs_of(db, match_id, "host_state")[0])
        assert record_of(db, match_id).territories["ref"].state == "rebooting"
        resumed = resume(db, match_id)
        assert resumed.returncode == 0, resumed.stderr
        after = events_of(db, match_id)
        assert after[-1][1] == "match_closed"
        assert [seq for seq, _ in after] == list(range(1, len(after) + 1))
        # The reboot the kill cut off (the host may have been left stopped between its
        # kill and its start) is brought back: the match goes on, it is not lost.
        record = record_of(db, match_id)
        assert record.finish_reason != "aborted", record.finish_reason
        assert record.territories["ref"].state != "lost"
        assert podman_names(match_id) == []
    finally:
        subprocess.run([*OPSARENA, "hosts", "cleanup", "--match", match_id], check=False)


def truncate_log(db: Path, match_id: str, last_seq: int) -> None:
    """Make the log what a controller killed right after event `last_seq` leaves."""
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM events WHERE match_id = ? AND seq > ?", (match_id, last_seq))
        seq, kind, t_ms = conn.execute(
            "SELECT seq, type, t_ms FROM events WHERE match_id = ? ORDER BY seq DESC LIMIT 1",
            (match_id,),
        ).fetchone()
        conn.execute(
            "UPDATE matches SET last_seq = ?, last_type = ?, last_t_ms = ? WHERE match_id = ?",
            (seq, kind, t_ms, match_id),
        )


@pytest.mark.parametrize("provisioning", [1, 3], ids=["one-started", "all-started"])
def test_resume_after_a_kill_during_provisioning_aborts_and_removes_everything(
    arena_runs: ArenaRuns, tmp_path: Path, provisioning: int
) -> None:
    """Killed after `provisioning` of three host_provisioning events: territories still
    `pending` close as not-provisioned, those provisioning as failed, and every host the
    killed controller made is removed."""
    db = tmp_path / "log.db"
    process = start_match(arena_runs, db, "a=scripted:idle", "b=scripted:idle", "c=scripted:idle")
    match_id = kill_after(process, db, "preflight")
    try:
        starts = seqs_of(db, match_id, "host_provisioning")
        truncate_log(db, match_id, starts[provisioning - 1])
        assert podman_names(match_id), "the killed controller's hosts should still be there"
        resumed = resume(db, match_id)
        assert resumed.returncode == 0, resumed.stderr
        after = events_of(db, match_id)
        assert after[-1][1] == "match_closed"
        record = record_of(db, match_id)
        states = sorted(t.state for t in record.territories.values())
        expected = ["failed"] * provisioning + ["not-provisioned"] * (3 - provisioning)
        assert states == sorted(expected)
        assert record.finish_reason == "aborted"
        assert podman_names(match_id) == [], "hosts half-made by the killed controller are removed"
    finally:
        subprocess.run([*OPSARENA, "hosts", "cleanup", "--match", match_id], check=False)


def test_resume_after_a_kill_while_draining_closes_the_match(
    arena_runs: ArenaRuns, tmp_path: Path
) -> None:
    """Killed after match_finished (winner decided, an agent ignoring SIGTERM keeps the
    drain going, hosts still up): resume keeps the winner, ends the agents, removes the
    hosts and closes."""
    db = tmp_path / "log.db"
    stubborn = script(tmp_path / "stubborn.sh", "#!/bin/sh\ntrap '' TERM\nsleep 300\n")
    process = start_match(
        arena_runs, db, "ref=scripted:reference", f"slow=command:{stubborn}", drain_s=60
    )
    match_id = kill_after(process, db, "match_finished")
    try:
        assert podman_names(match_id), "the drain should still hold the hosts"
        assert processes_running(str(stubborn)), "the agent should outlive its controller"
        resumed = resume(db, match_id)
        assert resumed.returncode == 0, resumed.stderr
        record = record_of(db, match_id)
        assert record.match_state == "finished" and record.winner == "ref"
        assert record.finish_reason == "first durable deployment"
        assert {t.state for t in record.territories.values()} == {"removed"}
        assert all(not agent.running for agent in record.agents.values())
        assert podman_names(match_id) == [], "resume must remove the hosts when it closes"
        assert processes_running(str(stubborn)) == [], "the dead controller's agent survived"
    finally:
        subprocess.run([*OPSARENA, "hosts", "cleanup", "--match", match_id], check=False)
        subprocess.run(["pkill", "-KILL", "-f", str(stubborn)], check=False)


def processes_running(pattern: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return found.stdout.split()
