"""The controller: runs one match from provisioning to the closed record.

It provisions every host in parallel, runs the referee's preflight, starts every
agent at the same instant (the match clock starts then), lets the referee judge,
finishes by the rules in `match.rules`, drains the agents and removes the hosts.
Everything it learns goes into the event log first; the record is `fold_events` of
that log, never state held here.

`Controller` is this module's; its parts are layers below it, one module each (see
`match.core`). It names no agent kind and no fault: it asks their registries for
capabilities (`agents.registry.has_done_token`, `runs_in_cage`;
`referee.nemesis.needs_power_cut_disk`).
"""

from __future__ import annotations

import asyncio
import time

from opsarena.agents import AgentContext
from opsarena.agents.throttle import ThrottledHost
from opsarena.errors import MatchError
from opsarena.match.events import MatchStarted
from opsarena.match.plan import (
    DEFAULT_INODE_QUOTA,
    DEFAULT_LOG_BUDGET_MB,
    MatchPlan,
    new_match_id,
    resumed_plan,
)
from opsarena.match.record import MatchRecord
from opsarena.match.resume import Resuming
from opsarena.referee.contract import agent_params, brief_for
from opsarena.store import EventStore

__all__ = [
    "DEFAULT_INODE_QUOTA",
    "DEFAULT_LOG_BUDGET_MB",
    "Controller",
    "MatchPlan",
    "new_match_id",
    "resumed_plan",
]


class Controller(Resuming):
    """Runs the match of `plan`, logging to `store`. Views follow the match by reading
    the log (`store.follow`), so they see other processes' events too."""

    def __init__(self, plan: MatchPlan, store: EventStore) -> None:
        if not plan.competitors:
            raise MatchError("a match needs at least one competitor")
        names = [c.territory for c in plan.competitors]
        if len(set(names)) != len(names):
            duplicate = next(n for n in names if names.count(n) > 1)
            raise MatchError(f"territory {duplicate!r} is given twice")
        self._setup(plan, store)

    async def run(self) -> MatchRecord:
        """Run the whole match and return its final record.

        Raises `MatchError` (after closing the log and removing the hosts) when hosts
        could not be provisioned or the preflight refused the match; `OpsArenaError`
        from an agent that cannot start (its configuration) before anything is made.
        """
        await self.prepare()

        async def whole_match() -> None:
            await self._create()
            failure = await self._provision_and_preflight()
            if failure is not None:
                await self._close("aborted", None)
                raise MatchError(failure)
            await self._play()

        await self._guarded(whole_match())
        return await self.record()

    async def _play(self) -> None:
        plan = self.plan
        await self.emit(MatchStarted())
        self._started_at = time.monotonic()
        deadline = self._started_at + plan.time_limit_s
        for name, territory in self._territories.items():
            assert territory.host is not None
            territory.ctx = AgentContext(
                match_id=self.match_id,
                territory=name,
                brief=brief_for(plan.challenge, plan.seed),
                host=territory.handle or ThrottledHost(territory.host),
                deadline=deadline,
                report=self._reporter(territory),
                params=agent_params(plan.challenge, plan.seed),
            )
        for territory in self._territories.values():
            territory.task = asyncio.create_task(
                self._run_agent(territory), name=f"agent-{territory.competitor.territory}"
            )
        await self._judge()
