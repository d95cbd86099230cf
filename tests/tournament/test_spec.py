"""Tournament files: validation (one line per problem), the schedule and match seeds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opsarena.errors import TournamentError
from opsarena.tournament import Slot, load_tournament, match_seed, parse_tournament, schedule
from opsarena.tournament.runner import preflight_competitors

GOOD = """
name = "t"
challenges = ["durable-records"]
trials = 3
[match]
time_limit_s = 60
[territories.reference]
agent = "scripted:reference"
[territories.idle]
agent = "scripted:idle"
"""


def test_a_good_file_gives_its_schedule() -> None:
    plan = parse_tournament(GOOD, "good.toml")
    assert list(plan.competitors) == ["reference", "idle"]
    assert list(plan.challenges) == ["durable-records"]
    assert [s.trial for s in plan.slots] == [1, 2, 3]
    assert all(s.group == ("reference", "idle") for s in plan.slots)
    assert plan.limits.finish == "all"
    assert plan.limits.time_limit_s == 60


def test_every_problem_is_one_line_naming_the_field() -> None:
    bad = """
challenges = ["no-such-challenge"]
trials = 0
colour = "red"
[territories.reference]
agent = "scripted:nope"
"""
    with pytest.raises(TournamentError) as caught:
        parse_tournament(bad, "bad.toml")
    lines = str(caught.value).splitlines()
    assert any("trials" in line for line in lines)
    assert any("colour" in line and "unknown field" in line for line in lines)
    assert all(line.startswith("bad.toml: ") for line in lines)
    # The model's errors come first; fixing them shows the next layer, each on its own line.
    fixed = bad.replace("trials = 0\n", "").replace('colour = "red"\n', "")
    with pytest.raises(TournamentError) as caught:
        parse_tournament(fixed, "bad.toml")
    lines = str(caught.value).splitlines()
    assert any("challenges.0" in line and "no-such-challenge" in line for line in lines)
    assert any("at least two competitors" in line for line in lines)
    assert len(lines) == 2


async def test_a_competitor_that_cannot_play_is_refused_before_anything_is_logged() -> None:
    plan = parse_tournament(GOOD.replace("scripted:idle", "scripted:nope"), "p.toml")
    with pytest.raises(TournamentError) as caught:
        await preflight_competitors(plan)
    (line,) = str(caught.value).splitlines()
    assert line.startswith("p.toml: territories.idle.agent: unknown scripted builder 'nope'")


def test_group_size_and_seed_are_checked() -> None:
    with pytest.raises(TournamentError, match="group_size"):
        parse_tournament("group_size = 1\n" + GOOD, "g.toml")
    with pytest.raises(TournamentError, match="seed"):
        parse_tournament('seed = "xyz"\n' + GOOD, "s.toml")


def test_round_robin_groups_cover_every_pair_each_trial() -> None:
    slots = schedule(["c1", "c2"], ["a", "b", "c", "d"], 2, 2)
    assert len(slots) == 2 * 2 * 6
    first_trial = [s.group for s in slots if s.trial == 1 and s.challenge == "c1"]
    assert sorted(first_trial) == sorted(
        [("a", "b"), ("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"), ("c", "d")]
    )
    assert [s.slot for s in slots] == list(range(1, 25))
    everyone = schedule(["c1"], ["a", "b", "c"], 2, 0)
    assert [s.group for s in everyone] == [("a", "b", "c")] * 2


def test_match_seeds_are_derived_distinct_and_replayable() -> None:
    seed = bytes(range(16))
    slot = Slot(1, "durable-records", 1, ("a", "b"))
    other = Slot(2, "durable-records", 2, ("a", "b"))
    assert match_seed(seed, slot, 1) == match_seed(seed, slot, 1)
    assert len(match_seed(seed, slot, 1)) == 16
    seeds = {match_seed(seed, slot, 1), match_seed(seed, slot, 2), match_seed(seed, other, 1)}
    assert len(seeds) == 3
    assert match_seed(bytes(16), slot, 1) != match_seed(seed, slot, 1)


def test_the_example_file_is_valid_and_ci_sized() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "tournament-scripted.toml"
    plan = load_tournament(example)
    assert {"reference", "webdav"} <= set(plan.competitors)
    assert len(plan.competitors) >= 5
    assert plan.trials == 5
    assert plan.parallel == 2
    # durable-records only: six challenges would be six times the matches (the file says
    # how to play "all").
    assert list(plan.challenges) == ["durable-records"]


def test_the_cli_refuses_a_bad_file_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('trials = "many"\n[territories.a]\nagent = "scripted:reference"\n')
    db = tmp_path / "log.db"
    done = subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", "tournament", "run", str(bad),
         "--db", str(db)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines and all(line.startswith("opsarena: error: ") for line in lines)
    assert any("trials" in line for line in lines)
    assert not db.exists()
    missing = subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", "tournament", "run",
         str(tmp_path / "none.toml"), "--db", str(db)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
