"""Store kinds: which `EventStore` a `--db` value (or `$OPSARENA_DB`) opens.

`STORES` maps what selects a store today to the function that opens it: a URL's scheme
(`postgresql`, `postgres`), or `file` for anything that is not a URL (an SQLite file's path).
`open_store` is the one way every command, the scoreboard and the Ray workers open an
event log, so a store kind added here is usable wherever `--db` is.

A third-party store is one module that registers its opener at import,

    STORES.register("mystore", lambda target, read_only: MyEventStore(target, read_only))

plus an entry point in the group `opsarena.stores` naming that module (see
`opsarena.registry`); `--db mystore://...` then opens it. The module is imported only when
a `mystore://` URL is first opened (or the list of kinds is asked for).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from opsarena.errors import StoreError
from opsarena.registry import Registry
from opsarena.store.base import EventStore
from opsarena.store.sqlite import SqliteEventStore
from opsarena.store.targets import (
    POSTGRES_SCHEMES,
    describe_target,
    resolve_target,
    url_scheme,
)

StoreOpener = Callable[[str, bool], EventStore]
"""`opener(target, read_only)`: the store at `target` (a normalised URL, or an expanded
path for `file`). Raises `StoreError` when it cannot be opened."""

FILE_KIND = "file"
"""The kind a `--db` value that is not a URL selects: an SQLite file."""

STORES: Registry[StoreOpener] = Registry("event store", "opsarena.stores")


def store_kind(target: Path | str | None) -> str:
    """The `STORES` name `target` selects: its URL scheme, or `FILE_KIND` for a path."""
    return url_scheme(resolve_target(target)) or FILE_KIND


def open_store(target: Path | str | None = None, *, read_only: bool = False) -> EventStore:
    """The event log `target` names (see `store.targets`): a URL of a registered store
    kind, or an SQLite file; None means `$OPSARENA_DB` or the default file. Raises
    `StoreError`, in one line, for a URL no store kind takes."""
    resolved = resolve_target(target)
    kind = store_kind(resolved)
    opener = STORES.get(kind) if not (kind == FILE_KIND and url_scheme(resolved)) else None
    if opener is None:
        known = ", ".join(f"{name}://" for name in STORES.names() if name != FILE_KIND)
        raise StoreError(
            f"no event store for {describe_target(resolved)}: --db takes an SQLite file's "
            f"path or a URL of {known}"
        )
    return opener(resolved, read_only)


def _open_sqlite(target: str, read_only: bool) -> EventStore:
    return SqliteEventStore(target, read_only=read_only)


def _open_postgres(target: str, read_only: bool) -> EventStore:
    try:  # psycopg is an optional dependency: imported only when a URL asks for it
        from opsarena.store.postgres import PostgresEventStore
    except ImportError as exc:
        raise StoreError(str(exc)) from None
    return PostgresEventStore(target, read_only=read_only)


STORES.register(FILE_KIND, _open_sqlite)
for _scheme in POSTGRES_SCHEMES:
    STORES.register(_scheme, _open_postgres)
