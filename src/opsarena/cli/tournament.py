"""`opsarena tournament run/resume/ls/show/report` and `opsarena leaderboard`.

The progress view and every table read the event log (the tournament's stream and its
matches' logs), never the runner. Errors are one line per problem with exit code 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table

from opsarena.cli.output import console, err_console
from opsarena.cli.records import DbOption, columns, duration, open_db
from opsarena.cli.run import ServeOption
from opsarena.errors import TournamentError, UsageError
from opsarena.hosts import DEFAULT_DRIVER, HostSpec
from opsarena.ratings import Leaderboard, leaderboard
from opsarena.store import EventStore, is_postgres_url, resolve_target
from opsarena.store.base import Wake
from opsarena.tournament import (
    TournamentRecord,
    TournamentRunner,
    eta_s,
    is_tournament_stream,
    load_tournament,
    load_tournament_record,
    log_outcomes,
    machine_parallel,
    read_record,
    tournament_outcomes,
)
from opsarena.tournament.record import AttemptRecord, TournamentFolder, stream_id
from opsarena.web import scoreboard_while

if TYPE_CHECKING:
    from opsarena.tournament.ray_exec import RayExecutor

app = typer.Typer(
    help="Tournaments: many matches, ratings and a leaderboard.", no_args_is_help=True
)

ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
POLL_S = 0.5
"""How often progress looks at the log when the store cannot say it changed (SQLite)."""
TournamentId = Annotated[str, typer.Argument(metavar="ID", help="Tournament id.")]
DriverOption = Annotated[
    str, typer.Option("--driver", envvar="OPSARENA_DRIVER", help="Host driver.")
]
QuietOption = Annotated[bool, typer.Option("--quiet", help="Plain progress lines, no live bars.")]
RayOption = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS|auto",
        help="Play each match as a task on a Ray cluster (needs a PostgreSQL --db).",
    ),
]


def _machine() -> tuple[int, int]:
    """CPUs this process may use and MiB of memory available now."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    available_kib = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available_kib = int(line.split()[1])
    return cpus or 1, available_kib // 1024 or 1024


def _parallel(requested: int, territories: int) -> int:
    cpus, memory_mb = _machine()
    chosen = machine_parallel(
        requested,
        territories_per_match=territories,
        cpus=cpus,
        memory_available_mb=memory_mb,
        host_memory_mb=HostSpec("", "", "").memory_mb,
    )
    if chosen < requested:
        err_console.print(
            f"playing {chosen} matches at once, not {requested}: this machine has {cpus} CPUs "
            f"and {memory_mb} MiB available for {territories} hosts per match",
            markup=False,
        )
    return chosen


@app.command("run")
def run(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="Tournament file (TOML).")],
    tournament_id: Annotated[
        str | None, typer.Option("--id", help="Tournament id (default: from the time).")
    ] = None,
    parallel: Annotated[
        int | None, typer.Option("--parallel", min=1, help="Matches at once (file: parallel).")
    ] = None,
    quiet: QuietOption = False,
    driver: DriverOption = DEFAULT_DRIVER,
    db: DbOption = None,
    serve: ServeOption = False,
    ray: RayOption = None,
) -> None:
    """Play every match of a tournament file; print the leaderboard."""
    if tournament_id is not None and not ID_RE.match(tournament_id):
        raise UsageError(f"--id {tournament_id!r}: use 1-40 lowercase letters, digits and '-'")
    plan = load_tournament(file)
    executor = _executor(ray, db, plan.territories_per_match, driver)
    if executor is None:
        lanes = _parallel(parallel or plan.parallel, plan.territories_per_match)
    else:
        lanes = parallel or _cluster_lanes(executor, plan.territories_per_match)
    with open_db(db) as store, scoreboard_while(db, serve) as scoreboard:

        async def main() -> TournamentRecord:
            runner = await TournamentRunner.create(
                store, plan, parallel=lanes, tournament_id=tournament_id, driver=driver,
                executor=executor,
            )  # fmt: skip
            err_console.print(
                f"tournament {runner.tournament_id}: {len(plan.slots)} matches, "
                f"{lanes} at once (resume after a kill: opsarena tournament resume "
                f"{runner.tournament_id})",
                markup=False,
                soft_wrap=True,
            )
            if scoreboard is not None:
                url = f"{scoreboard.url}/tournaments/{runner.tournament_id}"
                err_console.print(f"scoreboard: {url}", markup=False, soft_wrap=True)
            return await _with_progress(store, runner, quiet=quiet)

        record = asyncio.run(main())
        board = _board(store, record, None)
    _finish(record, board)


@app.command("resume")
def resume(
    tournament_id: TournamentId,
    parallel: Annotated[
        int | None, typer.Option("--parallel", min=1, help="Matches at once.")
    ] = None,
    quiet: QuietOption = False,
    driver: DriverOption = DEFAULT_DRIVER,
    db: DbOption = None,
    ray: RayOption = None,
) -> None:
    """Continue a tournament whose controller died: no match lost or played twice."""
    with open_db(db) as store:

        async def main() -> TournamentRecord:
            runner = await TournamentRunner.resume(store, tournament_id, driver=driver)
            territories = runner.plan.territories_per_match
            runner.executor = _executor(ray, db, territories, driver)
            if runner.executor is None:
                runner.parallel = _parallel(parallel or runner.parallel, territories)
            else:
                runner.parallel = parallel or _cluster_lanes(runner.executor, territories)
            return await _with_progress(store, runner, quiet=quiet)

        record = asyncio.run(main())
        board = _board(store, record, None)
    _finish(record, board)


def _executor(
    address: str | None, db: str | None, territories: int, driver: str
) -> RayExecutor | None:
    """The Ray executor `--ray` asks for (None without it), connected and checked."""
    if address is None:
        return None
    target = resolve_target(db)
    if not is_postgres_url(target):
        raise UsageError(
            "--ray needs a PostgreSQL event log every node can reach: --db postgresql://..."
        )
    from opsarena.tournament.ray_exec import RayExecutor, connect

    executor = RayExecutor(connect(address), target, territories=territories, driver=driver)
    executor.check_capacity()
    return executor


def _cluster_lanes(executor: RayExecutor, territories: int) -> int:
    """Matches in flight at once on the cluster: as many as its territory units hold."""
    return max(1, executor.check_capacity() // max(1, territories))


def _finish(record: TournamentRecord, board: Leaderboard) -> None:
    counts = record.summary_counts()
    console.print(
        f"tournament {record.tournament_id} finished: {counts['counted']} matches counted, "
        f"{counts['void']} void; seed {record.seed}",
        markup=False,
        soft_wrap=True,
    )
    _print_board(board)
    console.print(
        f"look again: opsarena leaderboard --tournament {record.tournament_id}", markup=False
    )


async def _with_progress(
    store: EventStore, runner: TournamentRunner, *, quiet: bool
) -> TournamentRecord:
    live = err_console.is_terminal and not quiet
    stop = asyncio.Event()
    viewer = asyncio.create_task(
        _watch(store, runner.tournament_id, err_console, live=live, stop=stop)
    )
    try:
        record = await runner.run()
    except BaseException:
        viewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await viewer
        raise
    stop.set()  # one last look, so the last match's line is printed too
    await viewer
    return record


async def _watch(
    store: EventStore, tournament_id: str, out: Console, *, live: bool, stop: asyncio.Event
) -> None:
    """Progress from the log: a bar per running match (milestones passed of all) and one
    for the tournament with its ETA; or, not live, one line per match that ends. Between
    looks it waits on the store's `changes()` for the tournament's stream and its running
    matches (PostgreSQL: woken at their next append; SQLite: every `POLL_S`), or `stop`."""
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
        console=out, disable=not live,
    )  # fmt: skip
    view = _ProgressView(store, tournament_id, out, progress, live=live)
    async with store.changes() as wake:
        with progress:
            while True:
                watched = await view.look()
                if stop.is_set():
                    return
                await _until_change_or_stop(wake, watched, stop)


async def _until_change_or_stop(wake: Wake, watched: set[str], stop: asyncio.Event) -> None:
    waiters = {asyncio.ensure_future(wake(watched, POLL_S)), asyncio.ensure_future(stop.wait())}
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


class _ProgressView:
    """What `_watch` shows, updated from the log by each `look`."""

    def __init__(
        self, store: EventStore, tournament_id: str, out: Console, progress: Progress, *,
        live: bool,
    ) -> None:  # fmt: skip
        self.store, self.tournament_id, self.out = store, tournament_id, out
        self.progress, self.live = progress, live
        self.folder = TournamentFolder()
        self.seen_ended: set[str] = set()
        self.started: dict[str, float] = {}
        self.finished_s: list[float] = []
        self.overall: TaskID | None = None
        self.bars: dict[str, TaskID] = {}

    async def look(self) -> set[str]:
        """Read what is new and redraw; returns the streams whose next append matters (the
        tournament's and its running matches')."""
        store, progress, bars = self.store, self.progress, self.bars
        stream = stream_id(self.tournament_id)
        for event in await store.read(stream, after=self.folder.last_sequence):
            self.folder.apply(event)
        record = self.folder.record()
        total = len(record.slots)
        if self.overall is None:
            self.overall = progress.add_task("tournament", total=total, info="")
        done = 0
        for slot in record.slots:
            for attempt in slot.attempts:
                mid = attempt.match_id
                self.started.setdefault(mid, time.monotonic())
                if attempt.ended and mid not in self.seen_ended:
                    self.seen_ended.add(mid)
                    self.finished_s.append(time.monotonic() - self.started[mid])
                    if mid in bars:
                        progress.remove_task(bars.pop(mid))
                    if not self.live:
                        what = "counted" if attempt.counted else f"void ({attempt.why})"
                        self.out.print(f"slot {slot.slot}/{total} match {mid}: {what}",
                                       markup=False, soft_wrap=True)  # fmt: skip
            if slot.settled(record.retries):
                done += 1
        running = [(s.slot, s.attempts[-1].match_id) for s in record.slots if s.state == "playing"]
        for _, mid in running:
            match = await read_record(store, mid)
            passed = possible = 0
            state = "starting"
            if match is not None:
                state = match.match_state
                for territory in match.territories.values():
                    possible += len(territory.milestones)
                    passed += sum(1 for m in territory.milestones.values() if m.passed)
            if mid not in bars:
                bars[mid] = progress.add_task(mid, total=max(possible, 1), info=state)
            progress.update(bars[mid], completed=passed, total=max(possible, 1), info=state)
        pending = total - done - len(running)
        eta = eta_s(
            self.finished_s,
            pending=pending,
            running_elapsed_s=[time.monotonic() - self.started[m] for _, m in running],
            parallel=record.parallel,
        )
        progress.update(
            self.overall, completed=done,
            info=f"{done}/{total}  ETA {duration(int(eta * 1000)) if eta is not None else '?'}",
        )  # fmt: skip
        return {stream, *(mid for _, mid in running)}


# ---- reading back ------------------------------------------------------------------


async def _tournament_records(store: EventStore) -> list[TournamentRecord]:
    records = []
    for summary in await store.list_matches():
        if is_tournament_stream(summary.match_id):
            tid = summary.match_id.partition(":")[2]
            records.append(await load_tournament_record(store, tid))
    return records


@app.command("ls")
def ls(db: DbOption = None) -> None:
    """List tournaments, newest first."""
    with open_db(db) as store:
        records = asyncio.run(_tournament_records(store))
    rows: list[tuple[str, ...]] = []
    for record in records:
        counts = record.summary_counts()
        rows.append(
            (
                record.tournament_id,
                record.name or "-",
                record.state,
                f"{counts['counted']}/{len(record.slots)}",
                str(counts["void"]),
                str(counts["playing"]),
                record.created_at[:19].replace("T", " "),
            )
        )
    header = ("tournament", "name", "state", "counted", "void", "playing", "created")
    console.print(columns(header, rows), markup=False, highlight=False, soft_wrap=True)


@app.command("show")
def show(
    tournament_id: TournamentId,
    as_json: Annotated[bool, typer.Option("--json", help="The tournament record as JSON.")] = False,
    db: DbOption = None,
) -> None:
    """Show a tournament: its slots, their matches, and whether each counts."""
    with open_db(db) as store:
        record = asyncio.run(load_tournament_record(store, tournament_id))
    if as_json:
        sys.stdout.write(record.model_dump_json(indent=2) + "\n")
        return
    counts = record.summary_counts()
    lines = [
        f"tournament {record.tournament_id} {record.name!r}: {record.state}, "
        f"{counts['counted']}/{len(record.slots)} counted, {counts['void']} void, "
        f"{counts['playing']} playing; runs {record.runs}",
        f"seed {record.seed or '(revealed when finished)'}, commitment {record.seed_commitment}",
        "",
    ]
    rows: list[tuple[str, ...]] = []
    for slot in record.slots:
        attempts: list[AttemptRecord | None] = [*slot.attempts] or [None]
        for attempt in attempts:
            rows.append(
                (
                    str(slot.slot),
                    slot.challenge,
                    str(slot.trial),
                    ",".join(slot.group),
                    attempt.match_id if attempt else "-",
                    slot.state if attempt is None else _attempt_state(attempt.ended,
                                                                       attempt.counted),
                    attempt.why if attempt else "",
                )
            )  # fmt: skip
    header = ("slot", "challenge", "trial", "group", "match", "state", "why")
    lines.append(columns(header, rows))
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


def _attempt_state(ended: bool, counted: bool | None) -> str:
    if not ended:
        return "playing"
    return "counted" if counted else "void"


@app.command("report")
def report(
    tournament_id: TournamentId,
    html: Annotated[Path, typer.Option("--html", help="Write one self-contained HTML file.")],
    db: DbOption = None,
) -> None:
    """Write a tournament's leaderboard and plots as one HTML file to share."""
    from opsarena.web.tournament import report_html

    parent = html.parent if str(html.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"--html {html}: directory {parent} does not exist")
    if html.is_dir():
        raise UsageError(f"--html {html} is a directory")
    with open_db(db) as store:
        record = asyncio.run(load_tournament_record(store, tournament_id))
        board = _board(store, record, None)
    text = report_html(record, board)
    temporary = html.with_name(f".{html.name}.tmp")
    temporary.write_text(text)
    temporary.replace(html)
    console.print(f"wrote {html} ({len(text)} bytes)", markup=False)


def _board(
    store: EventStore, record: TournamentRecord | None, challenge: str | None
) -> Leaderboard:
    async def outcomes() -> Any:
        if record is None:
            return await log_outcomes(store)
        return await tournament_outcomes(store, record)

    chosen = asyncio.run(outcomes())
    if challenge is not None and all(o.challenge != challenge for o in chosen):
        known = sorted({o.challenge for o in chosen})
        raise UsageError(
            f"--challenge {challenge!r}: no counted match of it "
            f"(challenges with matches: {', '.join(known) or 'none'})"
        )
    return leaderboard(chosen, challenge=challenge)


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


BOARD_HEADER = (
    "#", "competitor", "durable", "95% CI", "mu±sigma", "ordinal", "BT [95%]", "points",
    "t durable", "$/durable",
)  # fmt: skip


def board_rows(board: Leaderboard) -> list[tuple[str, ...]]:
    """The leaderboard's rows as text cells under `BOARD_HEADER`."""
    rows: list[tuple[str, ...]] = []
    for place, row in enumerate(board.rows, 1):
        usage = row.usage
        low, high = usage.durable_rate_ci
        median = usage.median_ms_to_durable
        rows.append(
            (
                str(place),
                row.competitor,
                f"{usage.durable}/{usage.matches}",
                f"{low:.2f}-{high:.2f}",
                f"{row.mu:.1f}±{row.sigma:.1f}",
                _cell(row.ordinal),
                f"{row.bt.score:.0f} [{row.bt.low:.0f}, {row.bt.high:.0f}]",
                _cell(usage.mean_points, 1),
                duration(int(median)) if median is not None else "-",
                _cell(usage.cost_per_durable_usd, 4),
            )
        )
    return rows


def _print_board(board: Leaderboard) -> None:
    """A rich table in a terminal; plain columns (never cut) in a pipe or a log."""
    title = f"leaderboard of {board.matches} counted matches"
    if console.is_terminal:
        table = Table(
            title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
            collapse_padding=True,
        )  # fmt: skip
        for column in BOARD_HEADER:
            left = column == "competitor"
            table.add_column(
                column, justify="left" if left else "right", no_wrap=left, overflow="fold"
            )
        for cells in board_rows(board):
            table.add_row(*cells)
        console.print(table)
    else:
        console.print(
            title + "\n" + columns(BOARD_HEADER, board_rows(board)),
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
    check = board.order
    verdict = "agree" if check.agree else "DISAGREE"
    console.print(
        f"order check: ratings from {check.shuffles} shuffled match orders {verdict} within "
        f"their sigma (worst gap {check.worst_gap_sigma:.2f} sigma)",
        markup=False,
        soft_wrap=True,
    )


CSV_COLUMNS = (
    "competitor", "matches", "durable", "durable_rate", "durable_rate_low", "durable_rate_high",
    "mu", "sigma", "ordinal", "bt", "bt_low", "bt_high", "mean_points", "median_ms_to_durable",
    "tokens_per_durable", "cost_per_durable_usd",
)  # fmt: skip


def board_csv(board: Leaderboard) -> str:
    """The leaderboard as CSV, best first; empty cells for unknown values."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in board.to_json():
        flat = {
            **row,
            "durable_rate_low": row["durable_rate_ci"][0],
            "durable_rate_high": row["durable_rate_ci"][1],
            "bt_low": row["bt_ci"][0],
            "bt_high": row["bt_ci"][1],
        }
        writer.writerow(["" if flat[c] is None else flat[c] for c in CSV_COLUMNS])
    return out.getvalue()


def leaderboard_command(
    tournament: Annotated[
        str | None, typer.Option("--tournament", help="Only this tournament's matches.")
    ] = None,
    challenge: Annotated[
        str | None, typer.Option("--challenge", help="Only matches of this challenge.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON array, best first.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV, best first.")] = False,
    db: DbOption = None,
) -> None:
    """Rank competitors over counted matches (docs/TOURNAMENTS.md has every statistic).

    Durable rate with its 95 % Wilson interval, OpenSkill mu, sigma and ordinal,
    Bradley-Terry with bootstrap interval, points, time and cost per durable result.
    """
    if as_json and as_csv:
        raise UsageError("--json and --csv: choose one")
    if tournament is not None and (tournament.startswith("tournament:") or not tournament):
        raise TournamentError(f"--tournament {tournament!r}: give the id, without 'tournament:'")
    with open_db(db) as store:
        record = asyncio.run(load_tournament_record(store, tournament)) if tournament else None
        board = _board(store, record, challenge)
    if as_json:
        sys.stdout.write(json.dumps(board.to_json(), indent=2) + "\n")
    elif as_csv:
        sys.stdout.write(board_csv(board))
    else:
        _print_board(board)
