"""The event log: an append-only, gap-free, per-match sequence of events (SQLite for now)."""

from pathlib import Path

from opsarena.store.base import (
    DEFAULT_POLL_S,
    MAX_EVENT_BYTES,
    EventStore,
    LogAudit,
    MatchSummary,
    QuarantinedEvent,
    QuarantineResult,
    StoredEvent,
)
from opsarena.store.chain import (
    GENESIS,
    ChainLink,
    ChainProblem,
    canonical_json,
    chain_problems,
    content_digest,
    event_hash,
    forged_tail_start,
)
from opsarena.store.sqlite import DB_ENV, SqliteEventStore, default_db_path, utc_now_iso
from opsarena.store.vault import SeedVault


def open_store(path: Path | str | None = None) -> EventStore:
    """The event log at `path` (default: `default_db_path()`); raises `StoreError`."""
    return SqliteEventStore(path)


__all__ = [
    "DB_ENV",
    "DEFAULT_POLL_S",
    "GENESIS",
    "MAX_EVENT_BYTES",
    "ChainLink",
    "ChainProblem",
    "EventStore",
    "LogAudit",
    "MatchSummary",
    "QuarantineResult",
    "QuarantinedEvent",
    "SeedVault",
    "SqliteEventStore",
    "StoredEvent",
    "canonical_json",
    "chain_problems",
    "content_digest",
    "default_db_path",
    "event_hash",
    "forged_tail_start",
    "open_store",
    "utc_now_iso",
]
