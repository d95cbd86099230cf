"""`opsarena show`, `ls` and `events` as a user runs them, against a filled SQLite log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opsarena.store import SqliteEventStore, event_hash
from tests.match.simulated import DEMO_PLANS, Plan, demo_events, fold_dicts, simulate


def opsarena(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "OPSARENA_DB"}
    return subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", *args],
        env={**base, "COLUMNS": "250", **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def fill(db: Path, events: list[dict[str, object]]) -> None:
    with SqliteEventStore(db) as store:
        for e in events:
            seq = store.append_blocking(
                str(e["match_id"]),
                str(e["type"]),
                e["data"],
                int(e["t_ms"]),
                wall=str(e["wall"]),  # type: ignore[arg-type, call-overload]
            )
            assert seq == e["seq"]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "records.db"
    fill(path, demo_events("demo1"))
    fill(path, simulate("late2", {"solo": Plan(passes=1)})[:12])  # still running
    return path


def test_show_json_is_the_folded_record(db: Path) -> None:
    out = opsarena("show", "demo1", "--json", "--db", str(db))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == json.loads(fold_dicts(demo_events("demo1")).model_dump_json())


def test_show_summarises_the_match(db: Path) -> None:
    out = opsarena("show", "demo1", "--db", str(db))
    assert out.returncode == 0, out.stderr
    assert "winner: reference" in out.stdout
    assert "first durable deployment" in out.stdout
    for name in DEMO_PLANS:
        assert name in out.stdout
    assert "post-match drain deadline expired" in out.stdout
    assert "record_missing" in out.stdout


def test_ls_lists_matches_with_state_winner_and_duration(db: Path) -> None:
    out = opsarena("ls", env={"OPSARENA_DB": str(db)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    demo = next(line for line in lines if "demo1" in line)
    late = next(line for line in lines if "late2" in line)
    record = fold_dicts(demo_events("demo1"))
    assert "durable-records" in demo and "reference" in demo
    assert "finished" in demo and "first durable deployment" in demo
    assert f"{record.elapsed_ms / 1000:.1f}s" in demo
    assert "running" in late


def test_events_prints_the_log_in_order(db: Path) -> None:
    events = demo_events("demo1")
    out = opsarena("events", "demo1", "--db", str(db))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(events)
    assert lines[0].split()[:3] == ["1", f"{events[0]['t_ms']}ms", "match_created"]
    as_json = opsarena("events", "demo1", "--json", "--after", "10", "--db", str(db))
    parsed = [json.loads(line) for line in as_json.stdout.splitlines()]
    hashes = [(event.pop("prev_hash"), event.pop("hash")) for event in parsed]
    assert parsed == events[10:]
    # Each line carries the chain: anyone can recompute it from this output alone.
    for event, (prev_hash, digest) in zip(parsed, hashes, strict=True):
        fields = {k: event[k] for k in ("match_id", "seq", "t_ms", "wall", "data")}
        assert digest == event_hash(**fields, event_type=event["type"], prev_hash=prev_hash)
    assert all(prev == before for (prev, _), (_, before) in zip(hashes[1:], hashes, strict=False))


def test_events_follow_ends_when_the_match_closes(db: Path) -> None:
    done = opsarena("events", "demo1", "--follow", "--db", str(db))
    assert done.returncode == 0 and len(done.stdout.splitlines()) == len(demo_events("demo1"))
    rest = simulate("late2", {"solo": Plan(passes=1)})
    follower = subprocess.Popen(
        [sys.executable, "-m", "opsarena.cli.main", "events", "late2", "-f", "--json"],
        env={**os.environ, "OPSARENA_DB": str(db)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        with SqliteEventStore(db) as store:
            for e in rest[12:]:
                store.append_blocking("late2", str(e["type"]), e["data"], int(e["t_ms"]))  # type: ignore[arg-type]
        stdout, _ = follower.communicate(timeout=60)
    finally:
        follower.kill()  # it follows until the match closes: never past the test
        follower.wait()
    assert follower.returncode == 0
    assert [json.loads(line)["seq"] for line in stdout.splitlines()] == list(
        range(1, len(rest) + 1)
    )


@pytest.mark.parametrize(
    "command", [["show", "nope"], ["show", "nope", "--json"], ["events", "nope"]]
)
def test_an_unknown_match_is_one_line_and_exit_2(db: Path, command: list[str]) -> None:
    out = opsarena(*command, "--db", str(db))
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1
    assert "no match 'nope'" in out.stderr and "opsarena ls" in out.stderr


def test_a_log_that_is_not_ours_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("not a database at all\n" * 50)
    out = opsarena("ls", "--db", str(bad))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "not an opsarena event log" in out.stderr


def test_an_impossible_log_is_shown_as_such(tmp_path: Path) -> None:
    path = tmp_path / "broken.db"
    events = demo_events("broken")
    fill(path, events[:-5])  # without the hosts' removal and match_closed
    with SqliteEventStore(path) as store:
        store.append_blocking("broken", "match_closed", {}, 99_999)
    out = opsarena("show", "broken", "--db", str(path))
    assert out.returncode == 2
    assert "still" in out.stderr and out.stderr.count("\n") == 1
    listed = opsarena("ls", "--db", str(path))
    assert listed.returncode == 0 and "invalid log" in listed.stdout


def test_verify_passes_an_intact_log_and_says_exit_2_for_bad_input(tmp_path: Path) -> None:
    from tests.match.simulated import NONCE, SEED, committed_events

    db = tmp_path / "verify.db"
    fill(db, committed_events("v1"))
    ok = opsarena("verify", "v1", "--db", str(db))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    [line] = ok.stdout.splitlines()
    assert line.startswith(f"match v1: {len(committed_events('v1'))} events, hash chain intact")
    assert line.endswith(f"revealed seed {SEED.hex()} matches its commitment")
    assert NONCE.hex() not in line
    unknown = opsarena("verify", "nope", "--db", str(db))
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1
    assert "no match 'nope'" in unknown.stderr
    missing = opsarena("verify", "v1", "--db", str(tmp_path / "absent.db"))
    assert missing.returncode == 2 and "no event log at" in missing.stderr
    assert not (tmp_path / "absent.db").exists()
