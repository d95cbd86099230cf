"""The event log: an append-only, gap-free, per-match sequence of events (SQLite for now)."""

from pathlib import Path

from opsarena.store.base import (
    DEFAULT_POLL_S,
    MAX_EVENT_BYTES,
    EventStore,
    MatchSummary,
    StoredEvent,
)
from opsarena.store.sqlite import DB_ENV, SqliteEventStore, default_db_path, utc_now_iso


def open_store(path: Path | str | None = None) -> EventStore:
    """The event log at `path` (default: `default_db_path()`); raises `StoreError`."""
    return SqliteEventStore(path)


__all__ = [
    "DB_ENV",
    "DEFAULT_POLL_S",
    "MAX_EVENT_BYTES",
    "EventStore",
    "MatchSummary",
    "SqliteEventStore",
    "StoredEvent",
    "default_db_path",
    "open_store",
    "utc_now_iso",
]
