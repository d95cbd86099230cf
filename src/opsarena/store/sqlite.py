"""The SQLite event log: one file, WAL, every commit synced to disk.

Layout (schema version 1):

- `opsarena_schema(version)`: one row; a file without it is not ours and is never touched.
- `events(match_id, seq, type, t_ms, wall, data)`: one row per event, `UNIQUE(match_id, seq)`,
  `data` compact JSON.
- `matches(match_id, last_seq, created_wall, updated_wall, last_t_ms, last_type)`: the
  store's own bookkeeping per match (the next sequence number, what `ls` sorts by). It says
  nothing about how a match went; that is only ever the fold of its events.

Sequence numbers are allocated inside one `BEGIN IMMEDIATE` transaction that reads
`matches.last_seq`, inserts the event and updates the summary, so appenders in any number of
processes serialise on SQLite's write lock and never gap or duplicate. `synchronous=FULL`
makes every commit durable before `append` returns.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from opsarena.errors import StoreError
from opsarena.store.base import (
    EventStore,
    MatchSummary,
    StoredEvent,
    encode_event_data,
    utc_now_iso,
)
from opsarena.store.targets import describe_target, is_postgres_url, resolve_target

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0
"""How long a writer waits for another process's write transaction before giving up."""

_SCHEMA = """
CREATE TABLE opsarena_schema (version INTEGER NOT NULL);
CREATE TABLE matches (
    match_id TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL,
    created_wall TEXT NOT NULL,
    updated_wall TEXT NOT NULL,
    last_t_ms INTEGER NOT NULL,
    last_type TEXT NOT NULL
);
CREATE INDEX matches_by_creation ON matches (created_wall);
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    match_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 1),
    type TEXT NOT NULL,
    t_ms INTEGER NOT NULL,
    wall TEXT NOT NULL,
    data TEXT NOT NULL,
    UNIQUE (match_id, seq)
);
"""


class SqliteEventStore(EventStore):
    """An `EventStore` in one SQLite file. Safe to share between threads and processes.

    Opening raises `StoreError` (one line) when the file is not an SQLite database, is an
    SQLite database that is not an opsarena event log, was written by a newer opsarena, or
    cannot be created. The parent directory is created when missing.
    """

    def __init__(self, path: Path | str | None = None, *, read_only: bool = False) -> None:
        """With `read_only`, the file must exist and is opened with SQLite's `mode=ro`:
        every write is refused by SQLite itself (`append` raises `StoreError`), while
        commits of writers in other processes stay visible."""
        resolved = resolve_target(path)
        if is_postgres_url(resolved):
            raise StoreError(f"{describe_target(resolved)} is a PostgreSQL URL, not an SQLite file")
        self.path = Path(resolved)
        self.read_only = read_only
        self._lock = threading.Lock()
        self._conn = self._open_read_only() if read_only else self._open()

    def _open_read_only(self) -> sqlite3.Connection:
        if not self.path.is_file():
            raise StoreError(
                f"no event log at {self.path}: run a match first (opsarena demo) or pass --db"
            )
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        try:
            conn = sqlite3.connect(
                uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                check_same_thread=False,
            )  # fmt: skip
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the event log {self.path}: {exc}") from None
        try:
            if "opsarena_schema" not in self._tables(conn):
                raise self._not_ours()
            self._check_version(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(
                f"{self.path} is not an opsarena event log ({exc}): choose another --db path"
            ) from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the event log {self.path}: {exc}") from None
        try:
            self._check_or_create(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_or_create(self, conn: sqlite3.Connection) -> None:
        try:
            tables = self._tables(conn)
            # Look before changing anything: a foreign database is never switched to WAL.
            if tables and "opsarena_schema" not in tables:
                raise self._not_ours()
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"the event log {self.path} cannot use WAL mode (got {mode})")
            conn.execute("PRAGMA synchronous = FULL")
            # Two processes opening a new file at once: the write lock makes one create it.
            conn.execute("BEGIN IMMEDIATE")
            self._create_or_verify(conn)
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{self.path} is not an opsarena event log ({exc}): choose another --db path"
            ) from None

    def _create_or_verify(self, conn: sqlite3.Connection) -> None:
        """Inside the open `BEGIN IMMEDIATE`: create the schema or check its version."""
        try:
            tables = self._tables(conn)
            if not tables:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute("INSERT INTO opsarena_schema (version) VALUES (?)", (SCHEMA_VERSION,))
            elif "opsarena_schema" not in tables:
                raise self._not_ours()
            else:
                self._check_version(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _check_version(self, conn: sqlite3.Connection) -> None:
        """Raise `StoreError` unless the log's schema version is one this code reads."""
        row = conn.execute("SELECT MAX(version) FROM opsarena_schema").fetchone()
        version = row[0] if row else None
        if not isinstance(version, int):
            raise self._not_ours()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the event log {self.path} has schema version {version}, newer than "
                f"this opsarena understands ({SCHEMA_VERSION}): upgrade opsarena"
            )

    def _not_ours(self) -> StoreError:
        return StoreError(
            f"{self.path} is an SQLite database but not an opsarena event log: "
            "choose another --db path"
        )

    @staticmethod
    def _tables(conn: sqlite3.Connection) -> set[str]:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        return {str(row[0]) for row in rows}

    # -- blocking operations, each one short; the async API runs them in a thread --

    def append_blocking(
        self,
        match_id: str,
        event_type: str,
        data: Mapping[str, Any],
        t_ms: int,
        *,
        wall: str | None = None,
    ) -> int:
        """`append` without the thread hop, for code that is not async (tests, tools)."""
        payload = encode_event_data(event_type, data)
        stamp = wall if wall is not None else utc_now_iso()
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    row = conn.execute(
                        "SELECT last_seq FROM matches WHERE match_id = ?", (match_id,)
                    ).fetchone()
                    if row is None:
                        seq = 1
                        conn.execute(
                            "INSERT INTO matches (match_id, last_seq, created_wall, updated_wall,"
                            " last_t_ms, last_type) VALUES (?, ?, ?, ?, ?, ?)",
                            (match_id, seq, stamp, stamp, t_ms, event_type),
                        )
                    else:
                        seq = int(row[0]) + 1
                        conn.execute(
                            "UPDATE matches SET last_seq = ?, updated_wall = ?, last_t_ms = ?,"
                            " last_type = ? WHERE match_id = ?",
                            (seq, stamp, t_ms, event_type, match_id),
                        )
                    conn.execute(
                        "INSERT INTO events (match_id, seq, type, t_ms, wall, data)"
                        " VALUES (?, ?, ?, ?, ?, ?)",
                        (match_id, seq, event_type, t_ms, stamp, payload),
                    )
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:
                raise StoreError(f"cannot append to the event log {self.path}: {exc}") from None
        return seq

    def read_blocking(
        self, match_id: str, after: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        """`read` without the thread hop."""
        query = (
            "SELECT seq, type, t_ms, wall, data FROM events"
            " WHERE match_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        )
        with self._lock:
            rows = self._query(query, (match_id, after, -1 if limit is None else limit))
        return [
            StoredEvent(match_id, int(seq), str(kind), int(t_ms), str(wall), json.loads(data))
            for seq, kind, t_ms, wall, data in rows
        ]

    _SUMMARY = (
        "SELECT match_id, created_wall, updated_wall, last_seq, last_t_ms, last_type FROM matches"
    )

    def list_matches_blocking(self, limit: int | None = None) -> list[MatchSummary]:
        """`list_matches` without the thread hop."""
        query = f"{self._SUMMARY} ORDER BY created_wall DESC, match_id LIMIT ?"
        with self._lock:
            rows = self._query(query, (-1 if limit is None else limit,))
        return [self._summary_of(row) for row in rows]

    def summary_blocking(self, match_id: str) -> MatchSummary | None:
        """`summary` without the thread hop."""
        with self._lock:
            rows = self._query(f"{self._SUMMARY} WHERE match_id = ?", (match_id,))
        return self._summary_of(rows[0]) if rows else None

    @staticmethod
    def _summary_of(row: Any) -> MatchSummary:
        match_id, created, updated, seq, t_ms, kind = row
        return MatchSummary(
            str(match_id), str(created), str(updated), int(seq), int(t_ms), str(kind)
        )

    def _query(self, query: str, params: tuple[object, ...]) -> list[Any]:
        try:
            return self._conn.execute(query, params).fetchall()
        except sqlite3.OperationalError as exc:
            raise StoreError(f"cannot read the event log {self.path}: {exc}") from None

    # -- the EventStore API --

    async def append(
        self,
        match_id: str,
        event_type: str,
        data: Mapping[str, Any],
        t_ms: int,
        *,
        wall: str | None = None,
    ) -> int:
        return await asyncio.to_thread(
            self.append_blocking, match_id, event_type, data, t_ms, wall=wall
        )

    async def read(
        self, match_id: str, after: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        return await asyncio.to_thread(self.read_blocking, match_id, after, limit)

    async def list_matches(self, limit: int | None = None) -> list[MatchSummary]:
        return await asyncio.to_thread(self.list_matches_blocking, limit)

    async def summary(self, match_id: str) -> MatchSummary | None:
        return await asyncio.to_thread(self.summary_blocking, match_id)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
