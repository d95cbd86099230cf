"""Ranking one match: who placed where, from what the referee established.

The rule (docs/TOURNAMENTS.md): durable territories first, earliest `durable_at_ms` first;
then the rest by milestone points, most first; then by when their last passed milestone
passed, earliest first. Territories equal on every key share a place: ties stay ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

NEVER = 2**62
"""Stands in for "no time": sorts after every real time on the match clock."""


@dataclass(frozen=True)
class Placing:
    """What ranking needs of one territory: its competitor and the referee's facts.

    `durable_at_ms` is None unless the territory became durable; `last_passed_at_ms` is
    when its last passed milestone passed (None with no milestone passed).
    """

    competitor: str
    durable_at_ms: int | None
    points: int
    last_passed_at_ms: int | None


def rank_key(placing: Placing) -> tuple[int, int, int]:
    """The sort key of the ranking rule: smaller is better; equal keys are a tie."""
    if placing.durable_at_ms is not None:
        return (0, placing.durable_at_ms, 0)
    last = placing.last_passed_at_ms if placing.last_passed_at_ms is not None else NEVER
    return (1, -placing.points, last)


def rank_match(placings: Sequence[Placing]) -> list[int]:
    """Each placing's rank (1 is best), in the order given. Ties share the better rank
    and the next rank skips ("1, 2, 2, 4"), as in sports standings."""
    keys = [rank_key(p) for p in placings]
    return [1 + sum(1 for other in keys if other < key) for key in keys]
