"""The leaderboard from plain outcomes: order, every key of the JSON, per-challenge rates."""

from __future__ import annotations

import pytest

from opsarena.ratings import Entry, MatchOutcome, leaderboard, pass_hat_k, wilson_interval


def durable(name: str, at: int, cost: int = 0, known: bool = True) -> Entry:
    return Entry(name, at, 100, at, 1000, 100, cost, known)


def flawed(name: str, points: int, last: int | None, cost: int = 0) -> Entry:
    return Entry(name, None, points, last, 500, 50, cost)


def season(trials: int) -> list[MatchOutcome]:
    outcomes = []
    for trial in range(trials):
        entries = (
            durable("reference", 4000 + trial, cost=20_000),
            durable("webdav", 4500 - trial, cost=0, known=trial != 2),
            flawed("in-memory", 30, 3000, cost=10_000),
            flawed("idle", 0, None),
        )
        outcomes.append(MatchOutcome(f"m{trial}", "durable-records", entries))
    return outcomes


def test_best_first_with_every_promised_key() -> None:
    board = leaderboard(season(5), bootstrap_samples=50)
    rows = board.to_json()
    assert [r["competitor"] for r in rows][2:] == ["in-memory", "idle"]
    assert {r["competitor"] for r in rows[:2]} == {"reference", "webdav"}
    for row in rows:
        for key in ("competitor", "matches", "durable_rate", "durable_rate_ci", "mu", "sigma",
                    "ordinal", "cost_per_durable_usd", "bt", "bt_ci"):  # fmt: skip
            assert key in row, key
        assert row["matches"] == 5
    by_name = {r["competitor"]: r for r in rows}
    assert by_name["reference"]["durable_rate"] == 1.0
    assert by_name["reference"]["durable_rate_ci"] == list(wilson_interval(5, 5))
    assert by_name["idle"]["durable_rate_ci"][1] < by_name["reference"]["durable_rate_ci"][0]
    assert by_name["reference"]["ordinal"] > by_name["in-memory"]["ordinal"]
    assert by_name["reference"]["bt_ci"][0] > by_name["in-memory"]["bt_ci"][1]
    assert board.matches == 5


def test_cost_per_durable_counts_failed_matches_and_is_null_when_unknown() -> None:
    by_name = {r["competitor"]: r for r in leaderboard(season(5), bootstrap_samples=10).to_json()}
    assert by_name["reference"]["cost_per_durable_usd"] == pytest.approx(0.02)
    assert by_name["webdav"]["cost_per_durable_usd"] is None  # one trial's cost unknown
    assert by_name["in-memory"]["cost_per_durable_usd"] is None  # never durable
    assert by_name["reference"]["tokens_per_durable"] == pytest.approx(1100.0)
    assert by_name["in-memory"]["tokens_per_durable"] is None


def test_per_challenge_rates_pass_k_and_median_time() -> None:
    outcomes = season(4)
    outcomes.append(
        MatchOutcome("x", "other", (flawed("reference", 10, 100), durable("in-memory", 7000)))
    )
    board = leaderboard(outcomes, bootstrap_samples=10)
    reference = next(r for r in board.rows if r.competitor == "reference")
    stats = {c.challenge: c.to_json() for c in reference.challenges}
    assert stats["durable-records"]["pass_hat_k"] == {"1": 1.0, "2": 1.0, "3": 1.0, "4": 1.0}
    assert stats["other"]["pass_at_k"] == {"1": 0.0}
    assert stats["durable-records"]["median_ms_to_durable"] == pytest.approx(4001.5)
    assert reference.usage.matches == 5
    assert reference.to_json()["durable_rate"] == pytest.approx(0.8)
    in_memory = next(r for r in board.rows if r.competitor == "in-memory")
    assert in_memory.challenges[1].pass_hat() == {1: pass_hat_k(1, 1, 1)}


def test_a_challenge_filter_keeps_only_its_matches() -> None:
    outcomes = [*season(3), MatchOutcome("x", "other", (durable("solo", 10), flawed("b", 0, None)))]
    board = leaderboard(outcomes, challenge="other", bootstrap_samples=10)
    assert [r.competitor for r in board.rows] == ["solo", "b"]
    assert board.matches == 1


def test_the_order_does_not_depend_on_the_input_order() -> None:
    outcomes = season(5)
    forward = [r["competitor"] for r in leaderboard(outcomes, bootstrap_samples=10).to_json()]
    backward = [
        r["competitor"] for r in leaderboard(outcomes[::-1], bootstrap_samples=10).to_json()
    ]
    assert forward[2:] == backward[2:] == ["in-memory", "idle"]
