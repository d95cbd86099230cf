"""The match record: the pydantic models of what `fold_events` makes, serialised as JSON.

Key names and JSON types follow the seed record (`class`, `milestone_points`, ...) and every
key of the seed is present; the keys the seed lacks are documented in docs/MATCHES.md.
`MatchRecord.model_dump_json()` is the record file; it is deterministic for a given fold.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Record(BaseModel):
    model_config = ConfigDict(
        extra="forbid", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )


class MilestoneRecord(_Record):
    """One milestone of one territory. `points` is what was awarded (0 until passed)."""

    evaluating: bool = False
    passed: bool = False
    points: int = 0
    evidence: dict[str, Any] | None = None
    failure_category: str | None = None
    failure_detail: str | None = None
    # Beyond the seed:
    failure_reason: str | None = None
    attempts: int = 0
    passed_at_ms: int | None = None
    points_available: int = 0


class LedgerSummary(_Record):
    """Per territory: acknowledged and indeterminate writes, how re-reads ended, and how
    many records the ledger holds now."""

    acknowledged: int = 0
    indeterminate: int = 0
    verified: int = 0
    lost: int = 0
    corrupted: int = 0
    stale: int = 0
    unexpected: int = 0
    forgiven: int = 0
    """Lost or stale records the challenge allowed (backup-restore's recovery point)."""
    records: int = 0


class TerritoryRecord(_Record):
    """One territory: its host's lifecycle (`state`) and its competitor's standing."""

    class_: str = Field(default="builder", alias="class")
    agent: str
    state: str
    resources: int = 0
    last_health: str | None = None
    elimination_source: str | None = None
    elimination_detail: str | None = None
    competitor_state: str
    milestones: dict[str, MilestoneRecord]
    milestone_points: int = 0
    durable_at_ms: int | None = None
    # Beyond the seed:
    host: str | None = None
    failure_reason: str | None = None
    preflight_ok: bool | None = None
    done_by: str | None = None
    disk_frozen_at_ms: int | None = None
    """When the host went over its disk quota and its disk became read-only."""
    disk_frozen_detail: str | None = None
    """Why: which quota, by how much, or why its disk could not be measured."""
    ledger: LedgerSummary = Field(default_factory=LedgerSummary)
    """The durability ledger's totals (see docs/REFEREE.md)."""
    judging_stopped_at_ms: int | None = None
    judging_stopped_reason: str | None = None
    """`durable`, `window_expired` (the settle window after the agent ended) or
    `referee_error` (the referee failed judging the territory: the arena's fault)."""
    judging_stopped_detail: str | None = None


class AgentRecord(_Record):
    """One agent: whether it runs, how it ended, what it cost."""

    territory: str
    model: str
    running: bool = False
    successful: bool | None = None
    failure_source: str | None = None
    terminal_state: str | None = None
    terminal_detail: str | None = None
    resource_units_used: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_microusd: int = 0
    # Beyond the seed:
    kind: str
    cached_tokens: int = 0
    cost_known: bool = True
    started_at_ms: int | None = None
    ended_at_ms: int | None = None
    log_events_dropped: int = 0
    """Events of this agent past its log budget: counted, not stored."""
    log_bytes_dropped: int = 0
    """Their bytes."""


class MatchRecord(_Record):
    """The whole match. Only `fold_events` makes one; nothing else holds match state."""

    match_id: str
    challenge: str
    challenge_title: str
    challenge_source: str = ""
    milestone_titles: dict[str, str] = {}
    seed: str | None = None
    """The match seed (hex), null until `match_closed` reveals it (docs/MATCHES.md)."""
    seed_commitment: str | None = None
    """SHA-256 commitment to the seed, public from the start (`match.commitment`)."""
    seed_nonce: str | None = None
    """The commitment's nonce (hex), revealed with the seed."""
    finish_mode: str
    time_limit_s: float
    drain_s: float
    disk_quota_mb: int | None = None
    """Each host's disk quota in MiB (null in logs older than it)."""
    disk_inode_quota: int | None = None
    """Each host's inode quota (null in logs older than it)."""
    created_at: str
    started_at: str | None = None
    match_state: str
    territories: dict[str, TerritoryRecord]
    agents: dict[str, AgentRecord]
    winner: str | None = None
    finish_reason: str | None = None
    infrastructure_failures: int = 0
    last_sequence: int = 0
    elapsed_ms: int = 0
    finished_at_ms: int | None = None
    log_quarantined: list[str] = Field(default_factory=list)
    """Each forged tail the arena moved out of this match's log (`log_tampered`): where it
    began and how many rows; `opsarena verify` lists them row by row."""
    log_altered: list[int] = Field(default_factory=list)
    """Seqs of events the controller appended that, at the close, no longer read as it
    wrote them (edited or removed behind the store's back, even with the chain redone)."""
