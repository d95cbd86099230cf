"""Red team, the referee's hold: a competitor queues more host operations than its burst
just before a fault attempt, hoping the queue drains into the referee's fault (116 of one
competitor's execs once started inside a referee's restart job).

On a real host, through the very handle a competitor is given (`ThrottledHost`). The
evidence is the order in which commands reached the host: each competitor exec appends a
line to a file on the host as its first act, and the referee (on the bare host, as it
does) appends its own marker once it holds the handle.
"""

from __future__ import annotations

import asyncio

import pytest

from opsarena.agents.throttle import ThrottledHost
from opsarena.hosts import ExecResult
from tests.conftest import SharedHosts

pytestmark = pytest.mark.hosts

LOG = "/tmp/starts"


async def test_operations_queued_before_a_hold_do_not_start_inside_it(
    shared_hosts: SharedHosts,
) -> None:
    host = await shared_hosts("holder")
    await host.exec(f"rm -f {LOG}", timeout=30)
    burst, total = 3, 14  # a queue four times longer than the burst
    throttled = ThrottledHost(host, limit=2, rate=20.0, burst=burst)
    finished = 0

    async def competitor(i: int) -> ExecResult:
        nonlocal finished
        result = await throttled.exec(f"echo start {i} >> {LOG}; sleep 0.2", timeout=60)
        finished += 1
        return result

    tasks = [asyncio.create_task(competitor(i)) for i in range(total)]
    try:
        async with asyncio.timeout(60):  # the queue is full: two running, the rest waiting
            while throttled.in_flight < 2:
                await asyncio.sleep(0.01)
        async with throttled.held():
            running_at_hold = throttled.in_flight
            await host.exec(f"echo hold >> {LOG}", timeout=30)
            # Until what was running has ended and everything else is either done or waits
            # for the hold (before the fix the queue drained inside the hold instead).
            async with asyncio.timeout(120):
                while throttled.in_flight or finished + throttled.held_back != total:
                    await asyncio.sleep(0.02)
            waiting = throttled.held_back
            inside = (await host.exec(f"cat {LOG}", timeout=30)).stdout.decode().split("\n")
        results = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    started_inside = [line for line in inside[inside.index("hold") + 1 :] if line]
    # Only what was already running when the hold was taken may have reached the host
    # after the referee's marker (its shell may write its line a little later).
    assert len(started_inside) <= running_at_hold <= 2, inside
    assert waiting >= total - burst - running_at_hold, (waiting, inside)
    # Once the hold is lifted, every queued operation runs, once.
    assert all(r.exit_code == 0 for r in results) and throttled.held_back == 0
    lines = (await host.exec(f"cat {LOG}", timeout=30)).stdout.decode().splitlines()
    assert sorted(lines) == sorted(["hold", *(f"start {i}" for i in range(total))])
