"""The SQLite event log against the `EventStore` contract, with real files and processes."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import platformdirs
import pytest

from opsarena.errors import NoEventLogError, StoreError
from opsarena.store import (
    GENESIS,
    MAX_EVENT_BYTES,
    SqliteEventStore,
    StoredEvent,
    default_db_path,
    event_hash,
    open_store,
)
from opsarena.store.sqlite import SCHEMA_VERSION

OLD = "2000-01-01T00:00:00.000Z"

WRITER = """
import sys
from opsarena.store import SqliteEventStore
path, match_id, writer, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = SqliteEventStore(path)
for i in range(count):
    seq = store.append_blocking(match_id, "agent_output", {"writer": writer, "i": i}, i)
    print(seq, flush=True)
"""


def writer(db: Path, match_id: str, name: str, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db), match_id, name, str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "events.db"


async def test_append_read_and_summaries(db: Path) -> None:
    with SqliteEventStore(db) as store:
        assert await store.append("m1", "match_created", {"a": 1}, -5, wall=OLD) == 1
        assert await store.append("m1", "host_provisioning", {"é": "ü"}, 3) == 2
        assert await store.append("m2", "match_created", {}, 0) == 1
        assert await store.append("m1", "match_started", {}, 0) == 3
        events = await store.read("m1")
        assert [(e.seq, e.type, e.t_ms) for e in events] == [
            (1, "match_created", -5), (2, "host_provisioning", 3), (3, "match_started", 0),
        ]  # fmt: skip
        first_hash = event_hash("m1", 1, "match_created", -5, OLD, {"a": 1}, GENESIS)
        assert events[0] == StoredEvent(
            "m1", 1, "match_created", -5, OLD, {"a": 1}, GENESIS, first_hash
        )
        assert events[1].prev_hash == first_hash and events[2].prev_hash == events[1].hash
        assert events[1].data == {"é": "ü"} and events[1].wall.endswith("Z")
        assert [e.seq for e in await store.read("m1", after=1, limit=1)] == [2]
        assert await store.read("nope") == []
        assert (await store.exists("m1"), await store.exists("nope")) == (True, False)
        summary = await store.summary("m1")
        assert summary is not None
        assert (summary.last_seq, summary.last_type, summary.created_wall) == (
            3, "match_started", OLD
        )  # fmt: skip
        assert await store.summary("nope") is None
        assert [m.match_id for m in await store.list_matches()] == ["m2", "m1"]  # newest first
        assert len(await store.list_matches(limit=1)) == 1


async def test_the_file_is_wal_with_durable_commits(db: Path) -> None:
    with SqliteEventStore(db) as store:
        await store.append("m", "x", {}, 0)
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert store._conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000
    other = sqlite3.connect(db)
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert other.execute("SELECT version FROM opsarena_schema").fetchall() == [(SCHEMA_VERSION,)]
    with pytest.raises(sqlite3.IntegrityError):
        other.execute("INSERT INTO events (match_id, seq, type, t_ms, wall, data)"
                      " VALUES ('m', 1, 'x', 0, 'w', '{}')")  # fmt: skip
    other.close()


async def test_bad_event_data_is_refused(db: Path) -> None:
    with SqliteEventStore(db) as store:
        with pytest.raises(ValueError, match="over the"):
            await store.append("m", "agent_output", {"text": "x" * MAX_EVENT_BYTES}, 0)
        with pytest.raises(ValueError, match="JSON object"):
            await store.append("m", "x", ["not", "a", "dict"], 0)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await store.append("m", "x", {"bytes": b"raw"}, 0)
        assert await store.exists("m") is False  # nothing half-written


async def test_appends_from_many_tasks_of_one_process_are_gap_free(db: Path) -> None:
    with SqliteEventStore(db) as store:
        seqs = await asyncio.gather(*(store.append("m", "x", {"i": i}, i) for i in range(200)))
        assert sorted(seqs) == list(range(1, 201))
        assert [e.seq for e in await store.read("m")] == list(range(1, 201))


def test_appends_from_many_processes_never_gap_or_duplicate(db: Path) -> None:
    SqliteEventStore(db).close()
    writers = [writer(db, "shared", f"w{i}", 150) for i in range(4)]
    writers.append(writer(db, "other", "o", 50))
    outputs = [w.communicate(timeout=120)[0] for w in writers]
    assert [w.returncode for w in writers] == [0] * 5
    with SqliteEventStore(db) as store:
        events = store.read_blocking("shared")
        assert [e.seq for e in events] == list(range(1, 601))
        for index, output in enumerate(outputs[:4]):
            mine = [e for e in events if e.data["writer"] == f"w{index}"]
            assert [e.data["i"] for e in mine] == list(range(150))  # each writer's order kept
            assert [e.seq for e in mine] == [int(line) for line in output.split()]
        assert [e.seq for e in store.read_blocking("other")] == list(range(1, 51))
        assert store.summary_blocking("shared").last_seq == 600  # type: ignore[union-attr]


def test_a_killed_writer_loses_no_committed_event(db: Path) -> None:
    SqliteEventStore(db).close()
    proc = writer(db, "crash", "w", 1_000_000)
    assert proc.stdout is not None
    acknowledged: list[int] = []
    for line in proc.stdout:
        acknowledged.append(int(line))
        if len(acknowledged) == 300:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with SqliteEventStore(db) as store:
        stored = [e.seq for e in store.read_blocking("crash")]
    assert stored == list(range(1, len(stored) + 1))  # gap-free
    assert set(acknowledged) <= set(stored)  # every append that returned is there
    check = sqlite3.connect(db)
    assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    check.close()


async def test_follow_sees_events_appended_by_another_process(db: Path) -> None:
    with SqliteEventStore(db) as store:
        await store.append("live", "match_created", {}, 0)
        proc = writer(db, "live", "w", 40)
        seen: list[StoredEvent] = []

        async def collect() -> None:
            async for event in store.follow("live", after=0, poll_s=0.02):
                seen.append(event)
                if len(seen) == 41:
                    return

        await asyncio.wait_for(collect(), timeout=60)
        await asyncio.to_thread(proc.wait, 60)
    assert [e.seq for e in seen] == list(range(1, 42))
    assert [e.data.get("i") for e in seen[1:]] == list(range(40))


def test_a_file_that_is_not_sqlite_is_refused(db: Path) -> None:
    db.write_text("hello, I am a text file\n" * 100)
    with pytest.raises(StoreError, match="is not an opsarena event log") as err:
        SqliteEventStore(db)
    assert "\n" not in str(err.value)
    assert db.read_text().startswith("hello")


def test_another_sqlite_database_is_refused_and_left_alone(db: Path) -> None:
    foreign = sqlite3.connect(db)
    foreign.execute("CREATE TABLE notes (body TEXT)")
    foreign.commit()
    foreign.close()
    with pytest.raises(StoreError, match="SQLite database but not an opsarena event log"):
        SqliteEventStore(db)
    check = sqlite3.connect(db)
    assert check.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not switched to WAL
    check.close()

    with pytest.raises(StoreError, match="SQLite database but not an opsarena event log"):
        SqliteEventStore(db, read_only=True)  # a reader says the same


def test_a_reader_of_a_log_being_created_is_told_there_is_none_yet(db: Path) -> None:
    """A writer creates the file (0600) before its tables: a reader in that window (a
    scoreboard started with the match) hears "no event log yet", never "not ours"; once
    the tables are there it reads."""
    db.touch()
    with pytest.raises(NoEventLogError, match=r"no event log at .* yet: the file is empty"):
        SqliteEventStore(db, read_only=True)
    SqliteEventStore(db).close()
    SqliteEventStore(db, read_only=True).close()
    with pytest.raises(NoEventLogError, match="no event log at"):
        SqliteEventStore(db.with_name("absent.db"), read_only=True)


def test_a_newer_schema_is_refused(db: Path) -> None:
    SqliteEventStore(db).close()
    newer = sqlite3.connect(db)
    newer.execute("UPDATE opsarena_schema SET version = ?", (SCHEMA_VERSION + 1,))
    newer.commit()
    newer.close()
    with pytest.raises(StoreError, match="newer than this opsarena understands"):
        SqliteEventStore(db)


def test_reopening_keeps_the_events(db: Path) -> None:
    with open_store(db) as store:
        asyncio.run(store.append("m", "x", {"k": 1}, 0))
    with open_store(db) as store:
        assert asyncio.run(store.append("m", "y", {}, 1)) == 2
        assert [e.type for e in asyncio.run(store.read("m"))] == ["x", "y"]


def test_default_path_and_its_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPSARENA_DB", raising=False)
    assert default_db_path() == platformdirs.user_data_path("opsarena") / "opsarena.db"
    monkeypatch.setenv("OPSARENA_DB", str(tmp_path / "sub" / "x.db"))
    assert default_db_path() == tmp_path / "sub" / "x.db"
    # A directory the user named is theirs to make: only the default one is created.
    with pytest.raises(StoreError, match=r"its directory .*sub does not exist"):
        SqliteEventStore()
    assert not (tmp_path / "sub").exists()
    (tmp_path / "sub").mkdir()
    with SqliteEventStore() as store:
        assert store.path == tmp_path / "sub" / "x.db"
    assert (tmp_path / "sub" / "x.db").exists()


def test_stored_event_json_is_the_envelope() -> None:
    event = StoredEvent("m", 1, "t", 5, "w", {"a": [1]}, GENESIS, "f" * 64)
    assert json.loads(json.dumps(event.to_json())) == {
        "match_id": "m", "seq": 1, "type": "t", "t_ms": 5, "wall": "w", "data": {"a": [1]},
        "prev_hash": GENESIS, "hash": "f" * 64,
    }  # fmt: skip
