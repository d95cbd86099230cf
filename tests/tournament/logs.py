"""Tournament logs for tests: events made by hand (`created`, `started`, `ended`, `log`)
and a run's log read back from its database (`read_tournament`, `match_events`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from opsarena.errors import NoEventLogError
from opsarena.store import SqliteEventStore, StoredEvent
from opsarena.tournament import fold_tournament, seed_commitment, stream_id
from opsarena.tournament.record import TournamentRecord

SEED = "00112233445566778899aabbccddeeff"


def created() -> dict[str, Any]:
    return {
        "tournament_id": "tx",
        "name": "n",
        "source": "f.toml",
        "base_dir": "/tmp",
        "text": "",
        "seed": SEED,
        "seed_commitment": seed_commitment(bytes.fromhex(SEED)),
        "retries": 1,
        "competitors": {"a": "scripted:reference", "b": "scripted:idle"},
        "slots": [
            {"slot": 1, "challenge": "durable-records", "trial": 1, "group": ["a", "b"]},
            {"slot": 2, "challenge": "durable-records", "trial": 2, "group": ["a", "b"]},
        ],
    }


def log(*events: tuple[str, dict[str, Any]]) -> list[StoredEvent]:
    return [
        StoredEvent("tournament:tx", seq, kind, seq * 10, f"2026-01-01T00:00:{seq:02d}Z", data)
        for seq, (kind, data) in enumerate(events, 1)
    ]


def started(slot: int, attempt: int, match_id: str) -> tuple[str, dict[str, Any]]:
    return ("slot_match_started", {"slot": slot, "attempt": attempt, "match_id": match_id})


def ended(slot: int, attempt: int, match_id: str, counted: bool) -> tuple[str, dict[str, Any]]:
    return (
        "slot_match_ended",
        {"slot": slot, "attempt": attempt, "match_id": match_id, "counted": counted,
         "why": "" if counted else "the match was aborted"},
    )  # fmt: skip


def read_tournament(db: Path, tournament_id: str) -> TournamentRecord | None:
    try:
        store = SqliteEventStore(db, read_only=True)
    except NoEventLogError:  # not yet: the run is still creating its log
        return None
    with store:
        events = asyncio.run(store.read(stream_id(tournament_id)))
    return fold_tournament(events) if events else None


def match_events(db: Path, match_id: str) -> list[str]:
    with SqliteEventStore(db, read_only=True) as store:
        return [e.type for e in asyncio.run(store.read(match_id))]
