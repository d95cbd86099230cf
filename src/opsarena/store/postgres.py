"""The PostgreSQL event log: one database shared by every machine that runs matches.

Selected by a libpq URL (`postgresql://...` or `postgres://...`, a unix-socket directory as
`host=` included) wherever `--db` / `$OPSARENA_DB` take a path. It keeps the `EventStore`
promises with the database's own guarantees:

- **Gap-free sequences under concurrent writers.** An append upserts the match's row in
  `matches` (`INSERT ... ON CONFLICT DO UPDATE SET last_seq = last_seq + 1 RETURNING`), which
  takes that row's lock until the transaction ends, then inserts the event. Appenders to one
  match, from any number of processes and machines, queue on the row lock; a transaction that
  fails rolls its increment back, so no number is skipped. `PRIMARY KEY (match_id, seq)` makes
  a duplicate impossible even for a writer that bypasses this code.
- **Durable on return.** Commits are synchronous (`synchronous_commit` is forced `on` for
  our sessions), so an append that returned survives a crash of the server.
- **Live followers without polling.** Every append sends `NOTIFY opsarena_events, '<match>'`
  in its transaction (delivered at commit); `follow` LISTENs on a connection of its own and
  reads when told, with a slow poll only as a safety net for a dropped connection.

The schema lives in its own version table (`opsarena_schema`) and is created and migrated by
the store itself, under a transaction-scoped advisory lock so that two machines opening a new
database at once do not race. A database holding tables of another application is never
touched. `data` is stored as the exact compact JSON text the appender produced (not `jsonb`,
which would reorder keys), so every reader sees the bytes the writer wrote.

psycopg's blocking API with a connection pool, run in worker threads, serves the async
interface: one store object is shared by the controller's event loop and the scoreboard's
server thread, and an asyncio pool would be bound to one loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import re
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

try:
    import psycopg
    from psycopg import sql
    from psycopg_pool import ConnectionPool
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the PostgreSQL event log needs psycopg: pip install 'opsarena[postgres]'"
    ) from exc

from opsarena.errors import StoreError
from opsarena.store.base import (
    EventStore,
    MatchSummary,
    StoredEvent,
    Wake,
    encode_event_data,
    utc_now_iso,
)
from opsarena.store.targets import describe_target, is_postgres_url

SCHEMA_VERSION = 1
CHANNEL = "opsarena_events"
"""The NOTIFY channel; the payload is the match id."""
LIST_CHANNEL_PAYLOAD = ""
"""Followers of the matches list wake on every notification, whatever its payload."""
CONNECT_TIMEOUT_S = 10.0
POOL_MAX = 8
"""Connections one store holds at most; appends and reads queue for them beyond that."""
FOLLOW_SAFETY_POLL_S = 2.0
"""How often a follower reads even without a notification (a dropped LISTEN connection)."""
_SCHEMA_LOCK = 0x6F70_7361_7265_6E61  # "opsarena": the advisory lock held while migrating

_MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE matches (
    match_id TEXT PRIMARY KEY,
    last_seq BIGINT NOT NULL CHECK (last_seq >= 1),
    created_wall TEXT NOT NULL,
    updated_wall TEXT NOT NULL,
    last_t_ms BIGINT NOT NULL,
    last_type TEXT NOT NULL
);
CREATE INDEX matches_by_creation ON matches (created_wall);
CREATE TABLE events (
    match_id TEXT NOT NULL,
    seq BIGINT NOT NULL CHECK (seq >= 1),
    type TEXT NOT NULL,
    t_ms BIGINT NOT NULL,
    wall TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (match_id, seq)
);
""",
}
"""Schema changes by the version they bring the database to, applied in order."""


class PostgresEventStore(EventStore):
    """An `EventStore` in a PostgreSQL database. Safe to share between threads.

    Opening connects once and creates or migrates the schema; it raises `StoreError` (one
    line) when the server cannot be reached, the database holds tables that are not an
    opsarena event log, or its schema is newer than this code. With `read_only`, every
    session is `default_transaction_read_only`: the server itself refuses writes (`append`
    raises `StoreError`), and the schema must already exist.
    """

    def __init__(self, url: str, *, read_only: bool = False, pool_max: int = POOL_MAX) -> None:
        if not is_postgres_url(url):
            raise StoreError(f"{url!r} is not a PostgreSQL URL (postgresql://...)")
        self.url = url
        self.read_only = read_only
        self._where = describe_target(url)
        options = "-c synchronous_commit=on"
        if read_only:
            options += " -c default_transaction_read_only=on"
        self._kwargs: dict[str, Any] = {
            "connect_timeout": int(CONNECT_TIMEOUT_S),
            "options": options,
            "application_name": "opsarena",
        }
        # Check the server and the schema with a plain connection first: a pool would
        # retry a bad URL in the background instead of saying what is wrong.
        with self._connect() as conn:
            if read_only:
                self._check_version(conn)
            else:
                self._migrate(conn)
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_max,
            kwargs={**self._kwargs, "autocommit": False},
            open=True,
            timeout=CONNECT_TIMEOUT_S,
        )

    # -- connections and schema --

    def _connect(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.url, autocommit=autocommit, **self._kwargs)
        except psycopg.Error as exc:
            raise StoreError(f"cannot open the event log {self._where}: {_one_line(exc)}") from None

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Create the schema or bring it to `SCHEMA_VERSION`, under the advisory lock."""
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                tables = self._tables(conn)
                if tables and "opsarena_schema" not in tables:
                    raise self._not_ours()
                if not tables:
                    conn.execute("CREATE TABLE opsarena_schema (version INTEGER NOT NULL)")
                    current = 0
                else:
                    current = self._version(conn)
                if current > SCHEMA_VERSION:
                    raise self._too_new(current)
                for version in range(current + 1, SCHEMA_VERSION + 1):
                    conn.execute(_MIGRATIONS[version])
                    conn.execute("INSERT INTO opsarena_schema (version) VALUES (%s)", (version,))
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot prepare the event log {self._where}: {_one_line(exc)}"
            ) from None

    def _check_version(self, conn: psycopg.Connection[Any]) -> None:
        try:
            if "opsarena_schema" not in self._tables(conn):
                raise StoreError(
                    f"{self._where} holds no opsarena event log: run `opsarena db migrate` "
                    "or a match first"
                )
            version = self._version(conn)
        except psycopg.Error as exc:
            raise StoreError(f"cannot read the event log {self._where}: {_one_line(exc)}") from None
        if version > SCHEMA_VERSION:
            raise self._too_new(version)
        if version < SCHEMA_VERSION:
            raise StoreError(
                f"the event log {self._where} has schema version {version}: "
                "run `opsarena db migrate` first"
            )

    @staticmethod
    def _tables(conn: psycopg.Connection[Any]) -> set[str]:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
        return {str(row[0]) for row in rows}

    def _version(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT MAX(version) FROM opsarena_schema").fetchone()
        version = row[0] if row else None
        if not isinstance(version, int):
            raise self._not_ours()
        return version

    def schema_version(self) -> int:
        """The schema version the database holds now."""
        with self._pool.connection() as conn:
            return self._version(conn)

    def _not_ours(self) -> StoreError:
        return StoreError(
            f"{self._where} holds tables that are not an opsarena event log: "
            "choose another database"
        )

    def _too_new(self, version: int) -> StoreError:
        return StoreError(
            f"the event log {self._where} has schema version {version}, newer than "
            f"this opsarena understands ({SCHEMA_VERSION}): upgrade opsarena"
        )

    # -- blocking operations; the async API runs them in a thread --

    def append_blocking(
        self,
        match_id: str,
        event_type: str,
        data: Mapping[str, Any],
        t_ms: int,
        *,
        wall: str | None = None,
    ) -> int:
        """`append` without the thread hop."""
        payload = encode_event_data(event_type, data)
        stamp = wall if wall is not None else utc_now_iso()
        try:
            with self._pool.connection() as conn, conn.transaction():
                row = conn.execute(
                    "INSERT INTO matches AS m (match_id, last_seq, created_wall, updated_wall,"
                    " last_t_ms, last_type) VALUES (%s, 1, %s, %s, %s, %s)"
                    " ON CONFLICT (match_id) DO UPDATE SET last_seq = m.last_seq + 1,"
                    " updated_wall = EXCLUDED.updated_wall, last_t_ms = EXCLUDED.last_t_ms,"
                    " last_type = EXCLUDED.last_type"
                    " RETURNING last_seq",
                    (match_id, stamp, stamp, t_ms, event_type),
                ).fetchone()
                assert row is not None
                seq = int(row[0])
                conn.execute(
                    "INSERT INTO events (match_id, seq, type, t_ms, wall, data)"
                    " VALUES (%s, %s, %s, %s, %s, %s)",
                    (match_id, seq, event_type, t_ms, stamp, payload),
                )
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, match_id))
        except psycopg.errors.UniqueViolation:
            raise StoreError(
                f"cannot append to match {match_id!r} in {self._where}: its next sequence "
                "number is already taken by a row this store did not write"
            ) from None
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot append to the event log {self._where}: {_one_line(exc)}"
            ) from None
        return seq

    def import_blocking(self, events: Iterable[StoredEvent]) -> int:
        """Insert one match's events exactly as given (seq, t_ms, wall, data) in one
        transaction; for `opsarena db copy`. The events must be one match's 1..n; raises
        `StoreError` if that match already has events here. Returns how many were written."""
        batch = list(events)
        if not batch:
            return 0
        match_id = batch[0].match_id
        if [e.seq for e in batch] != list(range(1, len(batch) + 1)) or any(
            e.match_id != match_id for e in batch
        ):
            raise StoreError(f"match {match_id!r}: events to import must be seq 1..n of one match")
        last = batch[-1]
        try:
            with self._pool.connection() as conn, conn.transaction():
                conn.execute(
                    "INSERT INTO matches (match_id, last_seq, created_wall, updated_wall,"
                    " last_t_ms, last_type) VALUES (%s, %s, %s, %s, %s, %s)",
                    (match_id, last.seq, batch[0].wall, last.wall, last.t_ms, last.type),
                )
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO events (match_id, seq, type, t_ms, wall, data)"
                        " VALUES (%s, %s, %s, %s, %s, %s)",
                        [(match_id, *_row_of(e)) for e in batch],
                    )
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, match_id))
        except psycopg.errors.UniqueViolation:
            raise StoreError(f"match {match_id!r} is already in {self._where}") from None
        except psycopg.Error as exc:
            raise StoreError(f"cannot import into {self._where}: {_one_line(exc)}") from None
        return len(batch)

    def read_blocking(
        self, match_id: str, after: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        """`read` without the thread hop."""
        rows = self._query(
            "SELECT seq, type, t_ms, wall, data FROM events WHERE match_id = %s AND seq > %s"
            " ORDER BY seq LIMIT %s",
            (match_id, after, limit),
        )
        return [
            StoredEvent(match_id, int(seq), str(kind), int(t_ms), str(wall), json.loads(data))
            for seq, kind, t_ms, wall, data in rows
        ]

    _SUMMARY = (
        "SELECT match_id, created_wall, updated_wall, last_seq, last_t_ms, last_type FROM matches"
    )

    def list_matches_blocking(self, limit: int | None = None) -> list[MatchSummary]:
        """`list_matches` without the thread hop."""
        rows = self._query(
            f"{self._SUMMARY} ORDER BY created_wall DESC, match_id LIMIT %s", (limit,)
        )
        return [_summary_of(row) for row in rows]

    def summary_blocking(self, match_id: str) -> MatchSummary | None:
        """`summary` without the thread hop."""
        rows = self._query(f"{self._SUMMARY} WHERE match_id = %s", (match_id,))
        return _summary_of(rows[0]) if rows else None

    def _query(self, query: str, params: tuple[object, ...]) -> list[Any]:
        try:
            with self._pool.connection() as conn:
                rows = conn.execute(query, params).fetchall()
                conn.rollback()  # end the read transaction; nothing to keep
                return rows
        except psycopg.Error as exc:
            raise StoreError(f"cannot read the event log {self._where}: {_one_line(exc)}") from None

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

    @contextlib.asynccontextmanager
    async def changes(self) -> AsyncIterator[Wake]:
        """A LISTEN on a connection of its own: `wake(match_id, poll_s)` returns when an
        appender notified that match (any match, for `""`), or after
        `FOLLOW_SAFETY_POLL_S` (a read then catches anything a broken connection missed);
        `poll_s` is ignored. The connection is closed when the block ends."""
        listener = _Listener(self)
        await asyncio.to_thread(listener.start)
        try:
            yield listener.wait
        finally:
            await asyncio.to_thread(listener.stop)

    def close(self) -> None:
        self._pool.close()


class _Listener:
    """One LISTEN connection read by a daemon thread; waiters get woken through queues."""

    def __init__(self, store: PostgresEventStore) -> None:
        self._store = store
        self._conn: psycopg.Connection[Any] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._inbox: queue.Queue[str] = queue.Queue()

    def start(self) -> None:
        conn = self._store._connect(autocommit=True)
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        self._conn = conn
        self._thread = threading.Thread(target=self._run, name="opsarena-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._conn is not None
        while not self._stopping.is_set():
            try:
                for note in self._conn.notifies(timeout=0.5):
                    self._inbox.put(note.payload)
            except psycopg.Error:
                # The connection broke: followers fall back to their safety poll.
                return

    async def wait(self, match_id: str, poll_s: float) -> None:
        """Return once a notification for `match_id` (any, for "") arrives, or after
        `FOLLOW_SAFETY_POLL_S`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FOLLOW_SAFETY_POLL_S
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                payload = await asyncio.to_thread(self._inbox.get, True, min(left, 0.5))
            except queue.Empty:
                continue
            if not match_id or payload == match_id:
                # Coalesce a burst: one read will see all of it.
                with contextlib.suppress(queue.Empty):
                    while True:
                        self._inbox.get_nowait()
                return

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if self._conn is not None:
            self._conn.close()


def _row_of(event: StoredEvent) -> tuple[int, str, int, str, str]:
    return event.seq, event.type, event.t_ms, event.wall, encode_event_data(event.type, event.data)


def _summary_of(row: Any) -> MatchSummary:
    match_id, created, updated, seq, t_ms, kind = row
    return MatchSummary(str(match_id), str(created), str(updated), int(seq), int(t_ms), str(kind))


def _one_line(exc: BaseException) -> str:
    """The error on one line; libpq quotes the whole conninfo in some messages, so any
    password in it is masked."""
    text = " ".join(str(exc).split())
    text = re.sub(r"(password=)\S*", r"\1***", text, flags=re.IGNORECASE)
    return text or type(exc).__name__


__all__ = ["PostgresEventStore"]
