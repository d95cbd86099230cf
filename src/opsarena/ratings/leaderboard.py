"""The leaderboard: every statistic of docs/TOURNAMENTS.md, from plain match outcomes.

The input is what the records of finished matches say about each territory (`Entry`);
the output is one `Row` per competitor, best first, each with its per-challenge
`ChallengeStats`. Order: the OpenSkill ordinal (mu - 3sigma), then the durable rate, then the
name, so the order never depends on the input's.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opsarena.ratings import bradley_terry
from opsarena.ratings.ranking import Placing, rank_match
from opsarena.ratings.rates import pass_at_k, pass_hat_k, wilson_interval
from opsarena.ratings.skill import OrderCheck, RankedMatch, order_check, rate_matches


@dataclass(frozen=True)
class Entry:
    """One territory of one finished match: the ranking facts and the agent's usage."""

    competitor: str
    durable_at_ms: int | None
    points: int
    last_passed_at_ms: int | None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_microusd: int = 0
    cost_known: bool = True

    def placing(self) -> Placing:
        return Placing(self.competitor, self.durable_at_ms, self.points, self.last_passed_at_ms)


@dataclass(frozen=True)
class MatchOutcome:
    """One finished match that counts: its id, challenge and territories."""

    match_id: str
    challenge: str
    entries: tuple[Entry, ...]

    def ranked(self) -> RankedMatch:
        ranks = rank_match([entry.placing() for entry in self.entries])
        return [(e.competitor, r) for e, r in zip(self.entries, ranks, strict=True)]


@dataclass(frozen=True)
class Usage:
    """Sums over a set of entries, and the per-durable figures derived from them."""

    matches: int
    durable: int
    points: int
    tokens: int
    cost_microusd: int
    cost_known: bool
    durable_ms: tuple[int, ...]

    @classmethod
    def of(cls, entries: Sequence[Entry]) -> Usage:
        durable_ms = tuple(sorted(e.durable_at_ms for e in entries if e.durable_at_ms is not None))
        return cls(
            matches=len(entries),
            durable=len(durable_ms),
            points=sum(e.points for e in entries),
            tokens=sum(e.input_tokens + e.output_tokens for e in entries),
            cost_microusd=sum(e.cost_microusd for e in entries),
            cost_known=all(e.cost_known for e in entries),
            durable_ms=durable_ms,
        )

    @property
    def durable_rate(self) -> float:
        return self.durable / self.matches if self.matches else 0.0

    @property
    def durable_rate_ci(self) -> tuple[float, float]:
        return wilson_interval(self.durable, self.matches)

    @property
    def mean_points(self) -> float:
        return self.points / self.matches if self.matches else 0.0

    @property
    def median_ms_to_durable(self) -> float | None:
        return statistics.median(self.durable_ms) if self.durable_ms else None

    @property
    def tokens_per_durable(self) -> float | None:
        return self.tokens / self.durable if self.durable else None

    @property
    def cost_per_durable_usd(self) -> float | None:
        """Total cost over every match (failed ones too) per durable result; None when no
        result was durable or any cost is unknown."""
        if not self.durable or not self.cost_known:
            return None
        return self.cost_microusd / 1e6 / self.durable

    def common_json(self) -> dict[str, Any]:
        low, high = self.durable_rate_ci
        return {
            "matches": self.matches,
            "durable": self.durable,
            "durable_rate": self.durable_rate,
            "durable_rate_ci": [low, high],
            "mean_points": self.mean_points,
            "median_ms_to_durable": self.median_ms_to_durable,
            "durable_ms": list(self.durable_ms),
            "tokens_per_durable": self.tokens_per_durable,
            "cost_per_durable_usd": self.cost_per_durable_usd,
            "cost_known": self.cost_known,
        }


@dataclass(frozen=True)
class ChallengeStats:
    """One competitor on one challenge: rates over its trials, pass@k and pass^k."""

    challenge: str
    usage: Usage

    def pass_at(self) -> dict[int, float]:
        n, c = self.usage.matches, self.usage.durable
        return {k: pass_at_k(n, c, k) for k in range(1, n + 1)}

    def pass_hat(self) -> dict[int, float]:
        n, c = self.usage.matches, self.usage.durable
        return {k: pass_hat_k(n, c, k) for k in range(1, n + 1)}

    def to_json(self) -> dict[str, Any]:
        return {
            "challenge": self.challenge,
            **self.usage.common_json(),
            "pass_at_k": {str(k): v for k, v in self.pass_at().items()},
            "pass_hat_k": {str(k): v for k, v in self.pass_hat().items()},
        }


@dataclass(frozen=True)
class Row:
    """One competitor on the leaderboard."""

    competitor: str
    usage: Usage
    mu: float
    sigma: float
    bt: bradley_terry.Strength
    challenges: tuple[ChallengeStats, ...] = field(default=())

    @property
    def ordinal(self) -> float:
        return self.mu - 3 * self.sigma

    def to_json(self) -> dict[str, Any]:
        return {
            "competitor": self.competitor,
            **self.usage.common_json(),
            "mu": self.mu,
            "sigma": self.sigma,
            "ordinal": self.ordinal,
            "bt": self.bt.score,
            "bt_ci": [self.bt.low, self.bt.high],
            "challenges": [c.to_json() for c in self.challenges],
        }


@dataclass(frozen=True)
class Leaderboard:
    """The rows, best first, and the order-independence check of their ratings."""

    rows: tuple[Row, ...]
    order: OrderCheck
    matches: int

    def to_json(self) -> list[dict[str, Any]]:
        return [row.to_json() for row in self.rows]


def leaderboard(
    outcomes: Sequence[MatchOutcome],
    *,
    challenge: str | None = None,
    bootstrap_samples: int = 200,
    shuffles: int = 10,
    seed: int = 0,
) -> Leaderboard:
    """The leaderboard of `outcomes` (only those of `challenge`, when given)."""
    chosen = [o for o in outcomes if challenge is None or o.challenge == challenge]
    ranked = [o.ranked() for o in chosen]
    skills = rate_matches(ranked)
    strengths = bradley_terry.bootstrap(ranked, samples=bootstrap_samples, seed=seed)
    check = order_check(ranked, shuffles=shuffles, seed=seed)
    by_competitor: dict[str, list[Entry]] = defaultdict(list)
    by_challenge: dict[tuple[str, str], list[Entry]] = defaultdict(list)
    for outcome in chosen:
        for entry in outcome.entries:
            by_competitor[entry.competitor].append(entry)
            by_challenge[(entry.competitor, outcome.challenge)].append(entry)
    rows = []
    for name, entries in by_competitor.items():
        skill = skills[name]
        per_challenge = tuple(
            ChallengeStats(ch, Usage.of(es))
            for (who, ch), es in sorted(by_challenge.items())
            if who == name
        )
        strength = strengths.get(name, bradley_terry.Strength(1000.0, 1000.0, 1000.0))
        rows.append(Row(name, Usage.of(entries), skill.mu, skill.sigma, strength, per_challenge))
    rows.sort(key=lambda r: (-r.ordinal, -r.usage.durable_rate, r.competitor))
    return Leaderboard(tuple(rows), check, len(chosen))
