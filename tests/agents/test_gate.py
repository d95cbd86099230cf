"""The command agent's gate, without a program: its memory budget and what a request
may announce (the red-team flood is tests/security/test_agents_cage.py)."""

from __future__ import annotations

import asyncio

import pytest

from opsarena.agents.command import (
    EXEC_REPLY_ALLOWANCE,
    GATE_BUDGET,
    GATE_HEADER_LIMIT,
    PAYLOAD_LIMIT,
    _Budget,
    _payload_size,
)
from opsarena.agents.exec_shim import PAYLOAD_LIMIT as SHIM_PAYLOAD_LIMIT
from opsarena.hosts import DEFAULT_FILE_LIMIT


def test_the_largest_request_fits_the_budget_and_the_shim_agrees() -> None:
    assert GATE_HEADER_LIMIT + 2 * PAYLOAD_LIMIT + EXEC_REPLY_ALLOWANCE <= GATE_BUDGET
    assert PAYLOAD_LIMIT == SHIM_PAYLOAD_LIMIT == DEFAULT_FILE_LIMIT


async def test_the_budget_serves_in_order_and_never_overdraws() -> None:
    budget = _Budget(100)
    await budget.take(60)
    order: list[str] = []

    async def take(name: str, size: int) -> None:
        await budget.take(size)
        order.append(name)

    big = asyncio.create_task(take("big", 80))
    await asyncio.sleep(0)
    small = asyncio.create_task(take("small", 10))  # would fit now, but waits its turn
    await asyncio.sleep(0)
    assert order == [] and budget.free == 40
    budget.give(60)
    await asyncio.gather(big, small)
    assert order == ["big", "small"] and budget.free == 10 and budget.peak == 90
    with pytest.raises(ValueError):
        await budget.take(101)


async def test_a_cancelled_wait_takes_nothing() -> None:
    budget = _Budget(10)
    await budget.take(10)
    waiting = asyncio.create_task(budget.take(5))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    budget.give(10)
    assert budget.free == 10
    # Granted, then cancelled before it ran: the bytes come back.
    await budget.take(10)
    granted = asyncio.create_task(budget.take(5))
    await asyncio.sleep(0)
    budget.give(10)
    granted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await granted
    assert budget.free == 10


def test_what_a_request_may_announce() -> None:
    assert _payload_size({"op": "put", "path": "/x", "size": 5}) == 5
    assert _payload_size({"op": "exec", "command": "true", "stdin_size": None}) == 0
    assert _payload_size({"op": "exec", "command": "true", "stdin_size": 7}) == 7
    for bad in (
        {"op": "put", "path": "/x", "size": PAYLOAD_LIMIT + 1},
        {"op": "put", "path": "/x", "size": -1},
        {"op": "put", "path": "/x", "size": True},
        {"op": "put", "path": "/x", "size": 1.5},
        {"op": "exec", "command": "true", "timeout": float("nan")},
        {"op": "exec", "command": "true", "timeout": -1},
        {"op": "rm", "path": "/"},
    ):
        with pytest.raises((ValueError, TypeError)):
            _payload_size(bad)
    with pytest.raises(KeyError):
        _payload_size({"op": "put", "path": "/x"})
