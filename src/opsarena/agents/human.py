"""The `human` agent: a person works in the host by hand; the match waits for them.

The person opens a shell with `opsarena hosts shell MATCH/TERRITORY` and, when finished,
runs `opsarena done MATCH TERRITORY`; the controller then sets `ctx.done` (and may put
who declared it in `ctx.params["done_by"]`). The agent itself never touches the host.
"""

from __future__ import annotations

import asyncio
import time

from opsarena.agents.base import Agent, AgentContext, AgentOutcome


def human_instructions(match_id: str, territory: str) -> str:
    """What `opsarena run` prints for a human territory: the exact commands to use."""
    return (
        f"{territory}: work in your host with `opsarena hosts shell {match_id}/{territory}`; "
        f"when finished run `opsarena done {match_id} {territory}`"
    )


class HumanAgent(Agent):
    """Waits until `ctx.done` is set (completed, successful, "declared done by WHO") or
    `ctx.deadline` passes (terminated, "time ran out ...", failure_source "controller").
    Cancellation propagates at once."""

    def __init__(self, model: str = "human") -> None:
        self.model = model

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        try:
            async with asyncio.timeout(ctx.deadline - time.monotonic()):
                await ctx.done.wait()
        except TimeoutError:
            return AgentOutcome(
                "terminated",
                None,
                "time ran out before the person declared done",
                "controller",
            )
        who = str(ctx.params.get("done_by") or "a person")
        return AgentOutcome("completed", True, f"declared done by {who}")
