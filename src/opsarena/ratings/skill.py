"""OpenSkill ratings over ranked matches: mu, sigma and the conservative ordinal mu - 3sigma.

Uses the Plackett-Luce model of the `openskill` package (Joshy 2024, "OpenSkill: A faster
asymmetric multi-team, multiplayer rating system", after Weng & Lin 2011, "A Bayesian
approximation method for online ranking"). Every competitor starts at mu = 25, sigma = 25/3;
each match updates the ratings of everyone in it from its ranking (ties stay ties).
The result depends a little on the order matches are fed in; `order_check` measures how
much.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from openskill.models import PlackettLuce, PlackettLuceRating

RankedMatch = Sequence[tuple[str, int]]
"""One match as ratings see it: (competitor, rank) pairs, rank 1 best, equal ranks tied."""


@dataclass(frozen=True)
class Skill:
    """One competitor's rating: the mean mu, the uncertainty sigma, and mu - 3sigma."""

    mu: float
    sigma: float

    @property
    def ordinal(self) -> float:
        return self.mu - 3 * self.sigma


@dataclass(frozen=True)
class OrderCheck:
    """How ratings from shuffled match orders compare with those in the given order.

    `worst_gap_sigma` is the largest |mu_shuffled - mu| over competitors and shuffles, in
    units of the larger of the two sigma; `agree` when it is at most 1.
    """

    shuffles: int
    worst_gap_sigma: float
    worst_competitor: str | None

    @property
    def agree(self) -> bool:
        return self.worst_gap_sigma <= 1.0


def rate_matches(matches: Sequence[RankedMatch]) -> dict[str, Skill]:
    """Every competitor's rating after `matches`, in the order given. A match of one
    competitor says nothing about skill and is skipped (the competitor still gets the
    initial rating). A competitor may appear at most once per match."""
    model = PlackettLuce()
    ratings: dict[str, PlackettLuceRating] = {}
    for match in matches:
        names = [name for name, _ in match]
        if len(set(names)) != len(names):
            raise ValueError(f"a competitor appears twice in one match: {names}")
        for name in names:
            if name not in ratings:
                ratings[name] = model.rating(name=name)
        if len(match) < 2:
            continue
        teams = [[ratings[name]] for name in names]
        updated = model.rate(teams, ranks=[float(rank) for _, rank in match])
        for name, team in zip(names, updated, strict=True):
            ratings[name] = team[0]
    return {name: Skill(r.mu, r.sigma) for name, r in ratings.items()}


def order_check(matches: Sequence[RankedMatch], *, shuffles: int = 10, seed: int = 0) -> OrderCheck:
    """Rate `matches` in `shuffles` random orders (from `seed`) and compare each with the
    ratings in the given order."""
    baseline = rate_matches(matches)
    rng = random.Random(seed)
    worst = 0.0
    worst_name: str | None = None
    order = list(matches)
    for _ in range(shuffles):
        rng.shuffle(order)
        shuffled = rate_matches(order)
        for name, skill in baseline.items():
            other = shuffled[name]
            gap = abs(other.mu - skill.mu) / max(skill.sigma, other.sigma)
            if gap > worst:
                worst, worst_name = gap, name
    return OrderCheck(shuffles, worst, worst_name)
