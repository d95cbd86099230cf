"""Bradley-Terry strengths from ranked matches, with bootstrap 95 % intervals.

A second opinion beside OpenSkill, as Chatbot Arena reports it (Chiang et al. 2024,
"Chatbot Arena: An Open Platform for Evaluating LLMs by Human Preference"). Each match
becomes pairwise results: for every two competitors in it, the better-ranked one wins,
a tie gives each half a win. The model P(i beats j) = pᵢ / (pᵢ + pⱼ) is fitted by the
minorisation-maximisation iteration of Hunter (2004, "MM algorithms for generalized
Bradley-Terry models"): pᵢ ← Wᵢ / Σⱼ nᵢⱼ / (pᵢ + pⱼ). A prior of `PRIOR_WINS` virtual
wins each way for every pair that met keeps an unbeaten competitor's strength finite.
Strengths are shown on the Elo scale, 1000 + 400·log₁₀ pᵢ with the geometric mean of p
at 1 (1000). The interval is the 2.5th and 97.5th percentile over bootstrap resamples of
whole matches (Efron 1979), drawn from a seeded generator so it is reproducible.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from opsarena.ratings.skill import RankedMatch

PRIOR_WINS = 0.5
MAX_ITERATIONS = 500
TOLERANCE = 1e-8


@dataclass(frozen=True)
class Strength:
    """One competitor's Bradley-Terry strength (Elo scale) and its bootstrap interval."""

    score: float
    low: float
    high: float


def pairwise_wins(matches: Sequence[RankedMatch]) -> dict[tuple[str, str], float]:
    """`wins[(a, b)]`: how often `a` beat `b` (ties count a half to each)."""
    wins: dict[tuple[str, str], float] = defaultdict(float)
    for match in matches:
        for i, (a, rank_a) in enumerate(match):
            for b, rank_b in match[i + 1 :]:
                if rank_a < rank_b:
                    wins[(a, b)] += 1.0
                elif rank_b < rank_a:
                    wins[(b, a)] += 1.0
                else:
                    wins[(a, b)] += 0.5
                    wins[(b, a)] += 0.5
    return dict(wins)


def fit(matches: Sequence[RankedMatch]) -> dict[str, float]:
    """Each competitor's Bradley-Terry strength on the Elo scale."""
    return fit_wins(pairwise_wins(matches))


def fit_wins(wins: dict[tuple[str, str], float]) -> dict[str, float]:
    """The fit from pairwise win counts (`pairwise_wins`)."""
    names = sorted({name for pair in wins for name in pair})
    if not names:
        return {}
    games: dict[tuple[str, str], float] = defaultdict(float)
    total_wins: dict[str, float] = defaultdict(float)
    for (a, b), count in wins.items():
        games[(a, b)] += count
        games[(b, a)] += count
        total_wins[a] += count
    met = {(a, b) for (a, b) in games}
    for a, b in met:
        games[(a, b)] += 2 * PRIOR_WINS
        total_wins[a] += PRIOR_WINS
    opponents: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for (a, b), n in games.items():
        opponents[a].append((b, n))
    p = dict.fromkeys(names, 1.0)
    for _ in range(MAX_ITERATIONS):
        new = {}
        for name in names:
            denominator = sum(n / (p[name] + p[other]) for other, n in opponents[name])
            new[name] = total_wins[name] / denominator if denominator else 1.0
        scale = math.exp(sum(math.log(v) for v in new.values()) / len(new))
        new = {name: v / scale for name, v in new.items()}
        change = max(abs(math.log(new[n] / p[n])) for n in names)
        p = new
        if change < TOLERANCE:
            break
    return {name: 1000.0 + 400.0 * math.log10(p[name]) for name in names}


def bootstrap(
    matches: Sequence[RankedMatch], *, samples: int = 200, seed: int = 0, level: float = 0.95
) -> dict[str, Strength]:
    """The fit on `matches`, with the percentile interval over `samples` resamples."""
    point = fit(matches)
    if not point:
        return {}
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {name: [] for name in point}
    # Each match's pairwise results once; a resample only adds them up.
    per_match = [list(pairwise_wins([match]).items()) for match in matches]
    for _ in range(samples):
        wins: dict[tuple[str, str], float] = defaultdict(float)
        for _ in matches:
            for pair, count in per_match[rng.randrange(len(matches))]:
                wins[pair] += count
        fitted = fit_wins(dict(wins))
        for name in point:
            # A competitor absent from a resample has no strength in it: not counted.
            if name in fitted:
                draws[name].append(fitted[name])
    tail = (1 - level) / 2
    result = {}
    for name, score in point.items():
        values = sorted(draws[name]) or [score]
        result[name] = Strength(score, _percentile(values, tail), _percentile(values, 1 - tail))
    return result


def _percentile(sorted_values: list[float], q: float) -> float:
    """The `q` quantile by linear interpolation between order statistics."""
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] * (1 - fraction) + sorted_values[high] * fraction
