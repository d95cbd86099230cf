"""OpenSkill ratings, Bradley-Terry fits, and recovering known strengths from simulation."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsarena.ratings import order_check, rate_matches
from opsarena.ratings.bradley_terry import bootstrap, fit, pairwise_wins
from opsarena.ratings.skill import RankedMatch


def test_the_winner_rises_and_a_tie_moves_both_alike() -> None:
    ratings = rate_matches([[("a", 1), ("b", 2), ("c", 2)]])
    assert ratings["a"].mu > 25 > ratings["b"].mu
    assert ratings["b"] == ratings["c"]
    assert ratings["a"].sigma < 25 / 3
    assert ratings["a"].ordinal == pytest.approx(ratings["a"].mu - 3 * ratings["a"].sigma)


def test_a_match_of_one_says_nothing() -> None:
    ratings = rate_matches([[("solo", 1)]])
    assert ratings["solo"].mu == pytest.approx(25.0)
    assert ratings["solo"].sigma == pytest.approx(25 / 3)


def test_a_competitor_twice_in_one_match_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        rate_matches([[("a", 1), ("a", 2)]])


def test_pairwise_wins_count_ties_half() -> None:
    wins = pairwise_wins([[("a", 1), ("b", 2), ("c", 2)]])
    assert wins == {("a", "b"): 1.0, ("a", "c"): 1.0, ("b", "c"): 0.5, ("c", "b"): 0.5}


def test_bradley_terry_even_results_give_even_strengths() -> None:
    matches: list[RankedMatch] = [[("a", 1), ("b", 2)], [("b", 1), ("a", 2)]] * 3
    strengths = fit(matches)
    assert strengths["a"] == pytest.approx(1000.0)
    assert strengths["b"] == pytest.approx(1000.0)


def test_bradley_terry_matches_the_closed_form_of_two_players() -> None:
    # a beats b 3 times of 4; with the prior of 0.5 wins each way: p_a/p_b = 3.5/1.5.
    matches: list[RankedMatch] = [[("a", 1), ("b", 2)]] * 3 + [[("b", 1), ("a", 2)]]
    strengths = fit(matches)
    assert strengths["a"] - strengths["b"] == pytest.approx(400 * math.log10(3.5 / 1.5))


def test_bootstrap_intervals_hold_the_fit_and_are_reproducible() -> None:
    rng = random.Random(3)
    matches: list[RankedMatch] = []
    for _ in range(30):
        order = sorted(["a", "b", "c"], key=lambda n: rng.random() * {"a": 3, "b": 2, "c": 1}[n])
        matches.append([(name, place) for place, name in enumerate(reversed(order), 1)])
    first = bootstrap(matches, samples=50, seed=7)
    assert first == bootstrap(matches, samples=50, seed=7)
    for strength in first.values():
        assert strength.low <= strength.score <= strength.high
        assert strength.low < strength.high


def test_consistent_results_agree_in_any_order() -> None:
    # a beats b four times of five, evenly through the season; c always last.
    season: list[RankedMatch] = [[("a", 1), ("b", 2), ("c", 3)]] * 4
    matches = ([*season, [("b", 1), ("a", 2), ("c", 3)]]) * 5
    check = order_check(matches, shuffles=8, seed=1)
    assert check.shuffles == 8
    assert check.agree, check


def test_the_order_check_detects_a_drift() -> None:
    # Early matches say a is best; late matches say b is: the order matters a lot.
    matches: list[RankedMatch] = [[("a", 1), ("b", 2)]] * 60 + [[("b", 1), ("a", 2)]] * 60
    check = order_check(matches, shuffles=4, seed=1)
    assert check.worst_gap_sigma > 1.0
    assert not check.agree


def simulate(strengths: list[float], matches: int, seed: int) -> list[RankedMatch]:
    """Plackett-Luce draws: each place goes to a remaining competitor with probability
    proportional to its strength. Competitor i is called "c{i}"."""
    rng = random.Random(seed)
    played: list[RankedMatch] = []
    for _ in range(matches):
        remaining = list(range(len(strengths)))
        places: list[tuple[str, int]] = []
        while remaining:
            pick = rng.choices(remaining, weights=[strengths[i] for i in remaining])[0]
            remaining.remove(pick)
            places.append((f"c{pick}", len(places) + 1))
        played.append(places)
    return played


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.floats(3.0, 6.0), min_size=1, max_size=4),
    st.floats(0.5, 2.0),
    st.integers(0, 2**32),
)
def test_simulated_outcomes_recover_the_true_order(
    ratios: list[float], base: float, seed: int
) -> None:
    # Strengths at least 3x apart, from weakest (c0) to strongest; 200 matches.
    strengths = [base]
    for ratio in ratios:
        strengths.append(strengths[-1] * ratio)
    matches = simulate(strengths, 200, seed)
    truth = [f"c{i}" for i in range(len(strengths))][::-1]
    skills = rate_matches(matches)
    assert sorted(skills, key=lambda n: -skills[n].mu) == truth
    strengths_bt = fit(matches)
    assert sorted(strengths_bt, key=lambda n: -strengths_bt[n]) == truth
