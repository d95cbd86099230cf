"""Fixtures for referee tests: the built-in challenge, a recording `emit`, a match clock."""

from __future__ import annotations

import pytest

from opsarena.challenges import Challenge, builtin_challenge
from opsarena.challenges.calibrate import EventLog
from opsarena.challenges.calibrate import make_referee as calibration_referee
from opsarena.referee import Referee

__all__ = ["EventLog", "make_referee"]


@pytest.fixture
def challenge() -> Challenge:
    return builtin_challenge("durable-records")


@pytest.fixture
def event_log() -> EventLog:
    return EventLog()


def make_referee(challenge: Challenge, log: EventLog, seed: bytes = b"calibration-seed") -> Referee:
    return calibration_referee(challenge, log, seed)
