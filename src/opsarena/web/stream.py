"""Server-sent events fed from the event log: one match as it happens, and the matches list.

Both streams wait on the store's `changes()` (another process writes the log): SQLite is
polled, PostgreSQL notifies, so they see a match run by `opsarena run` in any process
within about one poll or at once. Messages (`event:` names):

- match stream: `event` (one envelope, `id` its seq) for every event after the cursor,
  `record` (the folded record, `id` the last seq folded) whenever the stream has caught
  up, `end` after `match_closed` (then the stream closes), `broken` when the log cannot be
  folded (then it closes; not `error`, which EventSource keeps for its own failures).
  A browser that reconnects sends `Last-Event-ID` and resumes after it.
- matches stream: `matches` (the list rows) at once and whenever any match changes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from sse_starlette import ServerSentEvent

from opsarena.errors import EventLogError
from opsarena.match.fold import RecordFolder
from opsarena.store import EventStore
from opsarena.web.records import READ_BATCH, READ_BYTES, RecordCache, list_items

MATCH_POLL_S = 0.25
"""How often a match stream asks the log for new events once it has caught up."""
LIST_POLL_S = 1.0
"""How often the matches stream asks the log whether any match changed."""
PING_S = 15.0
"""Seconds between keep-alive comments on an idle stream."""


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def match_messages(
    store: EventStore, match_id: str, after: int, *, poll_s: float = MATCH_POLL_S
) -> AsyncIterator[ServerSentEvent]:
    """The messages of one match's stream (see the module docstring). Events with
    `seq <= after` are folded into the record but not sent."""
    folder = RecordFolder()
    cursor = 0
    async with store.changes() as wake:
        while True:
            batch = await store.read(match_id, after=cursor, limit=READ_BATCH, max_bytes=READ_BYTES)
            if not batch:
                await wake(match_id, poll_s)
                continue
            closed = False
            for event in batch:
                try:
                    folder.apply(event)
                except EventLogError as exc:
                    yield ServerSentEvent(data=_json({"detail": str(exc)}), event="broken")
                    return
                cursor = event.seq
                if event.seq > after:
                    yield ServerSentEvent(
                        data=_json(event.to_json()), event="event", id=str(event.seq)
                    )
                if event.type == "match_closed":
                    # Anything after the close (a late `opsarena done`) changes nothing.
                    closed = True
                    break
            if closed or len(batch) < READ_BATCH:
                record = folder.record().model_dump(mode="json", by_alias=True)
                yield ServerSentEvent(data=_json(record), event="record", id=str(cursor))
            if closed:
                yield ServerSentEvent(data=_json({"last_seq": cursor}), event="end")
                return


async def matches_messages(
    store: EventStore, cache: RecordCache, limit: int, *, poll_s: float = LIST_POLL_S
) -> AsyncIterator[ServerSentEvent]:
    """The messages of the matches stream: the newest `limit` rows, again on every change."""
    seen: list[tuple[str, int]] | None = None
    async with store.changes() as wake:
        while True:
            summaries = await store.list_matches(limit)
            now = [(summary.match_id, summary.last_seq) for summary in summaries]
            if now != seen:
                seen = now
                rows = await list_items(cache, summaries)
                yield ServerSentEvent(
                    data=_json([row.model_dump(mode="json") for row in rows]), event="matches"
                )
            await wake("", poll_s)
