"""A cancellation that leaks out of a check is the referee's error, never an open attempt.

Under heavy load an inner timeout's race can raise CancelledError inside a check although
nobody cancelled the referee; the attempt must still get its `attempt_result` (as a
referee_error), or the next attempt would start on top of an open one and the log would
not fold. A real cancellation of the referee still cuts the attempt off.
"""

from __future__ import annotations

import asyncio

import pytest

from opsarena.challenges import Challenge
from opsarena.hosts import Host
from opsarena.referee.contract import CheckContext, Verdict, register_check
from tests.referee.conftest import EventLog, make_referee, one_milestone

CALLS: list[int] = []


@register_check("test-stray-cancel")
async def stray_cancel(host: Host, ctx: CheckContext) -> Verdict:
    CALLS.append(ctx.attempt)
    if ctx.attempt == 1:
        raise asyncio.CancelledError  # not a cancellation of this task
    return Verdict.passed({"health": "ready"})


async def test_a_stray_cancellation_ends_its_attempt_as_a_referee_error(
    challenge: Challenge,
) -> None:
    log = EventLog()
    referee = make_referee(one_milestone(challenge, "test-stray-cancel"), log)
    referee.add_territory("t", object())  # type: ignore[arg-type]
    first = await referee.evaluate_next("t")
    assert first is not None and first.outcome == "referee_error"
    second = await referee.evaluate_next("t")
    assert second is not None and second.outcome == "passed"
    kinds = [k for k, _ in log.events if k in ("attempt_started", "attempt_result")]
    assert kinds == ["attempt_started", "attempt_result"] * 2
    assert referee.infrastructure_failures == 1


async def test_a_real_cancellation_still_cuts_the_attempt_off(challenge: Challenge) -> None:
    log = EventLog()
    referee = make_referee(one_milestone(challenge, "test-hang"), log)
    referee.add_territory("t", object())  # type: ignore[arg-type]
    task = asyncio.create_task(referee.evaluate_next("t"))
    while not log.of("attempt_started"):  # the attempt is under way, in the hanging check
        assert not task.done(), task
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [k for k, _ in log.events] == ["attempt_started"]
