"""The SQLite event log: one file, WAL, every commit synced to disk, readable only by its owner.

Layout (schema version 2):

- `opsarena_schema(version)`: one row; a file without it is not ours and is never touched.
- `events(match_id, seq, type, t_ms, wall, data, prev_hash, hash)`: one row per event,
  `UNIQUE(match_id, seq)`, `data` compact JSON, `hash` chained to the match's previous
  event (`store.chain` gives the exact input).
- `matches(match_id, last_seq, created_wall, updated_wall, last_t_ms, last_type)`: the
  store's own bookkeeping per match (the next sequence number, what `ls` sorts by). It says
  nothing about how a match went; that is only ever the fold of its events.
- `quarantined_events`: rows `quarantine_tail` moved out of a match's log (a forged tail),
  with when and why; evidence for `opsarena verify`, never folded.

Sequence numbers are allocated inside one `BEGIN IMMEDIATE` transaction that reads
`matches.last_seq`, checks that no row sits at or above the next one and that the row it
chains to still matches its hash, inserts the event and updates the summary, so appenders
in any number of processes serialise on SQLite's write lock and never gap or duplicate.
`synchronous=FULL` makes every commit durable before `append` returns. `read` returns only
rows up to `last_seq`: a row written into the file behind the store's back is never handed
to the fold or to a follower.

The path is checked before anything is created or changed (`store.dbfile`): a symlink, a
directory, a device, a FIFO, a socket, another user's file, a planted `-wal`/`-shm`, a
missing or read-only directory is refused in one line. A new file is created 0600 with
`O_NOFOLLOW` (SQLite gives its `-wal` and `-shm` files the same mode and opens them with
`O_NOFOLLOW` too), only the default directory is created (0700), and opening an opsarena
log for writing tightens it (and its `-wal`/`-shm`) through descriptors when others could
read it. Version 1 logs are upgraded by the first writer that opens them: the hashes of
their rows are computed then.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from opsarena.errors import EventLogError, LogTamperedError, NoEventLogError, StoreError
from opsarena.store.base import (
    BlockingEventStore,
    LogAudit,
    MatchSummary,
    QuarantinedEvent,
    QuarantineResult,
    StoredEvent,
    encode_event_data,
    utc_now_iso,
    within_bytes,
)
from opsarena.store.chain import GENESIS, ChainLink, event_hash, forged_tail_start
from opsarena.store.dbfile import check_db_path, ensure_private_directory, open_db_file, tighten
from opsarena.store.targets import (
    describe_target,
    is_postgres_url,
    platform_db_path,
    resolve_target,
)
from opsarena.store.vault import SeedVault

SCHEMA_VERSION = 2
BUSY_TIMEOUT_S = 30.0
"""How long a writer waits for another process's write transaction before giving up."""

FOREIGN_SEQ = 2**62
"""Where a row whose seq is not an integer sorts (only a forger can write one)."""

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
    prev_hash TEXT NOT NULL DEFAULT '',
    hash TEXT NOT NULL DEFAULT '',
    UNIQUE (match_id, seq)
);
CREATE TABLE quarantined_events (
    id INTEGER PRIMARY KEY,
    match_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    t_ms INTEGER NOT NULL,
    wall TEXT NOT NULL,
    data TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    quarantined_wall TEXT NOT NULL,
    reason TEXT NOT NULL
);
"""

_UPGRADE_FROM_1 = [
    "ALTER TABLE events ADD COLUMN prev_hash TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE events ADD COLUMN hash TEXT NOT NULL DEFAULT ''",
    _SCHEMA[_SCHEMA.index("CREATE TABLE quarantined_events") :].strip().rstrip(";"),
]


class SqliteEventStore(BlockingEventStore):
    """An `EventStore` in one SQLite file. Safe to share between threads and processes.

    Opening raises `StoreError` (one line) when the file is not an SQLite database, is an
    SQLite database that is not an opsarena event log, was written by a newer opsarena, or
    cannot be created, and, before anything is changed, when the path is not one the store
    may open (`store.dbfile.check_db_path`). Only the default directory is created.
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
        self._version = SCHEMA_VERSION
        self._conn = self._open_read_only() if read_only else self._open()

    def _open_read_only(self) -> sqlite3.Connection:
        check_db_path(self.path, write=False)
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        try:
            conn = sqlite3.connect(
                uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                check_same_thread=False,
            )  # fmt: skip
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the event log {self.path}: {exc}") from None
        try:
            tables = self._tables(conn)
            if not tables:  # the file a starting writer made, before its tables
                raise NoEventLogError(
                    f"no event log at {self.path} yet: the file is empty (a match that is "
                    "starting creates its tables first); run a match or pass --db"
                )
            if "opsarena_schema" not in tables:
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
        if self.path == platform_db_path():
            ensure_private_directory(self.path.parent)  # the default directory is ours alone
        check_db_path(self.path, write=True)  # nothing is created or changed before this
        fd, created = open_db_file(self.path)
        try:
            try:
                conn = sqlite3.connect(
                    self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                    check_same_thread=False,
                )  # fmt: skip
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open the event log {self.path}: {exc}") from None
            try:
                self._check_or_create(conn)
                tighten(fd, self.path)  # an opsarena log now: its mode is the store's
            except BaseException:
                conn.close()
                raise
        except BaseException:
            if created:
                self._remove_created(fd)
            raise
        finally:
            os.close(fd)
        return conn

    def _remove_created(self, fd: int) -> None:
        """Remove the file `open_db_file` created (at `fd`) when the open failed after
        all: nothing half-made stays behind, and nothing else is removed in its place."""
        with contextlib.suppress(OSError):
            ours, there = os.fstat(fd), os.lstat(self.path)
            if (ours.st_dev, ours.st_ino) == (there.st_dev, there.st_ino):
                os.unlink(self.path)

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
                if self._version < SCHEMA_VERSION:
                    self._upgrade(conn)
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
        self._version = version

    def _upgrade(self, conn: sqlite3.Connection) -> None:
        """Inside the open `BEGIN IMMEDIATE`: version 1 to 2, hashing every existing row
        (the rows are taken as they are: a version 1 log had no chain to check them by)."""
        for statement in _UPGRADE_FROM_1:
            conn.execute(statement)
        rows = conn.execute(
            "SELECT id, match_id, seq, type, t_ms, wall, data FROM events ORDER BY match_id, seq"
        ).fetchall()
        previous: dict[str, str] = {}
        for row_id, match_id, seq, kind, t_ms, wall, data in rows:
            prev_hash = previous.get(match_id, GENESIS)
            digest = event_hash(match_id, seq, kind, t_ms, wall, json.loads(data), prev_hash)
            conn.execute(
                "UPDATE events SET prev_hash = ?, hash = ? WHERE id = ?",
                (prev_hash, digest, row_id),
            )
            previous[match_id] = digest
        conn.execute("UPDATE opsarena_schema SET version = ?", (SCHEMA_VERSION,))
        self._version = SCHEMA_VERSION

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
                    last = int(row[0]) if row is not None else 0
                    seq = last + 1
                    prev_hash = self._chain_head(conn, match_id, last)
                    digest = event_hash(
                        match_id, seq, event_type, t_ms, stamp, json.loads(payload), prev_hash
                    )
                    if row is None:
                        conn.execute(
                            "INSERT INTO matches (match_id, last_seq, created_wall, updated_wall,"
                            " last_t_ms, last_type) VALUES (?, ?, ?, ?, ?, ?)",
                            (match_id, seq, stamp, stamp, t_ms, event_type),
                        )
                    else:
                        conn.execute(
                            "UPDATE matches SET last_seq = ?, updated_wall = ?, last_t_ms = ?,"
                            " last_type = ? WHERE match_id = ?",
                            (seq, stamp, t_ms, event_type, match_id),
                        )
                    conn.execute(
                        "INSERT INTO events (match_id, seq, type, t_ms, wall, data, prev_hash,"
                        " hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (match_id, seq, event_type, t_ms, stamp, payload, prev_hash, digest),
                    )
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:
                raise StoreError(f"cannot append to the event log {self.path}: {exc}") from None
        return seq

    def _chain_head(self, conn: sqlite3.Connection, match_id: str, last: int) -> str:
        """Inside the append's transaction: the hash the next event chains to. Raises
        `LogTamperedError` when a row sits above `last` (its seq is taken) or the row at
        `last` is missing or does not match its own hash."""
        taken = conn.execute(
            "SELECT MIN(seq) FROM events WHERE match_id = ? AND seq > ?", (match_id, last)
        ).fetchone()[0]
        if taken is not None:
            raise LogTamperedError(
                f"match {match_id}: seq {taken} is taken by a row the arena did not append "
                f"(its last appended seq is {last}): opsarena verify {match_id}",
                match_id=match_id,
                seq=int(taken),
            )
        if last == 0:
            return GENESIS
        head = conn.execute(
            "SELECT seq, type, t_ms, wall, data, prev_hash, hash FROM events"
            " WHERE match_id = ? AND seq = ?",
            (match_id, last),
        ).fetchone()
        if head is None or not self._link(match_id, head).hash_ok():
            what = "is missing" if head is None else "does not match its hash"
            raise LogTamperedError(
                f"match {match_id}: seq {last}, the event the next one chains to, {what}: "
                f"opsarena verify {match_id}",
                match_id=match_id,
                seq=last,
            )
        return str(head[6])

    @staticmethod
    def _link(match_id: str, row: Any) -> ChainLink:
        """A stored row as the chain checks it. A forged row may hold anything SQLite
        takes (text in an integer column): it becomes a link that fails its hash, a
        non-integer seq one above every real seq (SQLite sorts text after numbers)."""
        seq, kind, t_ms, wall, data, prev_hash, digest = row
        if not isinstance(seq, int):
            seq, digest = FOREIGN_SEQ, ""
        if not isinstance(t_ms, int):
            t_ms, digest = 0, ""
        try:
            parsed = json.loads(data)
        except (TypeError, ValueError):
            parsed = {"unreadable": str(data)}
        if not isinstance(parsed, dict):
            parsed = {"not_an_object": parsed}
        return ChainLink(
            match_id, int(seq), str(kind), int(t_ms), str(wall), parsed,
            str(prev_hash or ""), str(digest or ""),
        )  # fmt: skip

    def audit_blocking(self, match_id: str) -> LogAudit:
        """`audit` without the thread hop."""
        hashes = "prev_hash, hash" if self._version >= 2 else "'', ''"
        with self._lock:
            summary = self._query("SELECT last_seq FROM matches WHERE match_id = ?", (match_id,))
            rows = self._query(
                f"SELECT seq, type, t_ms, wall, data, {hashes} FROM events"
                " WHERE match_id = ? ORDER BY seq",
                (match_id,),
            )
            quarantined = (
                self._query(
                    "SELECT seq, type, t_ms, wall, data, prev_hash, hash, quarantined_wall,"
                    " reason FROM quarantined_events WHERE match_id = ? ORDER BY id",
                    (match_id,),
                )
                if self._version >= 2
                else []
            )
        return LogAudit(
            match_id=match_id,
            last_seq=int(summary[0][0]) if summary else 0,
            events=[self._stored(self._link(match_id, row)) for row in rows],
            quarantined=[
                QuarantinedEvent(self._stored(self._link(match_id, row[:7])), row[7], row[8])
                for row in quarantined
            ],
        )

    @staticmethod
    def _stored(link: ChainLink) -> StoredEvent:
        return StoredEvent(
            link.match_id, link.seq, link.type, link.t_ms, link.wall, dict(link.data),
            link.prev_hash, link.hash,
        )  # fmt: skip

    def quarantine_tail_blocking(self, match_id: str, reason: str) -> QuarantineResult | None:
        """`quarantine_tail` without the thread hop."""
        if self.read_only:
            raise StoreError(f"the event log {self.path} is open read-only")
        stamp = utc_now_iso()
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = self._quarantine_in(conn, match_id, reason, stamp)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:
                raise StoreError(f"cannot repair the event log {self.path}: {exc}") from None
        return result

    def _quarantine_in(
        self, conn: sqlite3.Connection, match_id: str, reason: str, stamp: str
    ) -> QuarantineResult | None:
        row = conn.execute(
            "SELECT last_seq FROM matches WHERE match_id = ?", (match_id,)
        ).fetchone()
        last = int(row[0]) if row is not None else 0
        rows = conn.execute(
            "SELECT seq, type, t_ms, wall, data, prev_hash, hash FROM events"
            " WHERE match_id = ? ORDER BY seq",
            (match_id,),
        ).fetchall()
        start = forged_tail_start([self._link(match_id, r) for r in rows], last)
        if start is None:
            return None
        moved = conn.execute(
            "INSERT INTO quarantined_events (match_id, seq, type, t_ms, wall, data, prev_hash,"
            " hash, quarantined_wall, reason) SELECT match_id, seq, type, t_ms, wall, data,"
            " prev_hash, hash, ?, ? FROM events WHERE match_id = ? AND seq >= ? ORDER BY seq",
            (stamp, reason[:1000], match_id, start),
        ).rowcount
        conn.execute("DELETE FROM events WHERE match_id = ? AND seq >= ?", (match_id, start))
        head = conn.execute(
            "SELECT seq, t_ms, type FROM events WHERE match_id = ? ORDER BY seq DESC LIMIT 1",
            (match_id,),
        ).fetchone()
        if head is None:
            conn.execute("DELETE FROM matches WHERE match_id = ?", (match_id,))
        else:
            conn.execute(
                "UPDATE matches SET last_seq = ?, last_t_ms = ?, last_type = ?,"
                " updated_wall = ? WHERE match_id = ?",
                (int(head[0]), int(head[1]), str(head[2]), stamp, match_id),
            )
        return QuarantineResult(first_seq=start, rows=max(moved, 0))

    def read_blocking(
        self,
        match_id: str,
        after: int = 0,
        limit: int | None = None,
        *,
        max_bytes: int | None = None,
    ) -> list[StoredEvent]:
        """`read` without the thread hop."""
        hashes = "prev_hash, hash" if self._version >= 2 else "'', ''"
        # Only what the store appended: a row above `last_seq` was written behind its back.
        where = (
            " WHERE match_id = ? AND seq > ?"
            " AND seq <= (SELECT last_seq FROM matches WHERE match_id = ?)"
        )
        last: int | None = -1
        with self._lock:
            if max_bytes is not None:  # the sizes first: only integers are held
                sizes = self._query(
                    f"SELECT seq, length(CAST(data AS BLOB)) FROM events{where}"
                    " ORDER BY seq LIMIT ?",
                    (match_id, after, match_id, -1 if limit is None else limit),
                )
                last = within_bytes([(int(seq), int(size or 0)) for seq, size in sizes], max_bytes)
                if last is None:
                    return []
            rows = self._query(
                f"SELECT seq, type, t_ms, wall, data, {hashes} FROM events{where}"
                " AND (? < 0 OR seq <= ?) ORDER BY seq LIMIT ?",
                (match_id, after, match_id, last, last, -1 if limit is None else limit),
            )
        return [self._event_of(match_id, row) for row in rows]

    @staticmethod
    def _event_of(match_id: str, row: Any) -> StoredEvent:
        """A row the store appended, as an event; `EventLogError` when it was since edited
        into something no appender writes (text in an integer column, data not JSON)."""
        seq, kind, t_ms, wall, data, prev_hash, digest = row
        try:
            if not isinstance(seq, int) or not isinstance(t_ms, int):
                raise ValueError("seq and t_ms must be integers")
            parsed = json.loads(data)
        except (TypeError, ValueError) as exc:
            raise EventLogError(
                f"match {match_id} seq {seq}: the row is malformed ({exc}): it was edited "
                f"behind the store's back, opsarena verify {match_id}"
            ) from None
        return StoredEvent(
            match_id, seq, str(kind), t_ms, str(wall), parsed, str(prev_hash), str(digest)
        )

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

    # -- the EventStore API (the async methods come from BlockingEventStore) --

    def vault(self) -> SeedVault:
        return SeedVault(self.path.with_name(f"{self.path.name}-secrets"))

    def close(self) -> None:
        with self._lock:
            self._conn.close()
