"""The ranking rule of one match, tested directly."""

from __future__ import annotations

from opsarena.ratings import Placing, rank_match


def p(name: str, durable: int | None, points: int, last: int | None) -> Placing:
    return Placing(name, durable, points, last)


def test_durable_first_ordered_by_time_to_durable() -> None:
    placings = [
        p("slow-durable", 9000, 100, 9000),
        p("fast-durable", 4000, 100, 4000),
        p("most-points-not-durable", None, 60, 1000),
    ]
    assert rank_match(placings) == [2, 1, 3]


def test_then_points_then_time_of_last_milestone() -> None:
    placings = [
        p("thirty-late", None, 30, 5000),
        p("sixty", None, 60, 7000),
        p("thirty-early", None, 30, 2000),
        p("nothing", None, 0, None),
    ]
    assert rank_match(placings) == [3, 1, 2, 4]


def test_ties_stay_ties_and_the_next_place_skips() -> None:
    placings = [
        p("a", 3000, 100, 3000),
        p("b", 3000, 100, 3000),
        p("c", None, 0, None),
        p("d", None, 0, None),
        p("e", 1000, 100, 1000),
    ]
    assert rank_match(placings) == [2, 2, 4, 4, 1]


def test_durable_beats_a_non_durable_that_reached_its_points_sooner() -> None:
    assert rank_match([p("durable", 20_000, 100, 20_000), p("quick", None, 60, 10)]) == [1, 2]


def test_the_ranking_does_not_depend_on_input_order() -> None:
    placings = [p("a", None, 30, 10), p("b", 500, 100, 500), p("c", None, 30, 5)]
    ranks = dict(zip([x.competitor for x in placings], rank_match(placings), strict=True))
    reversed_placings = placings[::-1]
    reversed_ranks = dict(
        zip([x.competitor for x in reversed_placings], rank_match(reversed_placings), strict=True)
    )
    assert ranks == reversed_ranks == {"b": 1, "c": 2, "a": 3}
