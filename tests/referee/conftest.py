"""Fixtures for referee tests: the built-in challenge, a recording `emit`, a match clock,
and a check that never answers (`test-hang`)."""

from __future__ import annotations

import asyncio

import pytest

from opsarena.challenges import Challenge, builtin_challenge
from opsarena.challenges.calibrate import EventLog
from opsarena.challenges.calibrate import make_referee as calibration_referee
from opsarena.hosts import Host
from opsarena.referee.contract import CheckContext, Verdict, register_check
from opsarena.referee.referee import Referee

__all__ = ["EventLog", "make_referee"]


@pytest.fixture
def challenge() -> Challenge:
    return builtin_challenge("durable-records")


@pytest.fixture
def event_log() -> EventLog:
    return EventLog()


def make_referee(challenge: Challenge, log: EventLog, seed: bytes = b"calibration-seed") -> Referee:
    return calibration_referee(challenge, log, seed)


@register_check("test-hang")
async def hang(host: Host, ctx: CheckContext) -> Verdict:
    """A check that never answers: its attempt ends only by a timeout or a cancellation."""
    await asyncio.sleep(3600)
    return Verdict.passed({})


def one_milestone(challenge: Challenge, check: str) -> Challenge:
    """`challenge` with its first milestone only, judged by `check`."""
    first = challenge.milestones[0].model_copy(update={"check": check})
    return challenge.model_copy(update={"milestones": [first]})
