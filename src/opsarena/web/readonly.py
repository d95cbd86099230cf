"""The scoreboard's view of the event log: the SQLite store, opened read-only.

The web server must never change the log it serves, so it reads through a connection
opened with SQLite's `mode=ro`: any write is refused by SQLite itself, not by our code.
Readers of a WAL database still see every commit made by writers in other processes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from opsarena.errors import StoreError
from opsarena.store import SqliteEventStore
from opsarena.store.sqlite import BUSY_TIMEOUT_S, SCHEMA_VERSION


class ReadOnlyEventStore(SqliteEventStore):
    """A `SqliteEventStore` that can only read. `append` raises `StoreError`.

    Opening raises `StoreError` (one line) when the file does not exist, is not an SQLite
    database, is not an opsarena event log, or has a newer schema version.
    """

    def __init__(self, path: Path | str) -> None:
        super().__init__(path)

    def _open(self) -> sqlite3.Connection:
        if not self.path.is_file():
            raise StoreError(
                f"no event log at {self.path}: run a match first (opsarena demo) or pass --db"
            )
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        try:
            conn = sqlite3.connect(
                uri,
                uri=True,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the event log {self.path}: {exc}") from None
        try:
            self._verify(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _verify(self, conn: sqlite3.Connection) -> None:
        try:
            if "opsarena_schema" not in self._tables(conn):
                raise self._not_ours()
            row = conn.execute("SELECT MAX(version) FROM opsarena_schema").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{self.path} is not an opsarena event log ({exc}): choose another --db path"
            ) from None
        version = row[0] if row else None
        if not isinstance(version, int):
            raise self._not_ours()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the event log {self.path} has schema version {version}, newer than this "
                f"opsarena understands ({SCHEMA_VERSION}): upgrade opsarena"
            )


def open_read_only(path: Path) -> ReadOnlyEventStore:
    """The event log at `path`, read-only. A missing file is first created as an empty
    event log (the only write the scoreboard ever makes), so a server can start before
    the first match. Raises `StoreError`."""
    if not path.exists():
        SqliteEventStore(path).close()
    return ReadOnlyEventStore(path)
