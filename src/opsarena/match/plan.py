"""What a match is asked to be before it starts: `MatchPlan`, and the plan a resumed match
goes on with. Data only: the controller (`match.controller`) runs it."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime

from opsarena.agents.competitors import Competitor
from opsarena.agents.done import done_token
from opsarena.hosts.registry import DEFAULT_DRIVER
from opsarena.match.commitment import new_nonce
from opsarena.match.record import MatchRecord
from opsarena.match.rules import FinishMode
from opsarena.referee.model import Challenge

DEFAULT_LOG_BUDGET_MB = 64
"""Bytes (MiB) of events one agent may add to a match's log (`MatchPlan.log_budget_mb`):
its output, transcript and usage. Past it they are counted, not stored."""
DEFAULT_INODE_QUOTA = 100_000
"""Inodes a host may create on its disk before it freezes (`MatchPlan.disk_inode_quota`):
empty files cost the machine's inodes and almost no bytes. A fresh host has used a few
hundred; the image it is built on holds about 25 000 (not counted)."""


def new_match_id() -> str:
    """A readable, unique, host-name-safe match id: UTC time plus 4 random hex digits."""
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


@dataclass
class MatchPlan:
    """Everything a match needs before it starts.

    `time_limit_s` counts from the match clock's start; `drain_s` is how long agents get
    to stop after the finish before they are terminated.
    """

    challenge: Challenge
    competitors: list[Competitor]
    time_limit_s: float
    drain_s: float = 5.0
    seed: bytes = field(default_factory=lambda: secrets.token_bytes(16))
    """Secret until the match closes: only its commitment is logged at the start."""
    nonce: bytes = field(default_factory=new_nonce)
    """The seed commitment's nonce (`match.commitment`), revealed with the seed."""
    finish: FinishMode = "first-durable"
    keep_hosts: bool = False
    driver: str = DEFAULT_DRIVER
    match_id: str = field(default_factory=new_match_id)
    provision_timeout_s: float = 120.0
    disk_quota_mb: int = 2048
    """Past this much written to its disk, a host's disk becomes read-only."""
    disk_inode_quota: int = DEFAULT_INODE_QUOTA
    """Past this many inodes created on its disk, likewise."""
    log_budget_mb: int = DEFAULT_LOG_BUDGET_MB
    """Bytes (MiB) of events each agent may add to the log; past them its events are
    counted (`agent_ended`'s `log_events_dropped`, `log_bytes_dropped`), not stored."""
    done_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    """Derives each human territory's done token (`agents.human.done_token`); held only
    by this process, never logged."""

    def done_token(self, territory: str) -> str:
        """The token `opsarena done` must prove for `territory` (printed for its person)."""
        return done_token(self.done_key, self.match_id, territory)


def resumed_plan(
    record: MatchRecord, challenge: Challenge, seed: bytes, nonce: bytes, *, driver: str
) -> MatchPlan:
    """The plan a resumed match goes on with: its limits, finish rule and quotas as its
    `match_created` logged them (quotas missing from older logs: the defaults)."""
    plan = MatchPlan(
        challenge=challenge,
        competitors=[],
        time_limit_s=record.time_limit_s,
        drain_s=record.drain_s,
        seed=seed,
        nonce=nonce,
        finish=record.finish_mode,  # type: ignore[arg-type]
        driver=driver,
        match_id=record.match_id,
    )
    if record.disk_quota_mb is not None:
        plan.disk_quota_mb = record.disk_quota_mb
    if record.disk_inode_quota is not None:
        plan.disk_inode_quota = record.disk_inode_quota
    return plan
