"""Issue 17's done-when over the whole catalog, at a reduced size: a tournament of the
scripted reference and two flawed builders over every built-in challenge (one trial
each: the durable-records example file plays five and is killed and resumed in
test_end_to_end.py) ranks the reference above both with non-overlapping intervals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opsarena.challenges import builtin_names
from tests.conftest import new_match_id, podman_names

pytestmark = pytest.mark.hosts

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]
TOURNAMENT = """
name = "the catalog, scripted"
challenges = "all"
trials = 1
group_size = 0
parallel = 3
retries = 1

[match]
time_limit_s = 240
drain_s = 1
finish = "all"

[territories.reference]
agent = "scripted:reference"

[territories.in-memory]
agent = "scripted:in-memory"

[territories.idle]
agent = "scripted:idle"
"""


def leaderboard(db: Path, tournament_id: str, *extra: str) -> list[dict[str, object]]:
    board = subprocess.run(
        [*OPSARENA, "leaderboard", "--tournament", tournament_id, "--db", str(db), "--json",
         *extra],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows: list[dict[str, object]] = json.loads(board.stdout)
    return rows


def test_a_tournament_over_every_challenge_ranks_the_reference_first(tmp_path: Path) -> None:
    spec = tmp_path / "catalog.toml"
    spec.write_text(TOURNAMENT)
    db = tmp_path / "log.db"
    tournament_id = new_match_id("cat")
    try:
        run = subprocess.run(
            [*OPSARENA, "tournament", "run", str(spec), "--id", tournament_id, "--db", str(db),
             "--quiet"],
            capture_output=True, text=True, timeout=1200, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        rows = leaderboard(db, tournament_id)
        by_name = {str(row["competitor"]): row for row in rows}
        assert rows[0]["competitor"] == "reference"
        reference = by_name["reference"]
        assert reference["matches"] == len(builtin_names()) and reference["durable_rate"] == 1.0
        for bad in ("in-memory", "idle"):
            assert by_name[bad]["durable_rate"] == 0.0
            low: float = reference["durable_rate_ci"][0]  # type: ignore[index]
            high: float = by_name[bad]["durable_rate_ci"][1]  # type: ignore[index]
            assert low > high, (reference, by_name[bad])
        for name in builtin_names():
            of_one = leaderboard(db, tournament_id, "--challenge", name)
            per = {str(r["competitor"]): r for r in of_one}
            assert per["reference"]["durable_rate"] == 1.0, (name, per["reference"])
            assert per["idle"]["durable_rate"] == 0.0, name
    finally:
        for n in range(1, 3 * len(builtin_names()) + 1):
            left = podman_names(f"{tournament_id}-{n}")
            if left:
                subprocess.run(["podman", "rm", "-f", *left], check=False, capture_output=True)
