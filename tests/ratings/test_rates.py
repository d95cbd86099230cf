"""Wilson intervals, pass@k and pass^k against known values and brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opsarena.ratings import pass_at_k, pass_hat_k, wilson_interval


def test_wilson_known_values() -> None:
    low, high = wilson_interval(5, 5)
    assert low == pytest.approx(0.5655, abs=1e-4)
    assert high == 1.0
    low, high = wilson_interval(0, 5)
    assert low == 0.0
    assert high == pytest.approx(0.4345, abs=1e-4)
    low, high = wilson_interval(5, 10)
    assert (low, high) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))


def test_wilson_with_no_trials_says_nothing() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)


@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_contains_the_observed_rate(case: tuple[int, int]) -> None:
    successes, trials = case
    low, high = wilson_interval(successes, trials)
    assert 0.0 <= low <= successes / trials <= high <= 1.0


def _brute(trials: int, successes: int, k: int, every: bool) -> float:
    outcomes = [True] * successes + [False] * (trials - successes)
    draws = list(itertools.combinations(outcomes, k))
    hits = sum(1 for draw in draws if (all(draw) if every else any(draw)))
    return hits / len(draws)


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_k_and_pass_hat_k_match_brute_force(case: tuple[int, int]) -> None:
    trials, successes = case
    for k in range(1, trials + 1):
        assert pass_at_k(trials, successes, k) == pytest.approx(_brute(trials, successes, k, False))
        assert pass_hat_k(trials, successes, k) == pytest.approx(_brute(trials, successes, k, True))


def test_pass_known_values() -> None:
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2)
    assert pass_at_k(5, 1, 5) == 1.0
    assert pass_hat_k(5, 4, 2) == pytest.approx(0.6)
    assert pass_hat_k(5, 4, 5) == 0.0


@pytest.mark.parametrize(
    ("trials", "successes", "k"), [(5, 6, 1), (5, 2, 0), (5, 2, 6), (-1, 0, 1)]
)
def test_impossible_arguments_are_refused(trials: int, successes: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(trials, successes, k)
    with pytest.raises(ValueError):
        pass_hat_k(trials, successes, k)
