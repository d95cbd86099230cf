"""The controller's agents: each runs in a task of its own from the match's start; what
it reports is logged within its log budget; `opsarena done` ends a person's turn; at
the finish the agents are drained, and a resumed match ends those that were running."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from opsarena.agents import AgentOutcome
from opsarena.agents.clip import clip, clip_all
from opsarena.agents.done import operator_key, proof_holds
from opsarena.agents.registry import has_done_token, remove_cages, runs_in_cage
from opsarena.match.core import Territory
from opsarena.match.events import (
    AgentEnded,
    AgentOutput,
    AgentStarted,
    AgentTranscript,
    AgentUsage,
    CompetitorDone,
    EventData,
)
from opsarena.match.judging import Judging
from opsarena.match.record import MatchRecord
from opsarena.store import encode_event_data

log = logging.getLogger(__name__)

MAX_OUTPUT_BYTES = 16 * 1024
"""Longest `agent_output` chunk kept as one event (bytes of UTF-8); longer text is
clipped (`agents.clip`)."""
ENTRY_FIELD_BYTES = 32 * 1024
"""Longest string kept in an `agent_transcript` entry (bytes of UTF-8; `agents.clip`):
the llm agent's fields (at most 32 Ki characters) mostly pass whole. The gate clips a
command agent's commands and paths tighter (`agents.clip.CLIP_BYTES`)."""


class AgentRuns(Judging):
    """Agents started, reported, declared done, drained and ended."""

    def _reporter(self, territory: Territory) -> Callable[[str, dict[str, Any]], Any]:
        agent_name = territory.competitor.name

        async def report(kind: str, data: dict[str, Any]) -> None:
            event: EventData
            if kind == "usage":
                event = AgentUsage(agent=agent_name, **data)
            elif kind == "output":
                text = clip(str(data.get("text", "")), MAX_OUTPUT_BYTES)
                stream = "stderr" if data.get("stream") == "stderr" else "stdout"
                event = AgentOutput(agent=agent_name, stream=stream, text=text)
            elif kind == "transcript":
                entry = clip_all(dict(data.get("entry", data)), ENTRY_FIELD_BYTES)
                event = AgentTranscript(agent=agent_name, entry=entry)
            else:
                log.warning("agent %s reported an unknown kind %r", agent_name, kind)
                return
            await self._budgeted(territory, event)

        return report

    async def _budgeted(self, territory: Territory, event: EventData) -> None:
        """Log an agent's `event` while its agent is within its log budget; past it,
        count the event and its bytes instead (once, a last transcript entry says so).
        Raises what the store raises (the gate then refuses the request it was for)."""
        data = event.model_dump(mode="json")
        size = len(encode_event_data(event.event_type, data).encode())
        budget = self.plan.log_budget_mb * 1024 * 1024
        if territory.log_bytes + size > budget:
            if not territory.log_events_dropped:
                log.warning(
                    "agent %s: its log budget (%d MiB) is spent: its events are counted, "
                    "not stored",
                    territory.competitor.name,
                    self.plan.log_budget_mb,
                )
                entry = {
                    "kind": "log_budget_spent",
                    "budget_bytes": budget,
                    "content": "the agent's log budget is spent: its further events are "
                    "counted (agent_ended), not stored",
                }
                await self.emit(AgentTranscript(agent=territory.competitor.name, entry=entry))
            territory.log_events_dropped += 1
            territory.log_bytes_dropped += size
            return
        territory.log_bytes += size
        await self._append(event.event_type, data)

    async def _run_agent(self, territory: Territory) -> None:
        name = territory.competitor.territory
        assert territory.ctx is not None
        assert territory.agent is not None
        # A stop that lands while agent_started is being logged must still end with
        # agent_ended after it (the log never closes on an agent left running): the
        # append runs to its end whatever happens to this task.
        started = asyncio.ensure_future(
            self.emit(AgentStarted(agent=territory.competitor.name, territory=name))
        )
        try:
            await asyncio.shield(started)
            outcome = await territory.agent.run(territory.ctx)
        except asyncio.CancelledError:
            await started
            outcome = territory.stop_outcome or AgentOutcome(
                "terminated", None, "stopped by the controller", "controller"
            )
        except Exception as exc:  # an agent's bug must not end the match
            log.exception("agent %s crashed", territory.competitor.name)
            outcome = AgentOutcome("failed", False, f"the agent crashed: {exc!r}"[:1000], "arena")
        territory.ended = True
        await self.emit(
            AgentEnded(
                agent=territory.competitor.name,
                terminal_state=outcome.terminal_state,
                successful=outcome.successful,
                terminal_detail=outcome.terminal_detail or None,
                failure_source=outcome.failure_source,
                log_events_dropped=territory.log_events_dropped,
                log_bytes_dropped=territory.log_bytes_dropped,
            )
        )
        if self._started_at is not None and not self._judging_over:
            # Judged in its own task: the drain waits for agents, never for the referee.
            self._settlers.append(asyncio.create_task(self._settle(name, territory)))

    async def _watch_done(self) -> None:
        """Answer `done_requested` events (`opsarena done`, another process): when the
        proof holds (the territory's done token, or the operator key) and the territory
        is a person's, log `competitor_done` and tell its agent. Any other request is
        refused, with a line in the arena's log and nothing in the match's."""
        operator = await asyncio.to_thread(operator_key, True)
        summary = await self.store.summary(self.match_id)
        after = summary.last_seq if summary else 0
        async for event in self.store.follow(self.match_id, after=after, poll_s=0.25):
            if event.type != "done_requested":
                continue
            if not event.link().hash_ok():  # a row that was not appended as it reads now
                log.warning("match %s seq %d fails its hash: ignored", self.match_id, event.seq)
                continue
            name = str(event.data.get("territory"))
            territory = self._territories.get(name)
            if territory is None or territory.ctx is None or territory.ctx.done.is_set():
                continue
            if not has_done_token(territory.competitor.kind):
                log.warning("refused opsarena done for %s: not a person's territory", name)
                continue
            kind, proof = event.data.get("proof_kind"), event.data.get("proof")
            secret = self.plan.done_token(name) if kind == "token" else operator
            if kind not in ("token", "operator") or secret is None:
                log.warning("refused opsarena done for %s: no such proof", name)
                continue
            if not proof_holds(proof, secret, self.match_id, name):
                log.warning("refused opsarena done for %s: the proof does not hold", name)
                continue
            by = str(event.data.get("by") or "a person")
            if kind == "operator":
                by = f"{by} (operator)"
            await self.emit(CompetitorDone(territory=name, by=by))
            territory.ctx.params["done_by"] = by
            territory.ctx.done.set()

    async def _drain(self, reason: str) -> None:
        running = [
            t for t in self._territories.values() if t.task is not None and not t.task.done()
        ]
        if not running:
            return
        tasks = [t.task for t in running if t.task is not None]
        if reason != "aborted":
            await asyncio.wait(tasks, timeout=self.plan.drain_s)
        detail = (
            f"match aborted ({self._abort_why})"
            if reason == "aborted"
            else "post-match drain deadline expired"
        )
        for territory in running:
            if territory.task is not None and not territory.task.done():
                territory.stop_outcome = AgentOutcome("terminated", None, detail, "controller")
                territory.task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _end_agents(self, record: MatchRecord, state: str, detail: str, source: str) -> None:
        """Log the end of every agent still running in `record`, after killing whatever
        the dead controller's agent programs left running (their cgroups outlive it)."""
        if any(runs_in_cage(agent.kind) for agent in record.agents.values()):
            await asyncio.to_thread(remove_cages, self.match_id)
        for agent_name, agent in record.agents.items():
            if agent.running:
                await self.emit(
                    AgentEnded(
                        agent=agent_name,
                        terminal_state=state,
                        successful=None,
                        terminal_detail=detail,
                        failure_source=source,
                    )
                )
