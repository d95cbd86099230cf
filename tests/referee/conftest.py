"""Fixtures for referee tests: the built-in challenge, a recording `emit`, a match clock,
and a check that never answers (`test-hang`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from opsarena.challenges import Challenge, builtin_challenge
from opsarena.hosts import Host
from opsarena.referee.contract import CheckContext, Verdict, register_check
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


@register_check("test-hang")
async def hang(host: Host, ctx: CheckContext) -> Verdict:
    """A check that never answers: its attempt ends only by a timeout or a cancellation."""
    await asyncio.sleep(3600)
    return Verdict.passed({})


def one_milestone(challenge: Challenge, check: str) -> Challenge:
    """`challenge` with its first milestone only, judged by `check`."""
    first = challenge.milestones[0].model_copy(update={"check": check})
    return challenge.model_copy(update={"milestones": [first]})
