"""The fold: a match's events in, its `MatchRecord` out. The only way a record is made.

`fold_events` is pure and deterministic: the same events give the same record, byte for byte
(`model_dump_json`). `RecordFolder` is the same fold one event at a time, for live views that
should not refold the whole log on every event. An impossible log (a gap in the sequence, an
unknown territory, a transition a state machine forbids, a milestone passed out of order, an
event after `match_closed`, ...) raises `EventLogError` naming the event's seq.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opsarena.errors import EventLogError
from opsarena.ledger import Ledger
from opsarena.match import states
from opsarena.match.commitment import reveal_problem
from opsarena.match.events import (
    AgentEnded,
    AgentOutput,
    AgentStarted,
    AgentTranscript,
    AgentUsage,
    AttemptResult,
    AttemptStarted,
    CompetitorDone,
    DiskQuotaExceeded,
    DoneRequested,
    Event,
    FaultInjected,
    FinalVerification,
    HostFailed,
    HostProvisioned,
    HostProvisioning,
    HostState,
    JudgingStopped,
    LedgerUpdated,
    LogTampered,
    MatchClosed,
    MatchCreated,
    MatchFinished,
    MatchResumed,
    MatchStarted,
    MilestonePassed,
    Preflight,
    parse_event,
)
from opsarena.match.record import (
    AgentRecord,
    LedgerSummary,
    MatchRecord,
    MilestoneRecord,
    TerritoryRecord,
)
from opsarena.store import StoredEvent

HOST_STATES = frozenset({"ready", "rebooting", "lost", "removed", "kept"})
"""The `state` values a `host_state` event may carry."""

ENDED_BY = {
    "completed": "player",
    "failed": "player",
    "terminated": "controller",
    "interrupted": "arena",
}
"""Who ended an agent when `agent_ended` does not say: the seed's `failure_source` is always
set, `player` even for an agent that completed."""

NOT_STARTED = "not-started"
"""`terminal_state` of an agent the match closed without ever starting."""


def fold_events(events: Iterable[Event | StoredEvent]) -> MatchRecord:
    """The record of one match from all its events so far, in sequence order.

    Raises `EventLogError` when there are no events or the log is impossible.
    """
    folder = RecordFolder()
    for event in events:
        folder.apply(event)
    return folder.record()


class RecordFolder:
    """Folds one match's events one at a time; `record()` is the record so far."""

    def __init__(self) -> None:
        self._record: MatchRecord | None = None
        self._seq = 0
        self._evaluating: dict[tuple[str, str], int] = {}
        self._passed_attempt: dict[tuple[str, str], int] = {}
        self._ledgers: dict[str, Ledger] = {}
        self._last_attempt: dict[tuple[str, str], int] = {}

    def record(self) -> MatchRecord:
        """A copy of the record so far; raises `EventLogError` before the first event."""
        if self._record is None:
            raise EventLogError("a match's event log is empty: nothing to fold")
        return self._record.model_copy(deep=True)

    def apply(self, event: Event | StoredEvent) -> None:
        """Fold one event; raises `EventLogError` (naming the match and seq) if it is
        impossible after the events folded so far. After an error the folder is unusable."""
        parsed = event if isinstance(event, Event) else parse_event(event)
        try:
            self._apply(parsed)
        except EventLogError as exc:
            raise EventLogError(
                f"match {parsed.match_id} seq {parsed.seq} ({parsed.type}): {exc}"
            ) from None

    # -- one event --

    def _apply(self, event: Event) -> None:
        data = event.data
        if self._record is None:
            if not isinstance(data, MatchCreated) or event.seq != 1:
                raise EventLogError("the first event of a match must be match_created with seq 1")
            self._record = self._created(event, data)
            self._seq = 1
            return
        rec = self._record
        if event.match_id != rec.match_id:
            raise EventLogError(f"belongs to another match than {rec.match_id}")
        if event.seq != self._seq + 1:
            raise EventLogError(f"expected seq {self._seq + 1}: the log has a gap")
        self._seq = event.seq
        if isinstance(data, DoneRequested):
            # Written by `opsarena done` in another process, checked by the controller: a
            # request (true, false, late or early) never changes the record itself.
            if rec.match_state == "running":
                rec.last_sequence = event.seq
            return
        if isinstance(data, CompetitorDone) and rec.match_state != "running":
            # `opsarena done` runs in another process and can race the match's end (or come
            # before its start): too late or too early, it changes nothing, even after close.
            self._territory(data.territory)
            return
        if rec.match_state == "finished":
            raise EventLogError("the match is closed: its record is final")
        rec.last_sequence = event.seq
        if rec.finished_at_ms is None and rec.started_at is not None:
            rec.elapsed_ms = max(rec.elapsed_ms, event.t_ms)

        match data:
            case MatchCreated():
                raise EventLogError("a match is created once")
            case HostProvisioning(territory=name):
                self._host(name, "provisioning")
                if rec.match_state in ("created", "provisioning"):
                    rec.match_state = states.MATCH.step(rec.match_state, "provision")
            case HostProvisioned(territory=name, host=host):
                territory = self._host(name, "provisioned")
                territory.resources += 1
                territory.host = host
                rec.agents[territory.agent].resource_units_used += 1
            case HostFailed(territory=name, error=error):
                self._host(name, "failed")
                rec.infrastructure_failures += 1
                self._eliminate(name, "arena", f"host failed: {error}")
            case Preflight(territory=name, ok=ok):
                if rec.match_state not in ("created", "provisioning"):
                    raise EventLogError("a preflight comes before the match starts")
                self._territory(name).preflight_ok = ok
            case MatchStarted():
                rec.match_state = states.MATCH.step(rec.match_state, "start")
                rec.started_at = event.wall
                rec.elapsed_ms = max(0, event.t_ms)
                for territory in rec.territories.values():
                    if territory.competitor_state == "waiting":
                        territory.competitor_state = states.COMPETITOR.step("waiting", "start")
            case AgentStarted(agent=name, territory=territory_name):
                self._agent_started(event, name, territory_name)
            case AttemptStarted(territory=name, milestone=milestone, attempt=attempt):
                self._attempt_started(name, milestone, attempt)
            case AttemptResult():
                self._attempt_result(event, data)
            case MilestonePassed():
                self._milestone_passed(data)
            case FaultInjected(territory=name, milestone=milestone):
                self._milestone(name, milestone)
            case HostState(territory=name, state=state):
                if state not in HOST_STATES:
                    known = ", ".join(sorted(HOST_STATES))
                    raise EventLogError(f"unknown host state {state!r} (known: {known})")
                self._host(name, state)
                if state == "lost":
                    # The arena's failure, not the competitor's: counted, never eliminating,
                    # since the host may come back (a slow reboot) and the competitor score.
                    rec.infrastructure_failures += 1
            case AgentUsage():
                agent = self._agent(data.agent)
                agent.input_tokens += data.input_tokens
                agent.output_tokens += data.output_tokens
                agent.cached_tokens += data.cached_tokens
                if data.cost_microusd is None:
                    agent.cost_known = False
                else:
                    agent.cost_microusd += data.cost_microusd
            case AgentOutput(agent=name) | AgentTranscript(agent=name):
                self._agent(name)
            case AgentEnded():
                self._agent_ended(event, data)
            case CompetitorDone(territory=name, by=by):
                territory = self._territory(name)
                territory.done_by = by or "unknown"
                self._compete(territory, "stopped")
            case FinalVerification(territory=name, changed=changed):
                territory = self._territory(name)
                self._compete(territory, "changed" if changed else "unchanged")
            case LedgerUpdated(territory=name):
                territory = self._territory(name)
                self._milestone(name, data.milestone)
                ledger = self._ledgers.setdefault(name, Ledger())
                ledger.apply(data.to_update())
                territory.ledger = LedgerSummary.model_validate(ledger.summary.model_dump())
            case JudgingStopped(territory=name, reason=reason, detail=detail):
                territory = self._territory(name)
                territory.judging_stopped_at_ms = event.t_ms
                territory.judging_stopped_reason = reason
                territory.judging_stopped_detail = detail or None
                if reason == "referee_error":
                    rec.infrastructure_failures += 1  # the arena's failure, not the player's
                if territory.competitor_state in ("verifying", "settled"):
                    self._compete(territory, "unchanged")  # nothing more is judged
            case MatchFinished():
                self._finished(event, data)
            case MatchClosed():
                self._reveal(data)
                self._closed()
            case LogTampered(kind="altered", seqs=seqs):
                rec.log_altered.extend(seqs)
            case LogTampered(first_seq=first_seq, rows=rows):
                rec.log_quarantined.append(f"seq {first_seq}: {rows} rows")
            case DiskQuotaExceeded(territory=name):
                territory = self._territory(name)
                if territory.disk_frozen_at_ms is None:
                    territory.disk_frozen_at_ms = event.t_ms
                    territory.disk_frozen_detail = data.detail or (
                        f"{data.used_bytes} bytes written, over the quota of {data.quota_bytes}"
                    )
            case MatchResumed():
                # Attempts in flight when the controller died were abandoned with it.
                self._evaluating.clear()
                for resumed in rec.territories.values():
                    for abandoned in resumed.milestones.values():
                        abandoned.evaluating = False
            case _:
                raise EventLogError(f"the fold does not handle {event.type}")

    def _reveal(self, data: MatchClosed) -> None:
        """The seed revealed at the close must open the commitment made at the start."""
        rec = self._rec()
        if data.seed is None:
            if rec.seed_commitment is not None:
                raise EventLogError("match_closed does not reveal the committed seed")
            return
        if rec.seed_commitment is None:
            raise EventLogError("match_closed reveals a seed that was never committed to")
        problem = reveal_problem(
            rec.match_id, rec.seed_commitment, data.seed, data.seed_nonce or ""
        )
        if problem is not None:
            raise EventLogError(f"match_closed: {problem}")
        rec.seed = data.seed
        rec.seed_nonce = data.seed_nonce

    # -- lookups --

    def _rec(self) -> MatchRecord:
        assert self._record is not None
        return self._record

    def _territory(self, name: str) -> TerritoryRecord:
        territory = self._rec().territories.get(name)
        if territory is None:
            raise EventLogError(f"unknown territory {name!r}")
        return territory

    def _milestone(self, territory: str, milestone: str) -> MilestoneRecord:
        record = self._territory(territory).milestones.get(milestone)
        if record is None:
            raise EventLogError(f"territory {territory!r} has no milestone {milestone!r}")
        return record

    def _agent(self, name: str) -> AgentRecord:
        agent = self._rec().agents.get(name)
        if agent is None:
            raise EventLogError(f"unknown agent {name!r}")
        return agent

    # -- transitions --

    def _host(self, name: str, given: str) -> TerritoryRecord:
        territory = self._territory(name)
        territory.state = states.TERRITORY.step(territory.state, given)
        return territory

    def _compete(self, territory: TerritoryRecord, given: str) -> None:
        territory.competitor_state = states.COMPETITOR.step(territory.competitor_state, given)

    def _eliminate(self, name: str, source: str, detail: str) -> None:
        territory = self._territory(name)
        self._compete(territory, "eliminate")
        if territory.competitor_state == "eliminated" and territory.elimination_source is None:
            territory.elimination_source = source
            territory.elimination_detail = detail

    def _require_running(self, what: str) -> None:
        state = self._rec().match_state
        if state != "running":
            raise EventLogError(f"{what} only happens while the match runs (it is {state})")

    # -- handlers --

    def _created(self, event: Event, data: MatchCreated) -> MatchRecord:
        if data.match_id != event.match_id:
            raise EventLogError(f"match_created names match {data.match_id!r}")
        milestones = {spec.id: spec.points for spec in data.milestones}
        if len(milestones) != len(data.milestones):
            raise EventLogError("match_created lists a milestone twice")
        territories: dict[str, TerritoryRecord] = {}
        agents: dict[str, AgentRecord] = {}
        for name, spec in data.territories.items():
            if spec.agent in agents:
                raise EventLogError(f"agent {spec.agent!r} is in two territories")
            territories[name] = TerritoryRecord(
                agent=spec.agent,
                state=states.TERRITORY.initial,
                competitor_state=states.COMPETITOR.initial,
                milestones={
                    mid: MilestoneRecord(points_available=points)
                    for mid, points in milestones.items()
                },
            )
            agents[spec.agent] = AgentRecord(territory=name, model=spec.model, kind=spec.kind)
        return MatchRecord(
            match_id=data.match_id,
            challenge=data.challenge,
            challenge_title=data.challenge_title,
            challenge_source=data.challenge_source,
            milestone_titles={spec.id: spec.title for spec in data.milestones if spec.title},
            seed=data.seed,
            seed_commitment=data.seed_commitment,
            finish_mode=data.finish_mode,
            time_limit_s=data.time_limit_s,
            drain_s=data.drain_s,
            disk_quota_mb=data.disk_quota_mb,
            disk_inode_quota=data.disk_inode_quota,
            created_at=event.wall,
            match_state=states.MATCH.initial,
            territories=territories,
            agents=agents,
            last_sequence=event.seq,
        )

    def _agent_started(self, event: Event, name: str, territory_name: str) -> None:
        self._require_running("agent_started")
        agent = self._agent(name)
        if agent.territory != territory_name:
            raise EventLogError(f"agent {name!r} plays {agent.territory!r}, not {territory_name!r}")
        if agent.started_at_ms is not None:
            raise EventLogError(f"agent {name!r} started twice")
        agent.running = True
        agent.started_at_ms = event.t_ms

    def _attempt_started(self, name: str, milestone: str, attempt: int) -> None:
        self._require_running("attempt_started")
        record = self._milestone(name, milestone)
        key = (name, milestone)
        if record.passed:
            raise EventLogError(f"{name}/{milestone} is already passed")
        if key in self._evaluating:
            raise EventLogError(f"{name}/{milestone} attempt {self._evaluating[key]} is running")
        if attempt <= self._last_attempt.get(key, 0):
            raise EventLogError(f"{name}/{milestone} attempt {attempt} is not a new attempt")
        self._last_attempt[key] = attempt
        self._evaluating[key] = attempt
        record.evaluating = True
        record.attempts += 1

    def _attempt_result(self, event: Event, data: AttemptResult) -> None:
        self._require_running("attempt_result")
        rec = self._rec()
        key = (data.territory, data.milestone)
        record = self._milestone(data.territory, data.milestone)
        if self._evaluating.get(key) != data.attempt:
            raise EventLogError(
                f"{data.territory}/{data.milestone} attempt {data.attempt} was not started"
            )
        del self._evaluating[key]
        record.evaluating = False
        territory = self._territory(data.territory)
        if data.verdict == "passed":
            # The passed attempt is the pass; `milestone_passed` confirms it. A referee
            # cancelled between the two (the match ending) loses nothing.
            self._pass(territory, data.milestone, data.points, data.evidence, event.t_ms)
            self._passed_attempt[key] = data.attempt
            territory.last_health = "ready"
            return
        if data.points:
            raise EventLogError(f"a {data.verdict} attempt awards no points")
        category = data.failure_category or (
            "referee_error" if data.verdict == "referee_error" else "verification_failed"
        )
        record.failure_category = category
        record.failure_reason = data.failure_reason
        record.failure_detail = data.failure_detail
        territory.failure_reason = data.failure_reason or category
        if data.verdict == "referee_error":
            rec.infrastructure_failures += 1
        else:
            territory.last_health = data.failure_reason or "failed"

    def _pass(
        self,
        territory: TerritoryRecord,
        milestone: str,
        points: int,
        evidence: dict[str, Any] | None,
        t_ms: int,
    ) -> None:
        for mid, earlier in territory.milestones.items():
            if mid == milestone:
                break
            if not earlier.passed:
                raise EventLogError(f"{milestone} passed before {mid}: milestones go in order")
        record = territory.milestones[milestone]
        record.passed = True
        record.points = points
        record.evidence = evidence
        record.failure_category = record.failure_reason = record.failure_detail = None
        record.passed_at_ms = t_ms
        territory.milestone_points += points
        if all(m.passed for m in territory.milestones.values()):
            territory.durable_at_ms = t_ms
            if territory.judging_stopped_reason is None:
                # Every milestone passed: nothing is left to judge.
                territory.judging_stopped_at_ms = t_ms
                territory.judging_stopped_reason = "durable"
            self._compete(territory, "durable")

    def _milestone_passed(self, data: MilestonePassed) -> None:
        key = (data.territory, data.milestone)
        record = self._milestone(data.territory, data.milestone)
        if self._passed_attempt.pop(key, None) != data.attempt:
            raise EventLogError(
                f"{data.territory}/{data.milestone} attempt {data.attempt} did not pass"
            )
        if data.points != record.points:
            raise EventLogError(
                f"{data.territory}/{data.milestone} passed with {record.points} points, "
                f"not {data.points}"
            )

    def _agent_ended(self, event: Event, data: AgentEnded) -> None:
        agent = self._agent(data.agent)
        if not agent.running:
            raise EventLogError(f"agent {data.agent!r} is not running")
        if data.terminal_state == "terminated" and not data.terminal_detail:
            raise EventLogError(f"agent {data.agent!r} terminated without saying why")
        agent.running = False
        agent.terminal_state = data.terminal_state
        agent.terminal_detail = (
            data.terminal_detail or f"the agent ended ({data.terminal_state}) without a detail"
        )
        agent.successful = data.successful
        agent.failure_source = data.failure_source or ENDED_BY[data.terminal_state]
        agent.ended_at_ms = event.t_ms
        agent.log_events_dropped = data.log_events_dropped
        agent.log_bytes_dropped = data.log_bytes_dropped
        self._compete(self._territory(agent.territory), "stopped")

    def _finished(self, event: Event, data: MatchFinished) -> None:
        rec = self._rec()
        rec.match_state = states.MATCH.step(rec.match_state, "finish")
        if data.winner is not None:
            winner = self._territory(data.winner)
            if data.finish_reason == "first durable deployment" and winner.durable_at_ms is None:
                raise EventLogError(f"winner {data.winner!r} is not durable")
            if winner.milestone_points == 0:
                raise EventLogError(f"winner {data.winner!r} scored no points")
        rec.finish_reason = data.finish_reason
        rec.winner = data.winner
        rec.finished_at_ms = event.t_ms
        rec.elapsed_ms = max(0, event.t_ms) if rec.started_at is not None else 0
        # An attempt still in flight was cancelled with the referee: it has no result.
        self._evaluating.clear()
        for territory in rec.territories.values():
            for milestone in territory.milestones.values():
                milestone.evaluating = False
            self._compete(territory, "scored" if territory.milestone_points else "unscored")

    def _closed(self) -> None:
        rec = self._rec()
        rec.match_state = states.MATCH.step(rec.match_state, "close")
        for name, territory in rec.territories.items():
            try:
                territory.state = states.TERRITORY.step(territory.state, "close")
            except EventLogError:
                raise EventLogError(
                    f"territory {name!r} host is still {territory.state!r}: "
                    "the controller must remove or keep every host before closing"
                ) from None
            if territory.competitor_state not in states.COMPETITOR.final:
                raise EventLogError(f"territory {name!r} is still {territory.competitor_state!r}")
        for name, agent in rec.agents.items():
            if agent.running:
                raise EventLogError(f"agent {name!r} is still running: end every agent first")
            if agent.terminal_state is None:
                territory = rec.territories[agent.territory]
                agent.terminal_state = NOT_STARTED
                if territory.elimination_detail is not None:
                    agent.terminal_detail = f"never started: {territory.elimination_detail}"
                    agent.failure_source = territory.elimination_source
                else:
                    agent.terminal_detail = (
                        f"the match ended ({rec.finish_reason}) before it started"
                    )
                    agent.failure_source = "controller"
