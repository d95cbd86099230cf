"""`opsarena run`, `opsarena demo` and `opsarena done`: play a match and take part in one.

Everything is checked before anything is made: the challenge, every agent spec,
the seed, the record path. Errors are one line with exit code 2. Nothing here prints the
seed while a match runs: the live view shows the log, which holds only its commitment, and
the summary printed at the end shows the seed once `match_closed` has revealed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from opsarena.agents.competitors import Competitor, competitor_from_cli, load_competitors
from opsarena.agents.done import (
    DONE_TOKEN_ENV,
    done_proof,
    human_instructions,
    operator_key,
    operator_key_path,
)
from opsarena.agents.registry import has_done_token
from opsarena.agents.scripted import check_scripted
from opsarena.challenges.catalog import find_challenge
from opsarena.cli.live import watch
from opsarena.cli.output import console, err_console
from opsarena.cli.records import DbOption, load_record, open_db, print_summary
from opsarena.errors import MatchError, UsageError
from opsarena.hosts import DEFAULT_DRIVER
from opsarena.match.controller import (
    DEFAULT_INODE_QUOTA,
    DEFAULT_LOG_BUDGET_MB,
    Controller,
    MatchPlan,
)
from opsarena.match.events import DoneRequested
from opsarena.match.record import MatchRecord
from opsarena.store import EventStore
from opsarena.web import scoreboard_while

DEMO_BUILDERS = {
    "reference": "scripted:reference",
    "in-memory": "scripted:in-memory",
    "not-enabled": "scripted:not-enabled",
    "idle": "scripted:idle",
}
SEED_RE = re.compile(r"^[0-9a-fA-F]{16,128}$")


def parse_builders(builders: list[str]) -> list[Competitor]:
    """`TERRITORY=AGENT` options as competitors; raises `UsageError` / `AgentSpecError`."""
    competitors = []
    for given in builders:
        territory, sep, agent = given.partition("=")
        if not sep or not territory or not agent:
            raise UsageError(
                f"--builder {given!r} must look like TERRITORY=AGENT (a=scripted:reference)"
            )
        competitors.append(competitor_from_cli(territory, agent))
    return competitors


def parse_seed(seed: str | None) -> bytes | None:
    if seed is None:
        return None
    if not SEED_RE.match(seed) or len(seed) % 2:
        raise UsageError(f"--seed {seed!r} must be an even number (16-128) of hex digits")
    return bytes.fromhex(seed)


def check_record_path(path: Path | None) -> None:
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"--record {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--record {path}: directory {parent} is not writable")
    if path.is_dir():
        raise UsageError(f"--record {path} is a directory")


def write_record(record: MatchRecord, path: Path) -> None:
    """Write the record atomically: a reader never sees half a file."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(record.model_dump(mode="json", by_alias=True), indent=2) + "\n")
    temporary.replace(path)


def play(
    plan: MatchPlan,
    db: str | None,
    *,
    quiet: bool,
    record_path: Path | None,
    serve: bool = False,
) -> MatchRecord:
    """Run the match of `plan` with the terminal view (and the web scoreboard while it
    runs, if `serve`); return its record."""
    live = sys.stdout.isatty() and not quiet
    with open_db(db) as store, scoreboard_while(db, serve) as scoreboard:

        async def main() -> MatchRecord:
            controller = Controller(plan, store)
            await controller.prepare()
            err_console.print(
                f"match {plan.match_id}: {len(plan.competitors)} territories", markup=False
            )
            viewer = asyncio.create_task(watch(store, plan.match_id, console, live=live))
            playing = asyncio.create_task(controller.run())
            try:
                # The URL is printed once the match is in the log: a page opened at once
                # must find it, never answer "no match".
                if scoreboard is not None and await _created(store, plan.match_id, playing):
                    url = f"{scoreboard.url}/matches/{plan.match_id}"
                    err_console.print(f"scoreboard: {url}", markup=False, soft_wrap=True)
                return await playing
            finally:
                for task in (playing, viewer):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

        try:
            record = asyncio.run(main())
        finally:
            if record_path is not None:
                with contextlib.suppress(Exception):
                    write_record(asyncio.run(load_record(store, plan.match_id)), record_path)
    return record


async def _created(store: EventStore, match_id: str, playing: asyncio.Task[MatchRecord]) -> bool:
    """Wait until the match's first event is in the log (True) or the match ended
    without one (False)."""

    async def first_event() -> None:
        async for _ in store.follow(match_id):
            return

    waiter = asyncio.create_task(first_event())
    try:
        await asyncio.wait({waiter, playing}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
    return waiter.done() and not waiter.cancelled() and waiter.exception() is None


ServeOption = Annotated[
    bool,
    typer.Option(
        "--serve", help="Serve the live scoreboard on 127.0.0.1 during the match; print its URL."
    ),
]


def run(
    challenge: Annotated[
        str,
        typer.Option(
            "--challenge",
            help="Built-in challenge name, or a challenge directory (or TOML file) path.",
        ),
    ] = "durable-records",
    builder: Annotated[
        list[str] | None,
        typer.Option("--builder", help="TERRITORY=AGENT, e.g. a=scripted:reference (repeat)."),
    ] = None,
    competitors: Annotated[
        Path | None, typer.Option("--competitors", help="Competitors file (TOML).")
    ] = None,
    time_limit: Annotated[
        float | None,
        typer.Option("--time-limit", min=1, help="Seconds (default: the challenge's)."),
    ] = None,
    drain: Annotated[
        float, typer.Option("--drain", min=0, help="Seconds agents get to stop.")
    ] = 5.0,
    seed: Annotated[
        str | None, typer.Option("--seed", help="Match seed (hex) for replays.")
    ] = None,
    finish: Annotated[
        str, typer.Option("--finish", help="first-durable (default) or all.")
    ] = "first-durable",
    keep_hosts: Annotated[
        bool, typer.Option("--keep-hosts", help="Leave the hosts running.")
    ] = False,
    record: Annotated[
        Path | None, typer.Option("--record", help="Write the record here (JSON).")
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", help="Plain progress lines, no live view.")
    ] = False,
    disk_quota: Annotated[
        int,
        typer.Option("--disk-quota", min=64, help="MiB a host may write before its disk freezes."),
    ] = 2048,
    inode_quota: Annotated[
        int,
        typer.Option(
            "--inode-quota",
            min=1000,
            help="Inodes (files, directories, links) a host may create on its disk before "
            "its disk freezes.",
        ),
    ] = DEFAULT_INODE_QUOTA,
    log_budget: Annotated[
        int,
        typer.Option(
            "--log-budget",
            min=1,
            help="MiB of events (output, transcript) each agent may add to the log; past "
            "them its events are counted, not stored.",
        ),
    ] = DEFAULT_LOG_BUDGET_MB,
    driver: Annotated[
        str, typer.Option("--driver", envvar="OPSARENA_DRIVER", help="Host driver.")
    ] = DEFAULT_DRIVER,
    db: DbOption = None,
    serve: ServeOption = False,
) -> None:
    """Run a match: provision hosts, start every agent at once, judge, finish, drain."""
    if finish not in ("first-durable", "all"):
        raise UsageError(f"--finish {finish!r} must be first-durable or all")
    entries: list[Competitor] = []
    if competitors is not None:
        loaded = load_competitors(competitors)
        entries += loaded.competitors
        if loaded.challenge and challenge == "durable-records":
            challenge = loaded.challenge
    entries += parse_builders(builder or [])
    if not entries:
        raise UsageError(
            "a match needs competitors: --builder TERRITORY=AGENT or --competitors FILE"
        )
    the_challenge = find_challenge(challenge)
    for entry in entries:
        if entry.kind == "scripted":
            check_scripted(entry.spec.arg, [the_challenge.directory])
    check_record_path(record)
    seed_bytes = parse_seed(seed)
    plan = MatchPlan(
        challenge=the_challenge,
        competitors=entries,
        time_limit_s=time_limit or the_challenge.time_limit_s,
        drain_s=drain,
        finish=finish,  # type: ignore[arg-type]
        keep_hosts=keep_hosts,
        driver=driver,
        disk_quota_mb=disk_quota,
        disk_inode_quota=inode_quota,
        log_budget_mb=log_budget,
    )
    if seed_bytes is not None:
        plan.seed = seed_bytes
    _announce_humans(plan)
    result = play(plan, db, quiet=quiet, record_path=record, serve=serve)
    print_summary(result)
    console.print(f"look again: opsarena show {result.match_id}", markup=False)


def _announce_humans(plan: MatchPlan) -> None:
    for competitor in plan.competitors:
        if has_done_token(competitor.kind):
            err_console.print(
                human_instructions(
                    plan.match_id, competitor.territory, plan.done_token(competitor.territory)
                ),
                markup=False,
                soft_wrap=True,
            )


def demo(
    quiet: Annotated[
        bool, typer.Option("--quiet", help="Plain progress lines, no live view.")
    ] = False,
    db: DbOption = None,
    serve: ServeOption = False,
) -> None:
    """A match of four scripted builders: reference, in-memory, not-enabled and idle."""
    challenge = find_challenge("durable-records")
    plan = MatchPlan(
        challenge=challenge,
        competitors=parse_builders([f"{t}={a}" for t, a in DEMO_BUILDERS.items()]),
        time_limit_s=120.0,
        drain_s=5.0,
    )
    result = play(plan, db, quiet=quiet, record_path=None, serve=serve)
    print_summary(result)
    console.print(
        f"look again: opsarena show {result.match_id}   (record as JSON: add --json)", markup=False
    )


DONE_WAIT_S = 15.0
"""How long `opsarena done` waits for the controller to accept the request."""


def done(
    match_id: Annotated[str, typer.Argument(metavar="MATCH", help="Match id.")],
    territory: Annotated[str, typer.Argument(help="Your territory.")],
    operator: Annotated[
        bool,
        typer.Option(
            "--operator",
            help="Declare it as the arena's operator (proven with the operator key file).",
        ),
    ] = False,
    db: DbOption = None,
) -> None:
    """Declare your territory finished (for `human` competitors).

    Give the token `opsarena run` printed for your territory in $OPSARENA_DONE_TOKEN (or
    type it when asked). The match's controller checks it and answers; nothing is
    declared without it.
    """
    with open_db(db) as store:
        record = asyncio.run(load_record(store, match_id))
        if territory not in record.territories:
            known = ", ".join(record.territories)
            raise UsageError(f"match {match_id} has no territory {territory!r} (it has {known})")
        if record.match_state != "running":
            raise MatchError(f"match {match_id} is {record.match_state}, not running")
        agent = record.agents[record.territories[territory].agent]
        if not has_done_token(agent.kind):
            raise UsageError(f"{territory} is played by a {agent.kind} agent, not a person")
        secret = _done_secret(operator)
        data = DoneRequested(
            territory=territory,
            by=getpass.getuser(),
            proof=done_proof(secret, match_id, territory),
            proof_kind="operator" if operator else "token",
        )
        accepted = asyncio.run(_request_done(store, match_id, data, record.elapsed_ms))
    if not accepted:
        what = "the operator key" if operator else "the token"
        raise MatchError(
            f"{territory} was not declared done: {what} does not match, "
            "or the match's controller is not running"
        )
    console.print(
        f"{territory} declared done; the referee makes its final verification", markup=False
    )


def _done_secret(operator: bool) -> str:
    """The secret `opsarena done` proves: the operator key, or the territory's token
    ($OPSARENA_DONE_TOKEN, else typed at a prompt). Raises `UsageError` without one."""
    if operator:
        key = operator_key()
        if key is None:
            raise UsageError(
                f"--operator needs the operator key {operator_key_path()}: "
                "run as the arena's user (or set OPSARENA_OPERATOR_KEY)"
            )
        return key
    token = os.environ.get(DONE_TOKEN_ENV, "").strip()
    if not token and sys.stdin.isatty():
        token = str(typer.prompt("done token", hide_input=True)).strip()
    if not token:
        raise UsageError(
            f"opsarena done needs your territory's token: set {DONE_TOKEN_ENV} "
            "to the token `opsarena run` printed for you"
        )
    return token


async def _request_done(store: EventStore, match_id: str, data: DoneRequested, t_ms: int) -> bool:
    """Log `data` and wait (at most `DONE_WAIT_S`) for the controller's `competitor_done`
    for its territory; True when it came."""
    seq = await store.append(match_id, data.event_type, data.model_dump(mode="json"), t_ms)
    try:
        async with asyncio.timeout(DONE_WAIT_S):
            async for event in store.follow(match_id, after=seq, poll_s=0.1):
                if event.type == "competitor_done" and event.data.get("territory") == (
                    data.territory
                ):
                    return True
                if event.type == "match_closed":
                    return False
    except TimeoutError:
        return False
    return False


def resume(
    match_id: Annotated[str, typer.Argument(metavar="MATCH", help="Match id.")],
    quiet: Annotated[
        bool, typer.Option("--quiet", help="Plain progress lines, no live view.")
    ] = False,
    driver: Annotated[
        str, typer.Option("--driver", envvar="OPSARENA_DRIVER", help="Host driver.")
    ] = DEFAULT_DRIVER,
    db: DbOption = None,
) -> None:
    """Continue a match whose controller died (or abort it if its hosts are gone).

    The referee takes up from the log with the match's own hosts; agents cannot be
    resumed and end `interrupted`.
    """
    live = sys.stdout.isatty() and not quiet
    with open_db(db) as store:
        summary = asyncio.run(store.summary(match_id))
        if summary is not None and summary.last_type == "match_closed":
            raise MatchError(f"match {match_id} is finished already: opsarena show {match_id}")
        if summary is not None:
            # A forged tail is set aside first; a log broken deeper is refused, one line.
            asyncio.run(Controller.repair_log(store, match_id))
        record = asyncio.run(load_record(store, match_id))
        if record.match_state == "finished":
            raise MatchError(f"match {match_id} is finished already: opsarena show {match_id}")
        challenge = find_challenge(record.challenge_source or record.challenge)

        async def main() -> MatchRecord:
            viewer = asyncio.create_task(watch(store, match_id, console, live=live))
            try:
                return await Controller.resume(store, record, challenge, driver=driver)
            finally:
                viewer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await viewer

        result = asyncio.run(main())
    print_summary(result)
    console.print(f"look again: opsarena show {result.match_id}", markup=False)
