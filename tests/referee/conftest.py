"""Fixtures for referee tests: the built-in challenge, a recording `emit`, a match clock."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from opsarena.challenges import Challenge, builtin_challenge
from opsarena.referee.referee import Referee


@dataclass
class EventLog:
    """Collects what the referee emits, in order, as (type, data)."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def emit(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append((kind, data))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [data for k, data in self.events if k == kind]


@pytest.fixture
def challenge() -> Challenge:
    return builtin_challenge("durable-records")


@pytest.fixture
def event_log() -> EventLog:
    return EventLog()


def make_referee(challenge: Challenge, log: EventLog, seed: bytes = b"calibration-seed") -> Referee:
    started = time.monotonic()
    return Referee(
        challenge,
        seed=seed,
        emit=log.emit,
        clock=lambda: int((time.monotonic() - started) * 1000),
    )
