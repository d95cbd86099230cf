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
    """The territory with the most points; a tie goes to whoever reached that score
    first (then to the name, so the answer never depends on order). None when nobody
    scored."""
    scored = [s for s in standings if s.points > 0]
    if not scored:
        return None
    best = min(
        scored,
        key=lambda s: (
            -s.points,
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
    """The winner for `reason`: the first durable territory when a durable deployment
    ended the match, otherwise the `winner` rule."""
    if reason == "first durable deployment" and durable_order:
        return durable_order[0]
    if reason == "aborted":
        return None
    return winner(standings)
