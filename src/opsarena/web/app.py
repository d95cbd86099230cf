"""The scoreboard application: the JSON API, its server-sent event streams, the pages.

`create_app(db_path)` builds a FastAPI app that reads one event log (read-only) and
nothing else. Routes:

- `GET /` and `GET /matches/{id}`: the static pages (`static/`), which call the API;
- `GET /api/matches`: the matches list, newest first;
- `GET /api/matches/{id}`: the match record (the seed-compatible fold of its events);
- `GET /api/matches/{id}/events?after=SEQ&limit=N&max_bytes=B`: raw events after `SEQ`,
  a page of at most N events and about B bytes of their data (always at least one); the
  `X-Next-After` header and a `Link: <...>; rel="next"` give the next page's `after`;
- `GET /api/matches/{id}/stream?after=SEQ`: server-sent events (see `web.stream`);
- `GET /api/stream`: server-sent events of the matches list;
- `GET /tournaments/{id}`: the tournament page; `GET /api/tournaments/{id}`: its record,
  leaderboard and running matches; `GET /api/tournaments/{id}/stream`: server-sent
  events of the same (see `web.tournament`);
- `GET /openapi.json`: the schema of all of the above.

An unknown match is 404 with `{"detail": "..."}`; a bad query value is 422; a log that
cannot be folded is 500 and an unusable database 503, both with a one-line `detail`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import FastAPI, Header, HTTPException, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from sse_starlette import EventSourceResponse

import opsarena
from opsarena.errors import EventLogError, StoreError
from opsarena.match.record import MatchRecord
from opsarena.store import EventStore
from opsarena.tournament.record import is_tournament_stream
from opsarena.web.models import ErrorBody, EventEnvelope, MatchListItem
from opsarena.web.readonly import open_read_only
from opsarena.web.records import RecordCache, list_items
from opsarena.web.stream import PING_S, match_messages, matches_messages
from opsarena.web.tournament import tournament_messages, tournament_view

STATIC_DIR = Path(__file__).parent / "static"
MAX_SEQ = 2**53 - 1
"""The largest `after` accepted: sequence numbers stay exact in JavaScript."""
MAX_EVENTS = 10_000
"""The most events one `/events` answer holds; page with `after`."""
EVENTS_BYTES = 4 * 1024 * 1024
"""The bytes of event data one `/events` answer holds by default (`max_bytes`)."""
MAX_EVENTS_BYTES = 32 * 1024 * 1024
"""The most bytes of event data one `/events` answer may be asked for."""
MAX_MATCHES = 1000

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such match"}
}
_BROKEN: dict[int | str, dict[str, Any]] = {
    500: {"model": ErrorBody, "description": "The match's log cannot be folded"},
    503: {"model": ErrorBody, "description": "The event log cannot be read"},
}
_SSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A stream of server-sent events",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}

MatchId = Annotated[str, PathParam(description="A match id, as `/api/matches` lists them.")]
TournamentId = Annotated[str, PathParam(description="A tournament id.")]
After = Annotated[
    int, Query(ge=0, le=MAX_SEQ, description="Only events with a larger seq (0: from the start).")
]


def resume_after(after: int, last_event_id: str | None) -> int:
    """Where a match stream starts: the `Last-Event-ID` a reconnecting browser sends (the
    seq it saw last) when it is a valid seq, else the `after` query value."""
    if last_event_id is not None and last_event_id.isascii() and last_event_id.isdigit():
        seq = int(last_event_id)
        if seq <= MAX_SEQ:
            return seq
    return after


def create_app(db_path: Path | str | None) -> FastAPI:
    """The scoreboard of the event log at `db_path`, opened read-only (a missing file is
    created empty first). Raises `StoreError` when the file is not a usable event log."""
    store: EventStore = open_read_only(db_path)
    cache = RecordCache(store)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            store.close()

    app = FastAPI(
        title="opsarena scoreboard",
        version=opsarena.__version__,
        description="Matches, records and live events from one opsarena event log.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.exception_handler(EventLogError)
    async def broken_log(_: Request, exc: EventLogError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=500)

    @app.exception_handler(StoreError)
    async def broken_store(_: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    async def require_match(match_id: str) -> None:
        # A tournament's own stream holds its seed until the end: it is no match here.
        if is_tournament_stream(match_id) or await store.summary(match_id) is None:
            raise HTTPException(404, f"no match {match_id!r} in this event log")

    @app.get("/", include_in_schema=False)
    async def index_page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    @app.get("/matches/{match_id}", include_in_schema=False)
    async def match_page(match_id: str) -> FileResponse:
        return FileResponse(STATIC_DIR / "match.html")

    @app.get("/api/matches", responses=_BROKEN)
    async def matches(
        limit: Annotated[int, Query(ge=1, le=MAX_MATCHES, description="Most rows.")] = 100,
    ) -> list[MatchListItem]:
        """The newest matches first: id, challenge, state, winner, duration, start."""
        return await list_items(cache, await store.list_matches(limit))

    @app.get("/api/matches/{match_id}", responses={**_NOT_FOUND, **_BROKEN})
    async def match_record(match_id: MatchId) -> MatchRecord:
        """The match record: the fold of every event so far (final once `match_state` is
        `finished`)."""
        await require_match(match_id)
        record = await cache.record(match_id)
        if record is None:
            raise HTTPException(404, f"no match {match_id!r} in this event log")
        return record

    @app.get("/api/matches/{match_id}/events", responses={**_NOT_FOUND, **_BROKEN})
    async def match_events(
        match_id: MatchId,
        response: Response,
        after: After = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_EVENTS, description="Most events.")] = 1000,
        max_bytes: Annotated[
            int,
            Query(
                ge=1,
                le=MAX_EVENTS_BYTES,
                description="Most bytes of event data (at least one event is returned).",
            ),
        ] = EVENTS_BYTES,
    ) -> list[EventEnvelope]:
        """The match's events with `seq > after`, in order, at most `limit` of them and
        `max_bytes` of their data (but at least one). When the page is not the log's end,
        `X-Next-After` (and `Link`, rel `next`) says the `after` of the next page."""
        await require_match(match_id)
        events = await store.read(match_id, after=after, limit=limit, max_bytes=max_bytes)
        if events:
            last = events[-1].seq
            summary = await store.summary(match_id)
            if summary is not None and summary.last_seq > last:
                response.headers["X-Next-After"] = str(last)
                response.headers["Link"] = (
                    f"</api/matches/{quote(match_id)}/events?after={last}&limit={limit}"
                    f'&max_bytes={max_bytes}>; rel="next"'
                )
        return [EventEnvelope(**event.to_json()) for event in events]

    @app.get(
        "/api/matches/{match_id}/stream",
        response_class=EventSourceResponse,
        responses={**_SSE, **_NOT_FOUND, **_BROKEN},
    )
    async def match_stream(
        match_id: MatchId,
        after: After = 0,
        last_event_id: Annotated[
            str | None, Header(description="Resume after this seq (sent by browsers).")
        ] = None,
    ) -> EventSourceResponse:
        """Server-sent events: `event` per event after `after`, `record` whenever caught
        up, `end` after `match_closed` (then the stream closes), `broken` when the log
        cannot be folded (then it closes)."""
        await require_match(match_id)
        start = resume_after(after, last_event_id)
        return EventSourceResponse(match_messages(store, match_id, start), ping=PING_S)

    @app.get("/api/stream", response_class=EventSourceResponse, responses={**_SSE, **_BROKEN})
    async def matches_stream(
        limit: Annotated[int, Query(ge=1, le=MAX_MATCHES, description="Most rows.")] = 100,
    ) -> EventSourceResponse:
        """Server-sent events: `matches` (the list rows) at once and on every change."""
        return EventSourceResponse(matches_messages(store, cache, limit), ping=PING_S)

    @app.get("/tournaments/{tournament_id}", include_in_schema=False)
    async def tournament_page(tournament_id: str) -> FileResponse:
        return FileResponse(STATIC_DIR / "tournament.html")

    @app.get("/api/tournaments/{tournament_id}", responses={**_NOT_FOUND, **_BROKEN})
    async def tournament(tournament_id: TournamentId) -> dict[str, Any]:
        """The tournament: its record (the seed only once finished), the leaderboard of
        its counted matches, the order check, and the matches running now."""
        view = await tournament_view(store, tournament_id)
        if view is None:
            raise HTTPException(404, f"no tournament {tournament_id!r} in this event log")
        return view

    @app.get(
        "/api/tournaments/{tournament_id}/stream",
        response_class=EventSourceResponse,
        responses={**_SSE, **_NOT_FOUND, **_BROKEN},
    )
    async def tournament_stream(tournament_id: TournamentId) -> EventSourceResponse:
        """Server-sent events: `tournament` (the same payload) at once and whenever the
        tournament or one of its running matches changes; `end` once it finished."""
        if await tournament_view(store, tournament_id) is None:
            raise HTTPException(404, f"no tournament {tournament_id!r} in this event log")
        return EventSourceResponse(tournament_messages(store, tournament_id), ping=PING_S)

    return app
