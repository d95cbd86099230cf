"""The match event vocabulary: the envelope, one pydantic model per event's `data`, parsing.

These models are the contract between the controller, the referee, the agents and the fold.
Unknown keys in `data` are ignored (an older opsarena can read a newer producer's extra
fields); an unknown event type is an error (`EventLogError`), because the fold cannot know
what it would have changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    model_validator,
)

from opsarena.errors import EventLogError
from opsarena.ledger import LedgerCounts, LedgerUpdate, LedgerWrite
from opsarena.store import EventStore, StoredEvent

FinishReason = Literal[
    "first durable deployment", "time limit", "all competitors finished", "aborted"
]
AgentKind = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,31}$")]
"""An agent kind's registered name (`scripted`, `command`, `llm`, `human`, or any kind
registered later): the log does not restrict it, so new kinds need no change here."""
TerminalState = Literal["completed", "failed", "terminated", "interrupted"]
FailureSource = Literal["player", "arena", "controller"]
Verdict = Literal["passed", "failed", "referee_error"]


class EventData(BaseModel):
    """The base of every event's `data`; `event_type` is the envelope's `type`."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    event_type: ClassVar[str]


class MilestoneSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    id: str
    points: int = Field(ge=0)
    title: str = ""


class TerritorySpec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    agent: str
    model: str
    kind: AgentKind


class MatchCreated(EventData):
    event_type: ClassVar[str] = "match_created"
    match_id: str
    challenge: str
    challenge_title: str
    seed_commitment: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """SHA-256 commitment to the seed (`match.commitment`); the seed itself stays secret
    until `match_closed` reveals it."""
    seed: str | None = None
    """Only in logs written before commitments: the seed in the open from the start."""
    finish_mode: Literal["first-durable", "all"]
    time_limit_s: float
    drain_s: float
    milestones: list[MilestoneSpec] = Field(min_length=1)
    territories: dict[str, TerritorySpec] = Field(min_length=1)
    challenge_source: str = ""
    """What finds the challenge again (`find_challenge`): a built-in's name or the
    absolute path of its directory; empty in logs older than challenge directories."""
    disk_quota_mb: int | None = Field(default=None, ge=1)
    """Each host's byte quota (MiB): `opsarena resume` enforces the same. None in logs
    written before it was logged (resume then uses the default)."""
    disk_inode_quota: int | None = Field(default=None, ge=1)
    """Each host's inode quota, likewise."""

    @model_validator(mode="after")
    def _committed(self) -> MatchCreated:
        if self.seed_commitment is None and self.seed is None:
            raise ValueError("match_created needs a seed_commitment")
        return self


class HostProvisioning(EventData):
    event_type: ClassVar[str] = "host_provisioning"
    territory: str


class HostProvisioned(EventData):
    event_type: ClassVar[str] = "host_provisioned"
    territory: str
    host: str
    provision_ms: int


class HostFailed(EventData):
    event_type: ClassVar[str] = "host_failed"
    territory: str
    error: str


class Preflight(EventData):
    event_type: ClassVar[str] = "preflight"
    territory: str
    ok: bool
    detail: str | None = None


class MatchStarted(EventData):
    event_type: ClassVar[str] = "match_started"


class AgentStarted(EventData):
    event_type: ClassVar[str] = "agent_started"
    agent: str
    territory: str


class AttemptStarted(EventData):
    event_type: ClassVar[str] = "attempt_started"
    territory: str
    milestone: str
    attempt: int = Field(ge=1)


class AttemptResult(EventData):
    event_type: ClassVar[str] = "attempt_result"
    territory: str
    milestone: str
    attempt: int = Field(ge=1)
    verdict: Verdict
    points: int = Field(ge=0)
    evidence: dict[str, Any] | None = None
    failure_category: str | None = None
    failure_reason: str | None = None
    failure_detail: str | None = None
    duration_ms: int = 0


class MilestonePassed(EventData):
    event_type: ClassVar[str] = "milestone_passed"
    territory: str
    milestone: str
    points: int = Field(ge=0)
    evidence: dict[str, Any] | None = None
    attempt: int = Field(ge=1)


class FaultInjected(EventData):
    event_type: ClassVar[str] = "fault_injected"
    territory: str
    milestone: str
    attempt: int
    fault: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")]
    """A registered fault's name (`opsarena.referee.nemesis`): restart, reboot, ..."""
    ok: bool
    detail: str | None = None
    duration_ms: int = 0


class HostState(EventData):
    event_type: ClassVar[str] = "host_state"
    territory: str
    state: str


class AgentUsage(EventData):
    event_type: ClassVar[str] = "agent_usage"
    agent: str
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cached_tokens: int = Field(default=0, ge=0)
    cost_microusd: int | None = None


class AgentOutput(EventData):
    event_type: ClassVar[str] = "agent_output"
    agent: str
    stream: Literal["stdout", "stderr"]
    text: str


class AgentTranscript(EventData):
    event_type: ClassVar[str] = "agent_transcript"
    agent: str
    entry: dict[str, Any]


class AgentEnded(EventData):
    event_type: ClassVar[str] = "agent_ended"
    agent: str
    terminal_state: TerminalState
    successful: bool | None = None
    terminal_detail: str | None = None
    failure_source: FailureSource | None = None
    log_events_dropped: int = Field(default=0, ge=0)
    """The agent's events past its log budget (`MatchPlan.log_budget_mb`): counted, not
    stored."""
    log_bytes_dropped: int = Field(default=0, ge=0)
    """Their bytes (compact JSON of their `data`)."""


class CompetitorDone(EventData):
    event_type: ClassVar[str] = "competitor_done"
    territory: str
    by: str | None = None


class DoneRequested(EventData):
    """`opsarena done` asks for `territory` to be declared done. `proof` is an HMAC of
    the request keyed by the territory's done token (`proof_kind` "token") or by the
    operator key ("operator"); the controller logs `competitor_done` only when it holds.
    A request changes nothing in the record by itself."""

    event_type: ClassVar[str] = "done_requested"
    territory: str
    by: str | None = None
    proof: str
    proof_kind: Literal["token", "operator"]


class FinalVerification(EventData):
    event_type: ClassVar[str] = "final_verification"
    territory: str
    changed: bool


class LedgerUpdated(EventData):
    """What one attempt did to its territory's durability ledger (`opsarena.ledger`):
    the writes it acknowledged or left indeterminate, how its re-reads ended, and the ids
    dropped after failing. The fold and `opsarena resume` rebuild the ledger from these."""

    event_type: ClassVar[str] = "ledger_update"
    territory: str
    milestone: str
    attempt: int = Field(ge=1)
    writes: list[LedgerWrite] = Field(default_factory=list)
    checked: LedgerCounts = Field(default_factory=LedgerCounts)
    dropped: list[str] = Field(default_factory=list)
    settled: dict[str, str] = Field(default_factory=dict)

    def to_update(self) -> LedgerUpdate:
        return LedgerUpdate.model_validate(self.model_dump())


class JudgingStopped(EventData):
    """The referee stopped judging a territory: its agent had ended and its settle window
    expired (`window_expired`; `detail` says after which failure), or the referee itself
    failed judging it (`referee_error`: the arena's fault, counted with the
    infrastructure failures; `detail` says what failed). A durable territory needs no
    event: the fold stops its judging at its last pass."""

    event_type: ClassVar[str] = "judging_stopped"
    territory: str
    reason: Literal["window_expired", "referee_error"]
    detail: str = ""


class MatchFinished(EventData):
    event_type: ClassVar[str] = "match_finished"
    finish_reason: FinishReason
    winner: str | None = None


class MatchClosed(EventData):
    """The end of the log. Reveals the seed and the commitment's nonce (absent in logs
    written before commitments, whose `match_created` had the seed)."""

    event_type: ClassVar[str] = "match_closed"
    seed: str | None = None
    seed_nonce: str | None = None


class LogTampered(EventData):
    """The arena found its log tampered with. `quarantined`: rows it never appended sat
    at the head of its log (`first_seq` and up, `rows` of them) and were moved to the
    quarantine before it appended again. `altered`: at the close, `rows` events it had
    appended itself (the first at `first_seq`, all in `seqs`) no longer read as written."""

    event_type: ClassVar[str] = "log_tampered"
    first_seq: int = Field(ge=1)
    rows: int = Field(ge=0)
    detail: str
    kind: Literal["quarantined", "altered"] = "quarantined"
    seqs: list[int] = Field(default_factory=list)


class DiskQuotaExceeded(EventData):
    """A host's disk is read-only from now on: it wrote more bytes (`reason` "bytes") or
    made more inodes ("inodes") than its quotas, or its disk could not be measured
    ("unmeasured": the count failed or timed out, which the arena does not leave
    unbounded). `used_*` are the last measured figures; `detail` says which and why."""

    event_type: ClassVar[str] = "disk_quota_exceeded"
    territory: str
    used_bytes: int = Field(ge=0)
    quota_bytes: int = Field(ge=0)
    used_inodes: int | None = Field(default=None, ge=0)
    inode_quota: int | None = Field(default=None, ge=0)
    reason: Literal["bytes", "inodes", "unmeasured"] = "bytes"
    detail: str = ""


class MatchResumed(EventData):
    """`opsarena resume` took the match over after its controller died; an attempt that
    was in flight then has no result and never will."""

    event_type: ClassVar[str] = "match_resumed"


DATA_MODELS: dict[str, type[EventData]] = {
    model.event_type: model
    for model in (
        MatchCreated,
        HostProvisioning,
        HostProvisioned,
        HostFailed,
        Preflight,
        MatchStarted,
        AgentStarted,
        AttemptStarted,
        AttemptResult,
        MilestonePassed,
        FaultInjected,
        HostState,
        AgentUsage,
        AgentOutput,
        AgentTranscript,
        AgentEnded,
        CompetitorDone,
        DoneRequested,
        FinalVerification,
        LedgerUpdated,
        JudgingStopped,
        MatchFinished,
        MatchClosed,
        MatchResumed,
        DiskQuotaExceeded,
        LogTampered,
    )
}
"""Every event type the fold understands, by the envelope's `type`."""


class Event(BaseModel):
    """One event: the envelope with its typed `data`."""

    model_config = ConfigDict(frozen=True)

    match_id: str
    seq: int = Field(ge=1)
    type: str
    t_ms: int
    wall: str
    data: SerializeAsAny[EventData]

    def to_json(self) -> dict[str, Any]:
        """The envelope as plain JSON, `data` with every field of its model."""
        return self.model_dump(mode="json")


def parse_data(event_type: str, data: Mapping[str, Any], *, where: str = "") -> EventData:
    """Validate one event's `data` against the model of its type; `where` prefixes messages.

    Raises `EventLogError` for an unknown type or data that does not fit the model.
    """
    model = DATA_MODELS.get(event_type)
    prefix = where or event_type
    if model is None:
        raise EventLogError(
            f"{prefix}: unknown event type {event_type!r}: this log was written by a newer "
            "opsarena, upgrade to read it"
        )
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(part) for part in first["loc"]) or "data"
        raise EventLogError(f"{prefix}: invalid data at {location}: {first['msg']}") from None


def parse_event(raw: StoredEvent | Mapping[str, Any]) -> Event:
    """An `Event` from a stored event or an envelope dict; raises `EventLogError`."""
    if isinstance(raw, StoredEvent):
        envelope: Mapping[str, Any] = raw.to_json()
    else:
        envelope = raw
    try:
        match_id = str(envelope["match_id"])
        seq = int(envelope["seq"])
        event_type = str(envelope["type"])
        t_ms = int(envelope["t_ms"])
        wall = str(envelope["wall"])
        data = envelope.get("data") or {}
    except (KeyError, TypeError, ValueError) as exc:
        raise EventLogError(f"an event envelope is malformed ({exc!r})") from None
    if not isinstance(data, Mapping):
        raise EventLogError(f"match {match_id} seq {seq}: event data is not a JSON object")
    parsed = parse_data(event_type, data, where=f"match {match_id} seq {seq} ({event_type})")
    return Event(match_id=match_id, seq=seq, type=event_type, t_ms=t_ms, wall=wall, data=parsed)


async def append_event(store: EventStore, match_id: str, data: EventData, t_ms: int) -> int:
    """Append a typed event to the log; returns its sequence number."""
    return await store.append(match_id, data.event_type, data.model_dump(mode="json"), t_ms)
