"""The SQLite log against someone writing its file behind the store's back, with real files.

Forged rows are inserted the way a process holding the file would: plain `sqlite3`
statements on another connection, no opsarena code involved.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest

from opsarena.errors import EventLogError, LogTamperedError, StoreError
from opsarena.store import GENESIS, SqliteEventStore, chain_problems, event_hash
from opsarena.store.targets import platform_db_path


def forge(db: Path, match_id: str, first_seq: int, count: int, *, kind: str = "x") -> None:
    """Insert `count` rows from `first_seq` on, as a forger with the file would."""
    with sqlite3.connect(db) as conn:
        for seq in range(first_seq, first_seq + count):
            conn.execute(
                "INSERT INTO events (match_id, seq, type, t_ms, wall, data) VALUES (?,?,?,?,?,?)",
                (match_id, seq, kind, 0, "w", json.dumps({"forged": seq})),
            )


def filled(db: Path, match_id: str = "m", n: int = 5) -> SqliteEventStore:
    store = SqliteEventStore(db)
    for i in range(n):
        store.append_blocking(match_id, "agent_output", {"i": i}, i)
    return store


def test_an_append_whose_seq_is_taken_fails_naming_match_and_seq_and_writes_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    with filled(db) as store:
        forge(db, "m", 6, 10)
        with pytest.raises(LogTamperedError, match=r"match m: seq 6 is taken") as caught:
            store.append_blocking("m", "agent_output", {"i": 99}, 99)
        assert (caught.value.match_id, caught.value.seq) == ("m", 6)
        # The forged rows are never handed to readers, and the store's count is unchanged.
        assert [e.seq for e in store.read_blocking("m")] == [1, 2, 3, 4, 5]
        summary = store.summary_blocking("m")
        assert summary is not None and summary.last_seq == 5
        # Other matches are untouched by one match's forgery.
        assert store.append_blocking("other", "agent_output", {}, 0) == 1


def test_an_edited_head_is_refused_and_a_forged_tail_is_quarantined_then_appends_go_on(
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    with filled(db) as store:
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE events SET data = '{\"i\":400}' WHERE seq = 5")
        with pytest.raises(LogTamperedError, match="seq 5, the event the next one chains to"):
            store.append_blocking("m", "agent_output", {}, 9)
        forge(db, "m", 6, 10)
        moved = store.quarantine_tail_blocking("m", "test")
        assert moved is not None and (moved.first_seq, moved.rows) == (5, 11)
        assert store.append_blocking("m", "agent_output", {"after": True}, 9) == 5
        audit = store.audit_blocking("m")
        assert [e.seq for e in audit.events] == [1, 2, 3, 4, 5]
        assert chain_problems([e.link() for e in audit.events], last_seq=audit.last_seq) == []
        assert [q.event.seq for q in audit.quarantined] == [5, *range(6, 16)]
        assert audit.quarantined[0].event.data == {"i": 400} and audit.quarantined[0].reason
        assert store.quarantine_tail_blocking("m", "again") is None


def test_a_modified_payload_breaks_the_chain_at_that_seq(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with filled(db, n=8) as store:
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE events SET data = '{\"i\":-1}' WHERE seq = 3")
        audit = store.audit_blocking("m")
        problems = chain_problems([e.link() for e in audit.events], last_seq=audit.last_seq)
        assert [p.seq for p in problems] == [3]
        # A break deep in the log leaves the head sound: appends are not stopped by it.
        assert store.append_blocking("m", "agent_output", {}, 9) == 9


def test_a_new_log_is_readable_by_its_owner_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPSARENA_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "fresh" / "data"))
    db = platform_db_path()  # the default log: its directory is created, 0700
    assert db == tmp_path / "fresh" / "data" / "opsarena" / "opsarena.db"
    with filled(db) as store:
        assert stat.S_IMODE(db.stat().st_mode) == 0o600
        assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
        for suffix in ("-wal", "-shm"):
            sidecar = Path(f"{db}{suffix}")
            assert stat.S_IMODE(sidecar.stat().st_mode) == 0o600, sidecar
        store.vault().put("m", {"seed": "ab"})
        vault = store.vault().directory
        assert stat.S_IMODE(vault.stat().st_mode) == 0o700
        assert stat.S_IMODE((vault / "m.json").stat().st_mode) == 0o600


def test_opening_a_log_for_writing_tightens_a_loose_file(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    filled(db).close()
    os.chmod(db, 0o666)
    SqliteEventStore(db).close()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_another_user_can_read_neither_the_log_nor_the_vault(tmp_path: Path) -> None:
    """A process of another uid (what a caged competitor is) opening the files."""
    base = tmp_path / "shared"
    base.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(base, 0o777)  # even in a directory anyone may enter
    db = base / "log.db"
    with filled(db) as store:
        store.vault().put("m", {"seed": "5eed" * 8, "nonce": "00" * 16})
        for target in (db, Path(f"{db}-wal"), store.vault().directory / "m.json"):
            tried = subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                 "cat", str(target)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            assert tried.returncode != 0 and "Permission denied" in tried.stderr, target
            assert "5eed" not in tried.stdout


def test_a_version_1_log_is_upgraded_with_its_rows_hashed(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(
            """
            CREATE TABLE opsarena_schema (version INTEGER NOT NULL);
            INSERT INTO opsarena_schema VALUES (1);
            CREATE TABLE matches (match_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL,
              created_wall TEXT NOT NULL, updated_wall TEXT NOT NULL,
              last_t_ms INTEGER NOT NULL, last_type TEXT NOT NULL);
            CREATE TABLE events (id INTEGER PRIMARY KEY, match_id TEXT NOT NULL,
              seq INTEGER NOT NULL, type TEXT NOT NULL, t_ms INTEGER NOT NULL,
              wall TEXT NOT NULL, data TEXT NOT NULL, UNIQUE (match_id, seq));
            INSERT INTO matches VALUES ('old', 2, 'w', 'w', 1, 'b');
            INSERT INTO events (match_id, seq, type, t_ms, wall, data)
              VALUES ('old', 1, 'a', 0, 'w', '{"x":1}'), ('old', 2, 'b', 1, 'w', '{}');
            """
        )
    with SqliteEventStore(db, read_only=True) as reader:
        assert [e.hash for e in reader.read_blocking("old")] == ["", ""]
    with SqliteEventStore(db) as store:
        events = store.read_blocking("old")
        first = event_hash("old", 1, "a", 0, "w", {"x": 1}, GENESIS)
        assert (events[0].prev_hash, events[0].hash) == (GENESIS, first)
        assert events[1].prev_hash == first
        assert store.append_blocking("old", "c", {}, 2) == 3
        audit = store.audit_blocking("old")
        assert chain_problems([e.link() for e in audit.events], last_seq=3) == []


def test_a_read_only_store_cannot_quarantine(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    filled(db).close()
    with SqliteEventStore(db, read_only=True) as reader, pytest.raises(StoreError):
        reader.quarantine_tail_blocking("m", "no")


def test_a_planted_vault_symlink_is_refused_and_no_seed_is_written(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    catch = tmp_path / "catch"
    catch.mkdir()
    Path(f"{db}-secrets").symlink_to(catch)
    with filled(db) as store, pytest.raises(StoreError, match="not a directory of this user"):
        store.vault().put("m", {"seed": "ab"})
    assert list(catch.iterdir()) == []


def test_rows_of_the_wrong_types_are_quarantined_too(tmp_path: Path) -> None:
    """SQLite keeps text in an INTEGER column: a forger's row need not parse."""
    db = tmp_path / "log.db"
    with filled(db) as store:
        with sqlite3.connect(db) as conn:
            conn.execute(
                "INSERT INTO events (match_id, seq, type, t_ms, wall, data) VALUES"
                " ('m', 'x', 'a', 'soon', 'w', 'not json'), ('m', 6, 'b', 'later', 'w', '[]')"
            )
        with pytest.raises(LogTamperedError):
            store.append_blocking("m", "agent_output", {}, 9)
        moved = store.quarantine_tail_blocking("m", "test")
        assert moved is not None and (moved.first_seq, moved.rows) == (6, 2)
        assert store.append_blocking("m", "agent_output", {}, 9) == 6


def test_an_appended_row_edited_into_garbage_reads_as_one_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with filled(db) as store:
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE events SET data = '{not json' WHERE seq = 2")
        with pytest.raises(EventLogError, match="match m seq 2: the row is malformed"):
            store.read_blocking("m")
        audit = store.audit_blocking("m")
        problems = chain_problems([e.link() for e in audit.events], last_seq=audit.last_seq)
        assert [p.seq for p in problems] == [2]
