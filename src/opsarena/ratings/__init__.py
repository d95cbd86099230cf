"""Ratings and statistics over match results: pure functions, nothing of ours imported.

- `ranking`: the place of each territory in one match (`rank_match`);
- `skill`: OpenSkill Plackett-Luce mu, sigma, ordinal and the order-independence check;
- `bradley_terry`: Bradley-Terry strengths with bootstrap intervals;
- `rates`: Wilson intervals, pass@k and pass^k;
- `leaderboard`: all of them per competitor (and per challenge), best first.

docs/TOURNAMENTS.md gives every formula and its source.
"""

from opsarena.ratings.bradley_terry import Strength
from opsarena.ratings.leaderboard import (
    ChallengeStats,
    Entry,
    Leaderboard,
    MatchOutcome,
    Row,
    Usage,
    leaderboard,
)
from opsarena.ratings.ranking import Placing, rank_key, rank_match
from opsarena.ratings.rates import pass_at_k, pass_hat_k, wilson_interval
from opsarena.ratings.skill import OrderCheck, RankedMatch, Skill, order_check, rate_matches

__all__ = [
    "ChallengeStats",
    "Entry",
    "Leaderboard",
    "MatchOutcome",
    "OrderCheck",
    "Placing",
    "RankedMatch",
    "Row",
    "Skill",
    "Strength",
    "Usage",
    "leaderboard",
    "order_check",
    "pass_at_k",
    "pass_hat_k",
    "rank_key",
    "rank_match",
    "rate_matches",
    "wilson_interval",
]
