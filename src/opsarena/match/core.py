"""The controller's ground floor: what it holds of a match (the plan, the territories,
the match clock, the referee) and how it writes the match's event log.

`Controller` (`match.controller`) is built in layers, each a module with one job and
each a subclass of the one below: this base, `provisioning` (match_created, hosts,
preflight, releasing hosts), `judging` (standings, the finish rule, settle windows,
the disk watch), `agent_runs` (agents' tasks, their events and budget, `opsarena done`,
the drain), `closing` (judging until the finish, closing the log), `resume` (going on
after a killed controller). Everything it learns goes into the event log first; the
record is `fold_events` of that log, never state held here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from opsarena.agents import Agent, AgentContext, AgentOutcome
from opsarena.agents.competitors import Competitor
from opsarena.agents.throttle import ThrottledHost
from opsarena.errors import LogTamperedError
from opsarena.hosts import Host, HostDriver, get_driver
from opsarena.hosts.image import image_for
from opsarena.match.events import EventData, LogTampered, parse_data
from opsarena.match.fold import fold_events
from opsarena.match.plan import MatchPlan
from opsarena.match.record import MatchRecord
from opsarena.referee.feedback import feedback_message
from opsarena.referee.referee import Referee
from opsarena.store import EventStore, content_digest

log = logging.getLogger(__name__)

POLL_S = 0.1
"""How often the controller looks at the standings while the match runs."""


@dataclass
class Territory:
    """What the controller holds of one territory while the match runs."""

    competitor: Competitor
    agent: Agent | None
    host: Host | None = None
    handle: ThrottledHost | None = None
    """The competitor's own handle on `host` (what its agent acts through)."""
    ctx: AgentContext | None = None
    task: asyncio.Task[None] | None = None
    ended: bool = False
    settled: bool = False
    stop_outcome: AgentOutcome | None = None
    log_bytes: int = 0
    """Bytes of events this territory's agent has added to the log."""
    log_events_dropped: int = 0
    log_bytes_dropped: int = 0


class ControllerBase:
    """The state of one match's controller and its writing of the log (see the module)."""

    def _setup(self, plan: MatchPlan, store: EventStore) -> None:
        self.plan = plan
        self.store = store
        self.match_id = plan.match_id
        self.driver: HostDriver = get_driver(plan.driver)
        self._lock = asyncio.Lock()
        self._started_at: float | None = None
        self._clock_offset_ms = 0
        self._abort = asyncio.Event()
        self._abort_why = ""
        self._image = (
            image_for(plan.challenge.packages, plan.challenge.image)
            if plan.challenge.packages
            else plan.challenge.image
        )
        self._territories: dict[str, Territory] = {}
        self._closed = False
        self._finished = False
        self._judging_over = False
        self._settlers: list[asyncio.Task[None]] = []
        self._appended: dict[int, str] = {}
        self.referee = Referee(
            plan.challenge, seed=plan.seed, emit=self._referee_emit, clock=self.clock
        )

    # ---- the log -----------------------------------------------------------------

    def clock(self) -> int:
        """Milliseconds on the match clock (0 until the match starts)."""
        if self._started_at is None:
            return 0
        return self._clock_offset_ms + int((time.monotonic() - self._started_at) * 1000)

    async def _append(self, event_type: str, data: dict[str, Any]) -> None:
        async with self._lock:  # one at a time, so t_ms never goes back as seq goes up
            t_ms = self.clock()
            try:
                seq = await self.store.append(self.match_id, event_type, data, t_ms)
            except LogTamperedError as exc:
                # Rows the arena never appended sit where it writes: set them aside (kept
                # as evidence), say so in the log, and go on; a second refusal is raised.
                log.error("match %s: %s", self.match_id, exc)
                await self._quarantine(str(exc))
                t_ms = self.clock()
                seq = await self.store.append(self.match_id, event_type, data, t_ms)
            # What it wrote, remembered (32 bytes an event) to be checked at the close:
            # an edit that also redoes the chain is still found then.
            self._appended[seq] = content_digest(event_type, t_ms, data)

    async def _check_own_events(self) -> None:
        """Before the close: log `log_tampered` (`altered`) if any event this controller
        appended no longer reads as it wrote it."""
        if not self._appended:
            return
        audit = await self.store.audit(self.match_id)
        stored = {e.seq: e for e in audit.events if e.seq <= audit.last_seq}
        altered = sorted(
            seq
            for seq, digest in self._appended.items()
            if seq not in stored
            or content_digest(stored[seq].type, stored[seq].t_ms, stored[seq].data) != digest
        )
        if altered:
            shown = ", ".join(str(seq) for seq in altered[:20])
            why = f"events the arena appended were altered or removed: seq {shown}"
            log.error("match %s: %s", self.match_id, why)
            await self.emit(
                LogTampered(
                    kind="altered",
                    first_seq=altered[0],
                    rows=len(altered),
                    seqs=altered,
                    detail=why[:1000],
                )
            )

    async def _quarantine(self, why: str) -> None:
        """Move the log's forged tail aside and log `log_tampered` (inside the lock)."""
        moved = await self.store.quarantine_tail(self.match_id, why)
        if moved is None:
            return
        event = LogTampered(first_seq=moved.first_seq, rows=moved.rows, detail=why[:1000])
        await self.store.append(
            self.match_id, event.event_type, event.model_dump(mode="json"), self.clock()
        )

    async def emit(self, event: EventData) -> None:
        """Append one typed event to the log (durably)."""
        await self._append(event.event_type, event.model_dump(mode="json"))

    async def _referee_emit(self, event_type: str, data: dict[str, Any]) -> None:
        # The referee's events are typed like every other: validated against their model
        # (a bad one is a bug, raised here) and logged with every field of it.
        await self.emit(parse_data(event_type, data))
        if (
            event_type == "attempt_result"
            and data.get("verdict") == "failed"
            and self.plan.challenge.feedback
        ):
            territory = self._territories.get(str(data.get("territory")))
            if territory is not None and territory.ctx is not None and not territory.ended:
                territory.ctx.feedback.put_nowait(feedback_message(data))

    def request_abort(self, why: str) -> None:
        """End the match as `aborted` (Ctrl-C, SIGTERM); safe to call from a signal handler."""
        self._abort_why = why
        self._abort.set()

    @property
    def abort_reason(self) -> str:
        """Why the match was asked to abort (`SIGINT`, `SIGTERM`, ...); empty if it was not."""
        return self._abort_why

    async def record(self) -> MatchRecord:
        """The match's record as the log has it now."""
        return fold_events(await self.store.read(self.match_id))
