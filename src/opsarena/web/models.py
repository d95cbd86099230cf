"""The JSON shapes of the scoreboard API that are not the match record itself.

The record (`GET /api/matches/{id}`) is `opsarena.match.record.MatchRecord`, unchanged;
these models are the list rows, the event envelope and the error body, and they are what
the OpenAPI schema documents.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ErrorBody(BaseModel):
    """Every error answer: `detail` is one line saying what is wrong."""

    detail: str


class EventEnvelope(BaseModel):
    """One event exactly as the log holds it (the shape `opsarena events --json` prints)."""

    model_config = ConfigDict(extra="forbid")

    match_id: str
    seq: int
    type: str
    t_ms: int
    wall: str
    data: dict[str, Any]
    prev_hash: str = ""
    """The `hash` of the event before (64 zeros for the first): see docs/MATCHES.md."""
    hash: str = ""
    """SHA-256 of this event chained to `prev_hash` (`opsarena.store.chain`)."""


class MatchListItem(BaseModel):
    """One row of the matches list. `error` is set (and the record fields are null) when
    the match's log cannot be folded."""

    match_id: str
    created: str
    updated: str
    last_seq: int
    challenge: str | None = None
    challenge_title: str | None = None
    state: str | None = None
    winner: str | None = None
    finish_reason: str | None = None
    duration_ms: int | None = None
    started_at: str | None = None
    territories: int = 0
    error: str | None = None
