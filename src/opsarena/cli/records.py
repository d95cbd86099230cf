"""`opsarena show`, `opsarena ls`, `opsarena events`: read matches back from the event log.

Every record shown here is `fold_events` of the match's events; nothing else is trusted.
`DbOption` and `open_db` are the `--db` option and its store, shared with `opsarena run`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Annotated

import typer

from opsarena.cli.output import console, printable
from opsarena.errors import EventLogError, MatchNotFoundError
from opsarena.match.fold import fold_events
from opsarena.match.record import MatchRecord
from opsarena.store import DB_ENV, EventStore, StoredEvent, open_store
from opsarena.tournament.record import is_tournament_stream

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar=DB_ENV,
        help="Event log: an SQLite file, or a PostgreSQL URL (postgresql://...). "
        "Default: opsarena.db in the user data directory.",
        show_default=False,
    ),
]

EVENT_TEXT_LIMIT = 160
"""Characters of an event's data shown per line by `opsarena events` without `--json`."""


def open_db(db: str | None) -> EventStore:
    """The event log chosen by `--db` / `$OPSARENA_DB` / the default; raises `StoreError`."""
    return open_store(db)


async def load_record(store: EventStore, match_id: str) -> MatchRecord:
    """The folded record of `match_id`; raises `MatchNotFoundError` or `EventLogError`."""
    events = await store.read(match_id)
    if not events:
        raise MatchNotFoundError(
            f"no match {match_id!r} in the event log: `opsarena ls` lists them"
        )
    return fold_events(events)


def duration(ms: int | None) -> str:
    """`ms` as `1m05.2s` / `4.3s`; `-` for none."""
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:04.1f}s"


def show(
    match_id: Annotated[str, typer.Argument(metavar="MATCH", help="Match id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON.")] = False,
    db: DbOption = None,
) -> None:
    """Show a match: a readable summary, or its record as JSON."""
    with open_db(db) as store:
        record = asyncio.run(load_record(store, match_id))
    if as_json:
        sys.stdout.write(record.model_dump_json(indent=2) + "\n")
        return
    print_summary(record)


def columns(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Rows as left-aligned plain-text columns under `header`; nothing is cut or wrapped,
    so the output reads the same in a terminal, a pipe or a log file."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in table
    )


def print_summary(record: MatchRecord) -> None:
    """The human-readable view of a record (the same facts as the JSON, fewer of them)."""
    lines = [
        f"match {record.match_id}: {record.challenge} ({record.challenge_title}), "
        + (
            f"seed {record.seed}"
            if record.seed is not None
            else f"seed secret until the match closes (commitment {record.seed_commitment})"
        ),
        f"state {record.match_state}, finish: {record.finish_reason or 'not yet'}, "
        f"winner: {record.winner or 'none'}, elapsed {duration(record.elapsed_ms)}, "
        f"{record.last_sequence} events, {record.infrastructure_failures} infrastructure failures",
        "",
    ]
    rows: list[tuple[str, ...]] = []
    for name, territory in record.territories.items():
        marks = []
        for mid, milestone in territory.milestones.items():
            if milestone.passed:
                mark = "✓"
            elif milestone.evaluating:
                mark = "…"
            else:
                mark = "✗" if milestone.attempts else "·"
            marks.append(f"{mid} {mark}{milestone.attempts or ''}")
        # A durable territory has no current failure, whatever it met on the way.
        failure = "-" if territory.durable_at_ms is not None else territory.failure_reason or "-"
        if territory.elimination_detail:
            failure = f"eliminated: {territory.elimination_detail}"
        rows.append(
            (
                name,
                territory.agent,
                territory.state,
                territory.competitor_state,
                str(territory.milestone_points),
                " ".join(marks),
                failure,
            )
        )
    header = ("territory", "agent", "host", "competitor", "points", "milestones", "current failure")
    lines += [columns(header, rows), ""]
    first = next(iter(record.territories.values()), None)
    if first is not None:
        # Whatever the challenge's milestones are: their ids, titles and points, in order.
        rows = [
            (mid, str(m.points_available), record.milestone_titles.get(mid, ""))
            for mid, m in first.milestones.items()
        ]
        lines += [columns(("milestone", "points", "title"), rows), ""]
    rows = []
    for name, territory in record.territories.items():
        ledger = territory.ledger
        stopped = "-"
        if territory.judging_stopped_reason:
            stopped = f"{duration(territory.judging_stopped_at_ms or 0)}: " + (
                territory.judging_stopped_detail or territory.judging_stopped_reason
            )
        rows.append(
            (
                name,
                *(str(getattr(ledger, key)) for key in LEDGER_COLUMNS),
                stopped,
            )
        )
    lines += [columns(("ledger", *LEDGER_COLUMNS, "judging stopped"), rows), ""]
    for name, territory in record.territories.items():
        if territory.disk_frozen_at_ms is not None:
            why = territory.disk_frozen_detail or "over its disk quota"
            lines += [f"{name}: disk frozen at {duration(territory.disk_frozen_at_ms)}: {why}", ""]
    rows = []
    for name, agent in record.agents.items():
        state = "running" if agent.running else (agent.terminal_state or "not started")
        cost = f"{agent.cost_microusd / 1e6:.4f}" + ("" if agent.cost_known else "+?")
        detail = " ".join((agent.terminal_detail or "").split())
        if len(detail) > 80:
            detail = detail[:79] + "…"
        tokens = f"{agent.input_tokens}/{agent.output_tokens}"
        rows.append((name, agent.model, state, tokens, cost, detail))
    lines.append(columns(("agent", "model", "state", "tokens in/out", "cost $", "detail"), rows))
    console.print(printable("\n".join(lines)), markup=False, highlight=False, soft_wrap=True)


LEDGER_COLUMNS = (
    "acknowledged",
    "verified",
    "lost",
    "corrupted",
    "stale",
    "unexpected",
    "forgiven",
    "indeterminate",
)
"""The durability ledger's summary, as `opsarena show` prints it per territory."""


def ls(
    limit: Annotated[int, typer.Option("--limit", min=1, help="Most matches to list.")] = 20,
    db: DbOption = None,
) -> None:
    """List recent matches, newest first: id, challenge, state, winner, duration."""
    with open_db(db) as store:
        rows = asyncio.run(_ls_rows(store, limit))
    header = ("match", "challenge", "state", "finish", "winner", "duration", "created")
    console.print(printable(columns(header, rows)), markup=False, highlight=False, soft_wrap=True)


async def _ls_rows(store: EventStore, limit: int) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for summary in await store.list_matches(limit):
        if is_tournament_stream(summary.match_id):
            continue  # `opsarena tournament ls` lists those
        created = summary.created_wall[:19].replace("T", " ")
        try:
            record = fold_events(await store.read(summary.match_id))
        except EventLogError:
            rows.append((summary.match_id, "?", "invalid log", "-", "-", "-", created))
            continue
        rows.append(
            (
                record.match_id,
                record.challenge,
                record.match_state,
                record.finish_reason or "-",
                record.winner or "-",
                duration(record.elapsed_ms),
                created,
            )
        )
    return rows


def events(
    match_id: Annotated[str, typer.Argument(metavar="MATCH", help="Match id.")],
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new events until the match closes."),
    ] = False,
    after: Annotated[int, typer.Option("--after", min=0, help="Start after this seq.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    db: DbOption = None,
) -> None:
    """Print a match's events in order (`--follow` waits for new ones)."""
    with open_db(db) as store:
        asyncio.run(_print_events(store, match_id, after=after, follow=follow, as_json=as_json))


async def _print_events(
    store: EventStore, match_id: str, *, after: int, follow: bool, as_json: bool
) -> None:
    summary = await store.summary(match_id)
    if summary is None:
        raise MatchNotFoundError(
            f"no match {match_id!r} in the event log: `opsarena ls` lists them"
        )
    if not follow or (summary.last_type == "match_closed" and summary.last_seq <= after):
        for event in await store.read(match_id, after=after):
            _print_event(event, as_json)
        return
    async for event in store.follow(match_id, after=after):
        _print_event(event, as_json)
        if event.type == "match_closed":
            return


def _print_event(event: StoredEvent, as_json: bool) -> None:
    if as_json:
        line = json.dumps(event.to_json(), separators=(",", ":"), ensure_ascii=False)
    else:
        data = json.dumps(event.data, separators=(",", ":"), ensure_ascii=False)
        if len(data) > EVENT_TEXT_LIMIT:
            data = data[: EVENT_TEXT_LIMIT - 1] + "…"
        line = printable(f"{event.seq:>6} {event.t_ms:>9}ms {event.type:<18} {data}")
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
