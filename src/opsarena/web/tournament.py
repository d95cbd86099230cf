"""The tournament view: its JSON (record, leaderboard, running matches), live messages,
and the self-contained HTML report.

One payload feeds the live page (`/api/tournaments/ID` and the `tournament` messages of
its stream) and the report file, so what a shared report shows is what the page showed.
The seed appears only once the tournament finished; until then the commitment does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sse_starlette import ServerSentEvent

from opsarena.ratings import Leaderboard, leaderboard
from opsarena.store import EventStore
from opsarena.tournament import (
    TournamentRecord,
    fold_tournament,
    read_record,
    stream_id,
    tournament_outcomes,
)

STATIC_DIR = Path(__file__).parent / "static"
POLL_S = 1.0
"""How often a tournament stream looks for a change (its own log or a running match's)
when the store cannot say (SQLite); PostgreSQL wakes it at the change."""
LIVE_BOOTSTRAP = 100
"""Bootstrap resamples for the live page; the report and the CLI use the default."""


def view_json(
    record: TournamentRecord, board: Leaderboard, running: list[dict[str, Any]]
) -> dict[str, Any]:
    """The payload of the page and the report (pure)."""
    check = board.order
    return {
        "tournament": record.model_dump(mode="json"),
        "counts": record.summary_counts(),
        "leaderboard": board.to_json(),
        "matches_counted": board.matches,
        "order_check": {
            "shuffles": check.shuffles,
            "worst_gap_sigma": check.worst_gap_sigma,
            "worst_competitor": check.worst_competitor,
            "agree": check.agree,
        },
        "running": running,
    }


async def tournament_view(
    store: EventStore, tournament_id: str, *, bootstrap_samples: int = LIVE_BOOTSTRAP
) -> dict[str, Any] | None:
    """The current payload of a tournament; None when the log has no such tournament."""
    events = await store.read(stream_id(tournament_id))
    if not events:
        return None
    record = fold_tournament(events)
    outcomes = await tournament_outcomes(store, record)
    board = await asyncio.to_thread(leaderboard, outcomes, bootstrap_samples=bootstrap_samples)
    running = []
    for slot in record.slots:
        if slot.state != "playing":
            continue
        match_id = slot.attempts[-1].match_id
        match = await read_record(store, match_id)
        passed = possible = 0
        if match is not None:
            for territory in match.territories.values():
                possible += len(territory.milestones)
                passed += sum(1 for m in territory.milestones.values() if m.passed)
        running.append(
            {
                "slot": slot.slot,
                "match_id": match_id,
                "state": match.match_state if match else "starting",
                "elapsed_ms": match.elapsed_ms if match else 0,
                "milestones_passed": passed,
                "milestones": possible,
            }
        )
    return view_json(record, board, running)


async def _fingerprint(store: EventStore, tournament_id: str) -> tuple[tuple[int, ...], set[str]]:
    """What changes whenever the tournament's log or a running match's log grows, and the
    streams to watch for it (the tournament's own and its running matches')."""
    stream = stream_id(tournament_id)
    summary = await store.summary(stream)
    if summary is None:
        return (0,), {stream}
    record = fold_tournament(await store.read(stream))
    seqs, watched = [summary.last_seq], {stream}
    for slot in record.slots:
        if slot.state == "playing":
            match_id = slot.attempts[-1].match_id
            match = await store.summary(match_id)
            seqs.append(match.last_seq if match else 0)
            watched.add(match_id)
    return tuple(seqs), watched


async def tournament_messages(
    store: EventStore, tournament_id: str, *, poll_s: float = POLL_S
) -> AsyncIterator[ServerSentEvent]:
    """`tournament` (the payload) at once and on every change; `end` once it finished.
    Waits on the store's `changes()` for the tournament's stream and its running matches:
    PostgreSQL wakes it at their next append (LISTEN/NOTIFY), SQLite is polled every
    `poll_s`."""
    seen: tuple[int, ...] | None = None
    async with store.changes() as wake:
        while True:
            now, watched = await _fingerprint(store, tournament_id)
            if now != seen:
                seen = now
                view = await tournament_view(store, tournament_id)
                if view is not None:
                    yield ServerSentEvent(data=_json(view), event="tournament")
                    if view["tournament"]["state"] == "finished":
                        yield ServerSentEvent(data=_json({"finished": True}), event="end")
                        return
            await wake(watched, poll_s)


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def report_html(record: TournamentRecord, board: Leaderboard) -> str:
    """One HTML file holding the page, its script, its style and the data: it opens from
    disk with no server and no network."""
    data = _json(view_json(record, board, [])).replace("</", "<\\/")
    page = (STATIC_DIR / "tournament.html").read_text()
    style = (STATIC_DIR / "style.css").read_text()
    scripts = "\n".join((STATIC_DIR / name).read_text() for name in ("common.js", "tournament.js"))
    page = page.replace(
        '<link rel="stylesheet" href="/static/style.css">', f"<style>\n{style}\n</style>"
    )
    scripts = scripts.replace("</script", "<\\/script")
    tags = '<script src="/static/common.js"></script>\n  <script src="/static/tournament.js">'
    page = page.replace(
        tags + "</script>",
        f'<script id="report-data" type="application/json">{data}</script>\n'
        f"<script>\n{scripts}\n</script>",
    )
    return page
