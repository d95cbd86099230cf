"""The terminal view of a running match: a live rich table, or plain progress lines.

Both read the event log (not the controller), one batch at a time, through the
incremental fold, so what they show is exactly what the record will say. Events
another process appends (`opsarena done`) appear too.
"""

from __future__ import annotations

import asyncio
import contextlib

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from opsarena.cli.output import printable
from opsarena.cli.records import duration
from opsarena.match.fold import RecordFolder
from opsarena.match.record import MatchRecord
from opsarena.store import EventStore, StoredEvent

REFRESH_S = 0.25


def render(record: MatchRecord) -> Group:
    """One frame: the match line, then one row per territory."""
    head = Text(
        f"match {record.match_id}  {record.challenge}  {record.match_state}  "
        f"t={duration(record.elapsed_ms)}",
        style="bold",
    )
    if record.finish_reason:
        head.append(f"  finish: {record.finish_reason}, winner: {record.winner or 'none'}")
    first = next(iter(record.territories.values()), None)
    names = list(first.milestones) if first is not None else []
    legend = Text("milestones: " + "  ".join(f"{i} {m}" for i, m in enumerate(names, 1)))
    legend.append("   (green passed, red failed, yellow evaluating)", style="dim")
    table = Table("territory")
    table.add_column("milestones", min_width=4 * len(names), no_wrap=True)
    for column in ("points", "host", "agent"):
        table.add_column(column)
    table.add_column("current failure", overflow="fold")
    for name, territory in record.territories.items():
        chips = Text(no_wrap=True)
        for index, milestone in enumerate(territory.milestones.values(), 1):
            if milestone.passed:
                chips.append(f" {index} ", style="black on green")
            elif milestone.evaluating:
                chips.append(f" {index} ", style="black on yellow")
            elif milestone.failure_reason:
                chips.append(f" {index} ", style="white on red")
            else:
                chips.append(f" {index} ", style="dim")
            chips.append(" ")
        agent = record.agents.get(territory.agent)
        agent_state = "-"
        if agent is not None:
            agent_state = "running" if agent.running else (agent.terminal_state or "waiting")
        failure = "-" if territory.durable_at_ms is not None else territory.failure_reason or "-"
        table.add_row(
            printable(name),
            chips,
            str(territory.milestone_points),
            territory.state,
            agent_state,
            Text(printable(failure)),
        )
    return Group(head, legend, table)


def progress_line(event: StoredEvent) -> str | None:
    """The plain-text line for an event worth a line without a TTY, or None."""
    data = event.data
    at = f"[{duration(event.t_ms):>7}]"
    match event.type:
        case "host_provisioned":
            return f"{at} host {data['host']} ready in {data['provision_ms']} ms"
        case "host_failed":
            return f"{at} host for {data['territory']} failed: {data['error']}"
        case "preflight":
            verdict = "ok" if data["ok"] else "REFUSED"
            return f"{at} preflight {data['territory']}: {verdict}"
        case "match_started":
            return f"{at} match started: agents go"
        case "milestone_passed":
            return (
                f"{at} {data['territory']}: {data['milestone']} passed "
                f"(+{data['points']}, attempt {data['attempt']})"
            )
        case "fault_injected":
            return (
                f"{at} {data['territory']}: injected {data['fault']} ({data.get('detail') or ''})"
            )
        case "attempt_result" if data["verdict"] != "passed" and data["attempt"] == 1:
            return (
                f"{at} {data['territory']}: {data['milestone']} {data['verdict']}: "
                f"{data.get('failure_reason')}"
            )
        case "agent_ended":
            detail = data.get("terminal_detail") or ""
            return f"{at} agent {data['agent']} {data['terminal_state']}: {detail}"
        case "match_finished":
            return f"{at} finished: {data['finish_reason']}; winner {data.get('winner') or 'none'}"
        case _:
            return None


async def watch(store: EventStore, match_id: str, console: Console, *, live: bool) -> None:
    """Show the match until cancelled: a live table when `live`, else progress lines."""
    folder = RecordFolder()
    after = 0
    view: Live | None = None
    try:
        while True:
            batch = await store.read(match_id, after=after)
            for event in batch:
                after = event.seq
                folder.apply(event)
                if not live:
                    line = progress_line(event)
                    if line:
                        console.print(
                            printable(line), markup=False, highlight=False, soft_wrap=True
                        )
            if live and after:
                if view is None:
                    view = Live(render(folder.record()), console=console, refresh_per_second=4)
                    view.start()
                else:
                    view.update(render(folder.record()))
            await asyncio.sleep(REFRESH_S)
    finally:
        if view is not None:
            with contextlib.suppress(Exception):
                batch = await asyncio.shield(store.read(match_id, after=after))
                for event in batch:
                    folder.apply(event)
                view.update(render(folder.record()))
            view.stop()
