"""The match's pure decisions: the winner rule and when a match is over."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from opsarena.match.rules import Standing, finish_reason, match_winner, winner


def standing(
    name: str,
    points: int = 0,
    at: int | None = None,
    *,
    durable: bool = False,
    settled: bool = False,
) -> Standing:
    return Standing(name, points, at, durable, settled)


def test_only_a_durable_deployment_wins_and_the_first_durable_one_does() -> None:
    # Points alone never win: the best-scoring service that is not durable loses records.
    assert winner([standing("a", 30, 900), standing("b", 60, 5000)]) is None
    assert winner([standing("a", 60, 900), standing("b", 100, 5000, durable=True)]) == "b"
    both = [standing("a", 100, 900, durable=True), standing("b", 100, 500, durable=True)]
    assert winner(both) == "b"
    assert winner([standing("a", 0), standing("b", 0)]) is None
    assert winner([]) is None


def test_first_durable_ends_the_default_match_and_wins_it() -> None:
    standings = [standing("a", 100, 9000, durable=True), standing("b", 60, 100)]
    reason = finish_reason(standings, mode="first-durable", time_up=False)
    assert reason == "first durable deployment"
    assert match_winner(standings, reason, ["a"]) == "a"


def test_finish_all_waits_for_every_territory() -> None:
    standings = [standing("a", 100, 9000, durable=True), standing("b", 60, 100)]
    assert finish_reason(standings, mode="all", time_up=False) is None
    settled = [standing("a", 100, 9000, durable=True), standing("b", 60, 100, settled=True)]
    reason = finish_reason(settled, mode="all", time_up=False)
    assert reason == "all competitors finished"
    assert match_winner(settled, reason, ["a"]) == "a"


def test_time_limit_and_everyone_finished() -> None:
    running = [standing("a", 30, 100), standing("b")]
    assert finish_reason(running, mode="first-durable", time_up=False) is None
    assert finish_reason(running, mode="first-durable", time_up=True) == "time limit"
    done = [standing("a", 30, 100, settled=True), standing("b", settled=True)]
    assert finish_reason(done, mode="first-durable", time_up=False) == "all competitors finished"
    assert match_winner(done, "all competitors finished", []) is None  # nobody durable
    assert match_winner(done, "time limit", []) is None
    late = [standing("a", 100, 7000, durable=True, settled=True), standing("b", settled=True)]
    assert match_winner(late, "all competitors finished", ["a"]) == "a"
    assert match_winner(late, "aborted", ["a"]) is None


def test_a_match_whose_only_competitor_is_not_durable_is_never_won() -> None:
    # e.g. a service that ignores ids: it may pass service-up, never write-read.
    alone = [standing("ignores-ids", 10, 400, settled=True)]
    for reason in ("all competitors finished", "time limit"):
        assert match_winner(alone, reason, []) is None


@given(
    st.lists(
        st.tuples(st.integers(0, 100), st.one_of(st.none(), st.integers(0, 10**6))),
        min_size=1,
        max_size=8,
    )
)
def test_winner_does_not_depend_on_order(entries: list[tuple[int, int | None]]) -> None:
    standings = [standing(f"t{i}", p, at if p else None) for i, (p, at) in enumerate(entries)]
    chosen = winner(standings)
    assert chosen == winner(list(reversed(standings)))
    assert chosen is None  # nobody here is durable


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 10**6)), min_size=1, max_size=8))
def test_the_winner_is_durable_and_first(entries: list[tuple[bool, int]]) -> None:
    standings = [
        standing(f"t{i}", 100 if durable else 60, at, durable=durable)
        for i, (durable, at) in enumerate(entries)
    ]
    chosen = winner(standings)
    assert chosen == winner(list(reversed(standings)))
    durable = [s for s in standings if s.durable]
    if not durable:
        assert chosen is None
    else:
        first = min(s.reached_at_ms or 0 for s in durable)
        picked = next(s for s in standings if s.territory == chosen)
        assert picked.durable and picked.reached_at_ms == first
