"""The `human` agent, and who may end its wait: a person works in the host; the match waits.

The person opens a shell with `opsarena hosts shell MATCH/TERRITORY` and, when finished,
runs `opsarena done MATCH TERRITORY` with the territory's done token, which `opsarena
run` prints for that person only (`human_instructions`). The command logs a
`done_requested` event carrying a proof (an HMAC of the request keyed by the token,
never the token itself); the controller checks the proof and only then logs
`competitor_done`, sets `ctx.done` and puts who declared it in `ctx.params["done_by"]`.
The operator can do the same with `opsarena done --operator`, proving it can read the
arena-only operator key file (`operator_key_path`). The tokens and proofs are the
kind-neutral done protocol (`agents.done`); this kind declares that it has a done token
where it registers (`agents.registry`). The agent itself never touches the host.
"""

from __future__ import annotations

import asyncio
import time

from opsarena.agents.base import Agent, AgentContext, AgentOutcome
from opsarena.agents.done import (
    DONE_TOKEN_ENV,
    OPERATOR_KEY_ENV,
    done_proof,
    done_token,
    human_instructions,
    operator_key,
    operator_key_path,
    proof_holds,
)

__all__ = [  # the done protocol (`agents.done`) is also reachable here, where it began
    "DONE_TOKEN_ENV",
    "OPERATOR_KEY_ENV",
    "HumanAgent",
    "done_proof",
    "done_token",
    "human_instructions",
    "operator_key",
    "operator_key_path",
    "proof_holds",
]


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
