"""The `EventStore` contract: an append-only, per-match, gap-free log of events.

A store knows nothing about what events mean; `opsarena.match.events` gives them types and
`opsarena.match.fold` turns them into a record. Every implementation (SQLite now, a server
database later) must keep these promises:

- `append` gives a match's events the sequence numbers 1, 2, 3, ... with no gap and no
  duplicate, even when several processes append to the same match at once;
- an `append` that returned is durable: a crash of the process (or the machine) afterwards
  never loses it;
- `read` returns events in sequence order, and sees every event appended before it was
  called, by any process;
- every event carries `hash`, chained to the match's previous event (`store.chain`), and
  `append` refuses (`LogTamperedError`) when it finds rows it did not append where it would
  write; `quarantine_tail` moves such a forged tail aside, keeping it as evidence.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from opsarena.store.chain import ChainLink
from opsarena.store.vault import Vault
from opsarena.text import storable_json

DEFAULT_POLL_S = 0.1
FOLLOW_BYTES = 8 * 1024 * 1024
"""The most bytes of event data `follow` reads at once."""


def within_bytes(sizes: list[tuple[int, int]], max_bytes: int) -> int | None:
    """The last seq of `(seq, size)` pairs, in order, whose running total of sizes
    stays within `max_bytes` (the first always counts); None when there are none."""
    last, total = None, 0
    for seq, size in sizes:
        total += size
        if last is not None and total > max_bytes:
            break
        last = seq
    return last


"""How often `follow` asks the store for new events when it has caught up."""

MAX_EVENT_BYTES = 1024 * 1024
"""The largest `data` an event may carry, as compact JSON. Producers bound their own
payloads (agent output chunks, transcript entries) well below this."""


Wake = Callable[[str | Collection[str], float], Awaitable[None]]
"""`await wake(match_id, poll_s)` returns when `match_id` (`""`: any match; a collection
of ids: any of them, e.g. a tournament's stream and its running matches) may have new
events. A store that cannot be told just sleeps `poll_s`; one that can (PostgreSQL's
LISTEN/NOTIFY) returns at the notification, or after its own safety interval."""


def wanted_matches(match_id: str | Collection[str]) -> frozenset[str] | None:
    """The match ids a `Wake` call waits for; None for any match (`""`)."""
    if isinstance(match_id, str):
        return None if not match_id else frozenset((match_id,))
    return frozenset(match_id)


def utc_now_iso() -> str:
    """The current UTC time as ISO-8601 with milliseconds and a `Z`."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def encode_event_data(event_type: str, data: Mapping[str, Any]) -> str:
    """`data` as the compact JSON text every store keeps. Any text the arena observed is
    accepted: a string (or dict key, at any depth) UTF-8 cannot encode, such as a host's
    file name holding a non-UTF-8 byte, is stored escaped (`opsarena.text.storable`), the
    same way every time, so the chain hashes what the store keeps. Raises `ValueError`
    when `data` is not a JSON object or is larger than `MAX_EVENT_BYTES`, `TypeError` when
    it is not JSON-serialisable; never for a string's content."""
    if not isinstance(data, Mapping):
        raise ValueError(f"event data must be a JSON object, not {type(data).__name__}")
    payload = storable_json(dict(data))
    size = len(payload.encode())
    if size > MAX_EVENT_BYTES:
        raise ValueError(
            f"{event_type} event data is {size} bytes, over the {MAX_EVENT_BYTES}-byte limit"
        )
    return payload


@dataclass(frozen=True)
class StoredEvent:
    """One event as the log holds it; `data` is plain JSON (dicts, lists, str, int, ...)."""

    match_id: str
    seq: int
    type: str
    t_ms: int
    wall: str
    data: dict[str, Any]
    prev_hash: str = ""
    hash: str = ""
    """The chain hashes (`store.chain`); empty only for an event never stored."""

    def to_json(self) -> dict[str, Any]:
        """The event envelope as a JSON object (the shape `opsarena events` prints)."""
        return {
            "match_id": self.match_id,
            "seq": self.seq,
            "type": self.type,
            "t_ms": self.t_ms,
            "wall": self.wall,
            "data": self.data,
            "prev_hash": self.prev_hash,
            "hash": self.hash,
        }

    def link(self) -> ChainLink:
        """The event as the chain checks it."""
        return ChainLink(
            self.match_id, self.seq, self.type, self.t_ms, self.wall, self.data,
            self.prev_hash, self.hash,
        )  # fmt: skip


@dataclass(frozen=True)
class QuarantinedEvent:
    """A row moved out of a match's log by `quarantine_tail`, kept as evidence."""

    event: StoredEvent
    quarantined_wall: str
    reason: str


@dataclass(frozen=True)
class LogAudit:
    """Everything `opsarena verify` looks at for one match, read without trusting it:
    every row under the match's id in `seq` order (also those above `last_seq`, which
    `read` never returns), the store's own `last_seq`, and the quarantined rows."""

    match_id: str
    last_seq: int
    events: list[StoredEvent]
    quarantined: list[QuarantinedEvent]


@dataclass(frozen=True)
class QuarantineResult:
    """What `quarantine_tail` moved aside: rows `first_seq` and up, `rows` of them."""

    first_seq: int
    rows: int


@dataclass(frozen=True)
class MatchSummary:
    """What the store itself knows about a match, without folding its events."""

    match_id: str
    created_wall: str
    updated_wall: str
    last_seq: int
    last_t_ms: int
    last_type: str


class EventStore(abc.ABC):
    """An append-only event log holding many matches.

    Every method may raise `StoreError` when the underlying database cannot be used.
    Blocking work runs in a worker thread so the event loop is never held for long.
    """

    @abc.abstractmethod
    async def append(
        self,
        match_id: str,
        event_type: str,
        data: Mapping[str, Any],
        t_ms: int,
        *,
        wall: str | None = None,
    ) -> int:
        """Append one event and return its sequence number (1 for a match's first event).

        `wall` defaults to the current UTC time (ISO-8601, milliseconds, `Z`). Returns only
        once the event is durable. Raises `ValueError` when `data` is not a JSON object or is
        larger than `MAX_EVENT_BYTES`, `TypeError` when it is not JSON-serialisable.
        """

    @abc.abstractmethod
    async def read(
        self,
        match_id: str,
        after: int = 0,
        limit: int | None = None,
        *,
        max_bytes: int | None = None,
    ) -> list[StoredEvent]:
        """The match's events with `seq > after`, in order, at most `limit` of them and,
        given `max_bytes`, no more than fit in it (their stored `data` counted, as UTF-8
        JSON), but always the first: a reader's memory stays bounded however large the
        log's events are. Read on with `after` = the last seq returned.

        An unknown match reads as an empty list (use `exists` to tell the difference).
        """

    @abc.abstractmethod
    async def audit(self, match_id: str) -> LogAudit:
        """Every row stored under `match_id`, for checking the chain (see `LogAudit`)."""

    @abc.abstractmethod
    async def quarantine_tail(self, match_id: str, reason: str) -> QuarantineResult | None:
        """Move the match's forged tail (`chain.forged_tail_start`) out of its log, into
        the quarantine, so appends can go on after the last sound event; `None` when the
        head of the log is sound. The moved rows stay readable through `audit`."""

    @abc.abstractmethod
    def vault(self) -> Vault:
        """The vault of this log's running matches' secrets (only the arena reads it)."""

    @abc.abstractmethod
    async def list_matches(self, limit: int | None = None) -> list[MatchSummary]:
        """The matches in the log, most recently created first."""

    @abc.abstractmethod
    async def summary(self, match_id: str) -> MatchSummary | None:
        """The store's summary of one match; `None` if it has no events."""

    async def exists(self, match_id: str) -> bool:
        """Whether the match has at least one event."""
        return await self.summary(match_id) is not None

    @abc.abstractmethod
    def close(self) -> None:
        """Release the database; the store must not be used afterwards."""

    async def follow(
        self, match_id: str, after: int = 0, *, poll_s: float = DEFAULT_POLL_S
    ) -> AsyncIterator[StoredEvent]:
        """Yield the match's events with `seq > after` as they are appended, forever.

        Events appended by other processes are seen within about `poll_s` seconds. The
        iterator never ends by itself: the caller stops when it has seen what it waits for
        (for example `match_closed`) or cancels it.
        """
        cursor = after
        async with self.changes() as wake:
            while True:
                batch = await self.read(match_id, after=cursor, limit=1000, max_bytes=FOLLOW_BYTES)
                for event in batch:
                    cursor = event.seq
                    yield event
                if not batch:
                    await wake(match_id, poll_s)

    @contextlib.asynccontextmanager
    async def changes(self) -> AsyncIterator[Wake]:
        """A `Wake` for readers that wait for new events (`follow`, the scoreboard's
        streams), valid inside the block. This default polls: `wake` sleeps `poll_s`."""

        async def sleep(match_id: str | Collection[str], poll_s: float) -> None:
            await asyncio.sleep(poll_s)

        yield sleep

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class BlockingEventStore(EventStore):
    """An `EventStore` built on synchronous operations (a DB-API driver's): the store
    implements the `*_blocking` methods, each one short, and this class gives the async
    API by running each in a worker thread, so the event loop is never held."""

    @abc.abstractmethod
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

    @abc.abstractmethod
    def read_blocking(
        self,
        match_id: str,
        after: int = 0,
        limit: int | None = None,
        *,
        max_bytes: int | None = None,
    ) -> list[StoredEvent]:
        """`read` without the thread hop."""

    @abc.abstractmethod
    def audit_blocking(self, match_id: str) -> LogAudit:
        """`audit` without the thread hop."""

    @abc.abstractmethod
    def quarantine_tail_blocking(self, match_id: str, reason: str) -> QuarantineResult | None:
        """`quarantine_tail` without the thread hop."""

    @abc.abstractmethod
    def list_matches_blocking(self, limit: int | None = None) -> list[MatchSummary]:
        """`list_matches` without the thread hop."""

    @abc.abstractmethod
    def summary_blocking(self, match_id: str) -> MatchSummary | None:
        """`summary` without the thread hop."""

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
        self,
        match_id: str,
        after: int = 0,
        limit: int | None = None,
        *,
        max_bytes: int | None = None,
    ) -> list[StoredEvent]:
        return await asyncio.to_thread(
            functools.partial(self.read_blocking, max_bytes=max_bytes), match_id, after, limit
        )

    async def audit(self, match_id: str) -> LogAudit:
        return await asyncio.to_thread(self.audit_blocking, match_id)

    async def quarantine_tail(self, match_id: str, reason: str) -> QuarantineResult | None:
        return await asyncio.to_thread(self.quarantine_tail_blocking, match_id, reason)

    async def list_matches(self, limit: int | None = None) -> list[MatchSummary]:
        return await asyncio.to_thread(self.list_matches_blocking, limit)

    async def summary(self, match_id: str) -> MatchSummary | None:
        return await asyncio.to_thread(self.summary_blocking, match_id)
