"""The event log: an append-only, gap-free, per-match sequence of events (SQLite or PostgreSQL)."""

from pathlib import Path

from opsarena.errors import StoreError
from opsarena.store.base import (
    DEFAULT_POLL_S,
    MAX_EVENT_BYTES,
    EventStore,
    LogAudit,
    MatchSummary,
    QuarantinedEvent,
    QuarantineResult,
    StoredEvent,
    encode_event_data,
    utc_now_iso,
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
from opsarena.store.sqlite import SqliteEventStore
from opsarena.store.targets import (
    DB_ENV,
    default_db_path,
    default_target,
    describe_target,
    is_postgres_url,
    resolve_target,
)
from opsarena.store.vault import SeedVault


def open_store(target: Path | str | None = None, *, read_only: bool = False) -> EventStore:
    """The event log `target` names (see `store.targets`): a PostgreSQL URL or an SQLite
    file; None means `$OPSARENA_DB` or the default file. Raises `StoreError`."""
    resolved = resolve_target(target)
    if is_postgres_url(resolved):
        try:
            from opsarena.store.postgres import PostgresEventStore
        except ImportError as exc:
            raise StoreError(str(exc)) from None
        return PostgresEventStore(resolved, read_only=read_only)
    return SqliteEventStore(resolved, read_only=read_only)


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
    "default_target",
    "describe_target",
    "encode_event_data",
    "event_hash",
    "forged_tail_start",
    "is_postgres_url",
    "open_store",
    "resolve_target",
    "utc_now_iso",
]
