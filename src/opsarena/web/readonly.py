"""The scoreboard's view of the event log, opened read-only by the database itself.

The web server must never change the log it serves, so it reads through the store's
`read_only` mode: SQLite's `mode=ro`, or PostgreSQL sessions with
`default_transaction_read_only`. Any write is refused by the database, not by our code.
Readers still see every commit made by writers in other processes (and, for PostgreSQL,
on other machines).
"""

from __future__ import annotations

from pathlib import Path

from opsarena.store import (
    FILE_KIND,
    EventStore,
    SqliteEventStore,
    open_store,
    resolve_target,
    store_kind,
)


def open_read_only(target: Path | str | None) -> EventStore:
    """The event log `target` names (a file path or a store's URL), read-only. A missing
    SQLite file is first created as an empty event log (the only write the scoreboard ever
    makes), so a server can start before the first match. Raises `StoreError`."""
    resolved = resolve_target(target)
    if store_kind(resolved) == FILE_KIND and not Path(resolved).exists():
        SqliteEventStore(resolved).close()
    return open_store(resolved, read_only=True)
