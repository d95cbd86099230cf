"""The match's decisions, as pure functions: who wins, and when a match is over.

The controller acts on these; it never decides itself. Each is tested directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FinishMode = Literal["first-durable", "all"]


@dataclass(frozen=True)
class Standing:
    """Where one territory stands: its points, when it reached them (ms on the match
    clock, None with no points), whether it is durable, and whether it is settled (its
    agent ended and a final verification pass found nothing new)."""

    territory: str
    points: int
    reached_at_ms: int | None
    durable: bool
    settled: bool


def winner(standings: list[Standing]) -> str | None:
    """The durable territory that became durable first (by the time it reached its
    points, then by name, so the answer never depends on order). None when no territory is
    durable: points rank competitors, but only a durable deployment wins a match — a
    service that loses records, or answers every GET with the last body, never does."""
    durable = [s for s in standings if s.durable]
    if not durable:
        return None
    best = min(
        durable,
        key=lambda s: (
            s.reached_at_ms if s.reached_at_ms is not None else 2**62,
            s.territory,
        ),
    )
    return best.territory


def finish_reason(standings: list[Standing], *, mode: FinishMode, time_up: bool) -> str | None:
    """Why the match is over now, or None while it goes on.

    `first-durable` ends at the first durable territory; `all` only when every
    territory is durable or settled. Either ends when every territory is settled (or
    durable, which needs no more judging), or at the time limit.
    """
    if mode == "first-durable" and any(s.durable for s in standings):
        return "first durable deployment"
    if time_up:  # agents stop at the deadline too; the limit is the honest reason then
        return "time limit"
    if standings and all(s.durable or s.settled for s in standings):
        return "all competitors finished"
    return None


def match_winner(standings: list[Standing], reason: str, durable_order: list[str]) -> str | None:
    """The winner for `reason`: the first durable territory in the referee's order when
    there is one, otherwise the `winner` rule (None unless some territory is durable)."""
    if reason == "aborted":
        return None
    durable = {s.territory for s in standings if s.durable}
    for territory in durable_order:
        if territory in durable:
            return territory
    return winner(standings)
