"""Records for the scoreboard: one incremental fold per match, shared by every request.

Folding a long log on every request (or for every row of the matches list, every second)
would cost more than the server does otherwise, so `RecordCache` keeps a `RecordFolder`
per match and folds only the events appended since its last look. The log is append-only,
so a folder never needs to go back.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from opsarena.errors import EventLogError
from opsarena.match.fold import RecordFolder
from opsarena.match.record import MatchRecord
from opsarena.store import EventStore, MatchSummary
from opsarena.tournament.record import is_tournament_stream
from opsarena.web.models import MatchListItem

READ_BATCH = 2000
"""Events read from the log per query while catching up."""
READ_BYTES = 8 * 1024 * 1024
"""The most bytes of event data read at once (a log of huge events is read in pages)."""


@dataclass
class _Folded:
    folder: RecordFolder = field(default_factory=RecordFolder)
    seq: int = 0
    error: EventLogError | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class RecordCache:
    """The current record of any match in `store`, folded incrementally.

    `record` returns `None` for a match with no events and raises `EventLogError` when its
    log is impossible (and keeps raising it: the log is append-only, it cannot heal).
    """

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self._folded: dict[str, _Folded] = {}

    async def record(self, match_id: str) -> MatchRecord | None:
        folded = self._folded.setdefault(match_id, _Folded())
        async with folded.lock:
            if folded.error is not None:
                raise folded.error
            while True:
                batch = await self._store.read(
                    match_id, after=folded.seq, limit=READ_BATCH, max_bytes=READ_BYTES
                )
                for event in batch:
                    try:
                        folded.folder.apply(event)
                    except EventLogError as exc:
                        folded.error = exc
                        raise
                    folded.seq = event.seq
                if not batch:
                    break
            if folded.seq == 0:
                return None
            return folded.folder.record()


def list_item(
    summary: MatchSummary, record: MatchRecord | None, error: str | None
) -> MatchListItem:
    """The matches-list row of one match from the store's summary and its record (pure)."""
    item = MatchListItem(
        match_id=summary.match_id,
        created=summary.created_wall,
        updated=summary.updated_wall,
        last_seq=summary.last_seq,
        error=error,
    )
    if record is None:
        return item
    return item.model_copy(
        update={
            "challenge": record.challenge,
            "challenge_title": record.challenge_title,
            "state": record.match_state,
            "winner": record.winner,
            "finish_reason": record.finish_reason,
            "duration_ms": record.elapsed_ms if record.started_at is not None else None,
            "started_at": record.started_at,
            "territories": len(record.territories),
        }
    )


async def list_items(cache: RecordCache, summaries: list[MatchSummary]) -> list[MatchListItem]:
    """The list rows of the matches `summaries` names, in the same order (a tournament's
    own stream is not a match and is left out)."""
    items = []
    for summary in summaries:
        if is_tournament_stream(summary.match_id):
            continue
        try:
            record = await cache.record(summary.match_id)
        except EventLogError as exc:
            items.append(list_item(summary, None, str(exc)))
            continue
        items.append(list_item(summary, record, None))
    return items
