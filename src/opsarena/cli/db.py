"""`opsarena db`: prepare a PostgreSQL event log, and copy an SQLite log into one."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer

from opsarena.cli.output import console
from opsarena.cli.records import DbOption, open_db
from opsarena.errors import StoreError, UsageError
from opsarena.store import SqliteEventStore, describe_target, is_postgres_url, open_store

app = typer.Typer(help="The event log's database: migrate, copy.", no_args_is_help=True)


@app.command("migrate")
def migrate(db: DbOption = None) -> None:
    """Create the event log's schema, or bring it to this opsarena's version."""
    with open_db(db) as store:  # opening creates or migrates the schema
        version = getattr(store, "schema_version", None)
        suffix = f" (schema version {version()})" if callable(version) else ""
        console.print(f"the event log {describe_target(db)} is ready{suffix}", markup=False)


@app.command("copy")
def copy(
    source: Annotated[Path, typer.Argument(help="SQLite event log to copy from.")],
    target: Annotated[str, typer.Argument(help="PostgreSQL URL to copy into.")],
) -> None:
    """Copy every match of an SQLite event log into a PostgreSQL one, event for event
    (sequence numbers, times and data unchanged). A match already in the target with the
    same events is skipped; one that differs stops the copy before anything of it is
    written."""
    if not os.path.lexists(source):  # anything else there, the store checks (and names)
        raise UsageError(f"no SQLite event log at {source}")
    if not is_postgres_url(target):
        raise UsageError(f"TARGET {target!r} must be a PostgreSQL URL (postgresql://...)")
    asyncio.run(_copy(source, target))


async def _copy(source: Path, target: str) -> None:
    with SqliteEventStore(source, read_only=True) as src, open_store(target) as dst:
        importer = getattr(dst, "import_blocking", None)
        if importer is None:  # pragma: no cover - is_postgres_url guarantees it
            raise StoreError(f"{describe_target(target)} cannot import events")
        summaries = list(reversed(await src.list_matches()))
        copied = skipped = events = 0
        for summary in summaries:
            batch = await src.read(summary.match_id)
            there = await dst.read(summary.match_id)
            if there:
                if [e.to_json() for e in there] == [e.to_json() for e in batch]:
                    skipped += 1
                    continue
                raise StoreError(
                    f"match {summary.match_id!r} is already in {describe_target(target)} with "
                    "other events: not copied (nothing of it was written)"
                )
            events += await asyncio.to_thread(importer, batch)
            copied += 1
            console.print(f"copied {summary.match_id} ({len(batch)} events)", markup=False)
        console.print(
            f"{copied} matches ({events} events) copied, {skipped} already there",
            markup=False,
        )
