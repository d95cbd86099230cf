"""The scoreboard's view of the event log: the SQLite store, opened read-only.

The web server must never change the log it serves, so it reads through the store's
`read_only` mode (SQLite `mode=ro`): any write is refused by SQLite itself, not by our
code. Readers of a WAL database still see every commit made by writers in other
processes.
"""

from __future__ import annotations

from pathlib import Path

from opsarena.store import SqliteEventStore


def open_read_only(path: Path) -> SqliteEventStore:
    """The event log at `path`, read-only. A missing file is first created as an empty
    event log (the only write the scoreboard ever makes), so a server can start before
    the first match. Raises `StoreError`."""
    if not path.exists():
        SqliteEventStore(path).close()
    return SqliteEventStore(path, read_only=True)
