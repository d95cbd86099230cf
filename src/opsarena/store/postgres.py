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

Each event carries the hash chain of `store.chain` (`prev_hash`, `hash`), checked inside
the append's transaction as the SQLite store does: a row above the match's `last_seq`, or a
head that does not match its hash, makes the append fail with `LogTamperedError` and write
nothing; `quarantine_tail` moves a forged tail aside into `quarantined_events`. A running
match's secrets (its seed and nonce, until `match_closed` reveals them) are in
`match_secrets`, so `opsarena resume` works from any machine that holds the database's
credentials — which only the arena's operator has.

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
import collections
import contextlib
import json
import math
import os
import re
import threading
from collections.abc import AsyncIterator, Collection, Iterable, Mapping
from typing import Any

try:
    import psycopg
    from psycopg import sql
    from psycopg_pool import ConnectionPool
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the PostgreSQL event log needs psycopg: pip install 'opsarena[postgres]'"
    ) from exc

from opsarena.errors import LogTamperedError, StoreError
from opsarena.store.base import (
    BlockingEventStore,
    LogAudit,
    MatchSummary,
    QuarantinedEvent,
    QuarantineResult,
    StoredEvent,
    Wake,
    encode_event_data,
    utc_now_iso,
    wanted_matches,
    within_bytes,
)
from opsarena.store.chain import GENESIS, ChainLink, event_hash, forged_tail_start
from opsarena.store.targets import describe_target, is_postgres_url, normal_url
from opsarena.store.vault import MATCH_ID_RE, Vault

SCHEMA_VERSION = 1
CHANNEL = "opsarena_events"
"""The NOTIFY channel; the payload is the match id."""
LIST_CHANNEL_PAYLOAD = ""
"""Followers of the matches list wake on every notification, whatever its payload."""
CONNECT_TIMEOUT_S = 10.0
POOL_MAX = 8
"""Connections one store holds at most; appends and reads queue for them beyond that."""
FOLLOW_SAFETY_POLL_S = 2.0
"""How often a follower reads even without a notification (a dropped LISTEN connection);
`OPSARENA_FOLLOW_POLL_S` sets another (see `follow_safety_poll_s`)."""
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
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    PRIMARY KEY (match_id, seq)
);
CREATE TABLE quarantined_events (
    id BIGSERIAL PRIMARY KEY,
    match_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    type TEXT NOT NULL,
    t_ms BIGINT NOT NULL,
    wall TEXT NOT NULL,
    data TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    quarantined_wall TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE match_secrets (
    match_id TEXT PRIMARY KEY,
    secrets TEXT NOT NULL
);
""",
}
"""Schema changes by the version they bring the database to, applied in order."""


class PostgresEventStore(BlockingEventStore):
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
        self.url = url = normal_url(url)
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
        """`append` without the thread hop. Raises `LogTamperedError` (nothing written)
        when a row the store did not append sits at or above the next seq, or the event
        the next one chains to does not match its hash."""
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
                prev_hash = self._chain_head(conn, match_id, seq - 1)
                digest = event_hash(
                    match_id, seq, event_type, t_ms, stamp, json.loads(payload), prev_hash
                )
                conn.execute(
                    "INSERT INTO events (match_id, seq, type, t_ms, wall, data, prev_hash, hash)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    (match_id, seq, event_type, t_ms, stamp, payload, prev_hash, digest),
                )
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, match_id))
        except psycopg.errors.UniqueViolation:  # a forger raced the check above
            raise LogTamperedError(
                f"match {match_id}: its next seq is taken by a row the arena did not append: "
                f"opsarena verify {match_id}",
                match_id=match_id,
                seq=0,
            ) from None
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot append to the event log {self._where}: {_one_line(exc)}"
            ) from None
        return seq

    def _chain_head(self, conn: psycopg.Connection[Any], match_id: str, last: int) -> str:
        """Inside the append's transaction (the match's row is locked): the hash the next
        event chains to, or `LogTamperedError` as `append_blocking` says."""
        taken = conn.execute(
            "SELECT MIN(seq) FROM events WHERE match_id = %s AND seq > %s", (match_id, last)
        ).fetchone()
        if taken is not None and taken[0] is not None:
            raise LogTamperedError(
                f"match {match_id}: seq {taken[0]} is taken by a row the arena did not append "
                f"(its last appended seq is {last}): opsarena verify {match_id}",
                match_id=match_id,
                seq=int(taken[0]),
            )
        if last == 0:
            return GENESIS
        head = conn.execute(
            f"SELECT {_COLUMNS} FROM events WHERE match_id = %s AND seq = %s", (match_id, last)
        ).fetchone()
        if head is None or not _link(match_id, head).hash_ok():
            what = "is missing" if head is None else "does not match its hash"
            raise LogTamperedError(
                f"match {match_id}: seq {last}, the event the next one chains to, {what}: "
                f"opsarena verify {match_id}",
                match_id=match_id,
                seq=last,
            )
        return str(head[6])

    def import_blocking(self, events: Iterable[StoredEvent]) -> int:
        """Insert one match's events exactly as given (seq, t_ms, wall, data) in one
        transaction, with their chain (recomputed; a source event whose own hashes disagree
        is refused); for `opsarena db copy`. The events must be one match's 1..n; raises
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
        rows, prev = [], GENESIS
        for e in batch:
            digest = event_hash(match_id, e.seq, e.type, e.t_ms, e.wall, e.data, prev)
            if e.hash and (e.hash != digest or e.prev_hash != prev):
                raise StoreError(
                    f"match {match_id!r}: event {e.seq} does not chain (opsarena verify "
                    f"{match_id} on the source): not copied"
                )
            rows.append((match_id, *_row_of(e), prev, digest))
            prev = digest
        try:
            with self._pool.connection() as conn, conn.transaction():
                conn.execute(
                    "INSERT INTO matches (match_id, last_seq, created_wall, updated_wall,"
                    " last_t_ms, last_type) VALUES (%s, %s, %s, %s, %s, %s)",
                    (match_id, last.seq, batch[0].wall, last.wall, last.t_ms, last.type),
                )
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO events (match_id, seq, type, t_ms, wall, data, prev_hash,"
                        " hash) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                        rows,
                    )
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, match_id))
        except psycopg.errors.UniqueViolation:
            raise StoreError(f"match {match_id!r} is already in {self._where}") from None
        except psycopg.Error as exc:
            raise StoreError(f"cannot import into {self._where}: {_one_line(exc)}") from None
        return len(batch)

    def read_blocking(
        self,
        match_id: str,
        after: int = 0,
        limit: int | None = None,
        *,
        max_bytes: int | None = None,
    ) -> list[StoredEvent]:
        """`read` without the thread hop."""
        # Only what the store appended: a row above `last_seq` was written behind its back.
        where = (
            " WHERE match_id = %s AND seq > %s"
            " AND seq <= (SELECT last_seq FROM matches WHERE match_id = %s)"
        )
        last: int | None = None
        if max_bytes is not None:  # the sizes first: only integers are held
            sizes = self._query(
                f"SELECT seq, octet_length(data) FROM events{where} ORDER BY seq LIMIT %s",
                (match_id, after, match_id, limit),
            )
            last = within_bytes([(int(seq), int(size or 0)) for seq, size in sizes], max_bytes)
            if last is None:
                return []
        rows = self._query(
            f"SELECT {_COLUMNS} FROM events{where}"
            " AND (%s::bigint IS NULL OR seq <= %s::bigint) ORDER BY seq LIMIT %s",
            (match_id, after, match_id, last, last, limit),
        )
        return [_stored(_link(match_id, row)) for row in rows]

    def audit_blocking(self, match_id: str) -> LogAudit:
        """`audit` without the thread hop."""
        summary = self._query("SELECT last_seq FROM matches WHERE match_id = %s", (match_id,))
        rows = self._query(
            f"SELECT {_COLUMNS} FROM events WHERE match_id = %s ORDER BY seq", (match_id,)
        )
        quarantined = self._query(
            f"SELECT {_COLUMNS}, quarantined_wall, reason FROM quarantined_events"
            " WHERE match_id = %s ORDER BY id",
            (match_id,),
        )
        return LogAudit(
            match_id=match_id,
            last_seq=int(summary[0][0]) if summary else 0,
            events=[_stored(_link(match_id, row)) for row in rows],
            quarantined=[
                QuarantinedEvent(_stored(_link(match_id, row[:7])), str(row[7]), str(row[8]))
                for row in quarantined
            ],
        )

    def quarantine_tail_blocking(self, match_id: str, reason: str) -> QuarantineResult | None:
        """`quarantine_tail` without the thread hop."""
        if self.read_only:
            raise StoreError(f"the event log {self._where} is open read-only")
        stamp = utc_now_iso()
        try:
            with self._pool.connection() as conn, conn.transaction():
                locked = conn.execute(
                    "SELECT last_seq FROM matches WHERE match_id = %s FOR UPDATE", (match_id,)
                ).fetchone()
                last = int(locked[0]) if locked is not None else 0
                rows = conn.execute(
                    f"SELECT {_COLUMNS} FROM events WHERE match_id = %s ORDER BY seq",
                    (match_id,),
                ).fetchall()
                start = forged_tail_start([_link(match_id, r) for r in rows], last)
                if start is None:
                    return None
                moved = conn.execute(
                    "INSERT INTO quarantined_events (match_id, seq, type, t_ms, wall, data,"
                    " prev_hash, hash, quarantined_wall, reason) SELECT match_id, seq, type,"
                    " t_ms, wall, data, prev_hash, hash, %s, %s FROM events"
                    " WHERE match_id = %s AND seq >= %s ORDER BY seq",
                    (stamp, reason[:1000], match_id, start),
                ).rowcount
                conn.execute(
                    "DELETE FROM events WHERE match_id = %s AND seq >= %s", (match_id, start)
                )
                head = conn.execute(
                    "SELECT seq, t_ms, type FROM events WHERE match_id = %s"
                    " ORDER BY seq DESC LIMIT 1",
                    (match_id,),
                ).fetchone()
                if head is None:
                    conn.execute("DELETE FROM matches WHERE match_id = %s", (match_id,))
                else:
                    conn.execute(
                        "UPDATE matches SET last_seq = %s, last_t_ms = %s, last_type = %s,"
                        " updated_wall = %s WHERE match_id = %s",
                        (int(head[0]), int(head[1]), str(head[2]), stamp, match_id),
                    )
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot repair the event log {self._where}: {_one_line(exc)}"
            ) from None
        return QuarantineResult(first_seq=start, rows=max(moved, 0))

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

    # -- the EventStore API (the other async methods come from BlockingEventStore) --

    def vault(self) -> Vault:
        return _PostgresVault(self)

    @contextlib.asynccontextmanager
    async def changes(self) -> AsyncIterator[Wake]:
        """A LISTEN on a connection of its own: `wake(match_id, poll_s)` returns when an
        appender notified that match (any of them, for a collection; any match, for `""`),
        or after `follow_safety_poll_s()` (a read then catches anything a broken connection
        missed); `poll_s` is ignored. The connection is closed when the block ends."""
        listener = _Listener(self, asyncio.get_running_loop(), follow_safety_poll_s())
        await asyncio.to_thread(listener.start)
        try:
            yield listener.wait
        finally:
            await asyncio.to_thread(listener.stop)

    def close(self) -> None:
        self._pool.close()


def follow_safety_poll_s() -> float:
    """Seconds a follower waits for a notification before it reads anyway:
    `$OPSARENA_FOLLOW_POLL_S` when set (shorter where notifications can be lost, longer to
    read less), else `FOLLOW_SAFETY_POLL_S`. Raises `StoreError` for a value that is not a
    number of seconds above 0."""
    value = os.environ.get("OPSARENA_FOLLOW_POLL_S", "")
    if not value:
        return FOLLOW_SAFETY_POLL_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise StoreError(f"OPSARENA_FOLLOW_POLL_S={value!r} is not a number of seconds above 0")
    return seconds


class _Listener:
    """One LISTEN connection read by a daemon thread, which hands each notification to the
    waiter's event loop; a waiting reader holds no thread."""

    def __init__(
        self, store: PostgresEventStore, loop: asyncio.AbstractEventLoop, safety_poll_s: float
    ) -> None:
        self._store = store
        self._loop = loop
        self._safety_poll_s = safety_poll_s
        self._conn: psycopg.Connection[Any] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._inbox: collections.deque[str] = collections.deque()
        self._arrived = asyncio.Event()

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
                    self._loop.call_soon_threadsafe(self._deliver, note.payload)
            except psycopg.Error:
                # The connection broke: followers fall back to their safety poll.
                return
            except RuntimeError:  # the waiter's loop is closed: nobody is listening
                return

    def _deliver(self, payload: str) -> None:
        self._inbox.append(payload)
        self._arrived.set()

    async def wait(self, match_id: str | Collection[str], poll_s: float) -> None:
        """Return once a notification for `match_id` (see `Wake`) arrives, or after
        its safety poll."""
        wanted = wanted_matches(match_id)
        deadline = self._loop.time() + self._safety_poll_s
        while True:
            while self._inbox:
                if wanted is None or self._inbox.popleft() in wanted:
                    # Coalesce a burst: the reader's next read sees all of it.
                    self._inbox.clear()
                    self._arrived.clear()
                    return
            self._arrived.clear()
            left = deadline - self._loop.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):  # never wait_for: see pyproject's ruff
                    await self._arrived.wait()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if self._conn is not None:
            self._conn.close()


_COLUMNS = "seq, type, t_ms, wall, data, prev_hash, hash"


class _PostgresVault(Vault):
    """Running matches' secrets in the `match_secrets` table: readable with the
    database's credentials only (the operator's), so `resume` works from any machine."""

    where = "the match_secrets table"

    def __init__(self, store: PostgresEventStore) -> None:
        self._store = store

    @staticmethod
    def _check(match_id: str) -> None:
        if not MATCH_ID_RE.match(match_id):
            raise ValueError(f"match id {match_id!r} is not a safe name")

    def put(self, match_id: str, secrets: dict[str, str]) -> None:
        self._check(match_id)
        payload = json.dumps(secrets, sort_keys=True)
        try:
            with self._store._pool.connection() as conn, conn.transaction():
                conn.execute(
                    "INSERT INTO match_secrets (match_id, secrets) VALUES (%s, %s)"
                    " ON CONFLICT (match_id) DO UPDATE SET secrets = EXCLUDED.secrets",
                    (match_id, payload),
                )
        except psycopg.Error as exc:
            raise StoreError(f"cannot write the seed vault: {_one_line(exc)}") from None

    def get(self, match_id: str) -> dict[str, str] | None:
        self._check(match_id)
        rows = self._store._query(
            "SELECT secrets FROM match_secrets WHERE match_id = %s", (match_id,)
        )
        if not rows:
            return None
        loaded = json.loads(rows[0][0])
        if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in loaded.items()
        ):
            raise StoreError(f"the seed vault entry of {match_id} is not an object of strings")
        return loaded

    def discard(self, match_id: str) -> None:
        self._check(match_id)
        try:
            with self._store._pool.connection() as conn, conn.transaction():
                conn.execute("DELETE FROM match_secrets WHERE match_id = %s", (match_id,))
        except psycopg.Error as exc:
            raise StoreError(f"cannot write the seed vault: {_one_line(exc)}") from None


def _link(match_id: str, row: Any) -> ChainLink:
    seq, kind, t_ms, wall, data, prev_hash, digest = row
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


def _stored(link: ChainLink) -> StoredEvent:
    return StoredEvent(
        link.match_id, link.seq, link.type, link.t_ms, link.wall, dict(link.data),
        link.prev_hash, link.hash,
    )  # fmt: skip


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
