"""The human agent waits for `opsarena done` (ctx.done) or the deadline; it never touches the
host, so it gets a real one that nobody uses."""

from __future__ import annotations

import asyncio
import time

import pytest
from tests.agents.records_service import agents_host

from opsarena.agents import AgentContext
from opsarena.agents.human import HumanAgent, human_instructions
from opsarena.hosts import Host

__all__ = ["agents_host"]  # fixture

pytestmark = pytest.mark.hosts


def make_ctx(host: Host, deadline_s: float) -> AgentContext:
    return AgentContext(
        match_id="m3",
        territory="builder-three",
        brief="b",
        host=host,
        deadline=time.monotonic() + deadline_s,
    )


async def test_done_declared_by_a_person_completes_the_agent(agents_host: Host) -> None:
    ctx = make_ctx(agents_host, 300)
    task = asyncio.create_task(HumanAgent().run(ctx))
    await asyncio.sleep(0)
    assert not task.done()
    ctx.params["done_by"] = "alice"
    ctx.done.set()
    outcome = await task
    assert (outcome.terminal_state, outcome.successful) == ("completed", True)
    assert outcome.terminal_detail == "declared done by alice"


async def test_the_deadline_ends_the_wait(agents_host: Host) -> None:
    outcome = await HumanAgent().run(make_ctx(agents_host, 0.2))
    assert (outcome.terminal_state, outcome.successful) == ("terminated", None)
    assert outcome.failure_source == "controller"
    assert outcome.terminal_detail == "time ran out before the person declared done"


async def test_cancellation_stops_the_wait(agents_host: Host) -> None:
    task = asyncio.create_task(HumanAgent().run(make_ctx(agents_host, 300)))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_instructions_give_the_exact_commands() -> None:
    assert human_instructions("m3", "builder-three") == (
        "builder-three: work in your host with `opsarena hosts shell m3/builder-three`; "
        "when finished run `opsarena done m3 builder-three`"
    )
