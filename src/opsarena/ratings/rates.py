"""Rates from repeated trials: the Wilson interval, pass@k and pass^k.

- Wilson score interval (Wilson 1927; Brown, Cai & DasGupta 2001): for `c` successes in
  `n` trials, p̂ = c/n and z the normal quantile,
  (p̂ + z²/2n ± z·√(p̂(1-p̂)/n + z²/4n²)) / (1 + z²/n).
- pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", the
  HumanEval paper): the chance that at least one of k trials drawn without replacement
  from the n run succeeds, unbiased: 1 - C(n-c, k) / C(n, k).
- pass^k (Yao et al. 2024, "τ-bench"): the chance that all k drawn trials succeed,
  unbiased: C(c, k) / C(n, k).
"""

from __future__ import annotations

import math

Z_95 = 1.959963984540054
"""The two-sided 95 % normal quantile."""


def _check(successes: int, trials: int) -> None:
    if trials < 0 or successes < 0 or successes > trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a success rate; (0, 1) when nothing was tried."""
    _check(successes, trials)
    if trials == 0:
        return (0.0, 1.0)
    n = float(trials)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # Rounding must never put an endpoint outside [0, 1] or on the wrong side of p.
    return (max(0.0, min(p, centre - margin)), min(1.0, max(p, centre + margin)))


def pass_at_k(trials: int, successes: int, k: int) -> float:
    """Unbiased pass@k: P(at least one of k trials succeeds). Needs 1 <= k <= trials."""
    _check(successes, trials)
    if not 1 <= k <= trials:
        raise ValueError(f"k must be between 1 and the {trials} trials, got {k}")
    return 1.0 - math.comb(trials - successes, k) / math.comb(trials, k)


def pass_hat_k(trials: int, successes: int, k: int) -> float:
    """Unbiased pass^k: P(all of k trials succeed). Needs 1 <= k <= trials."""
    _check(successes, trials)
    if not 1 <= k <= trials:
        raise ValueError(f"k must be between 1 and the {trials} trials, got {k}")
    return math.comb(successes, k) / math.comb(trials, k)
