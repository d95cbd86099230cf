"""The leaderboard and tournament commands on bad input and on an empty log (no hosts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opsarena.store import SqliteEventStore

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "log.db"
    SqliteEventStore(path).close()
    return path


def opsarena(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*OPSARENA, *args], capture_output=True, text=True, check=False)


def one_error_line(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("opsarena: error: ")
    for word in words:
        assert word in lines[0], lines[0]


def test_an_empty_log_has_an_empty_leaderboard(db: Path) -> None:
    done = opsarena("leaderboard", "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    csv_done = opsarena("leaderboard", "--db", str(db), "--csv")
    assert csv_done.stdout.splitlines() == [csv_done.stdout.splitlines()[0]]
    assert csv_done.stdout.startswith("competitor,matches,")
    listed = opsarena("tournament", "ls", "--db", str(db))
    assert listed.returncode == 0
    assert listed.stdout.split() == ["tournament", "name", "state", "counted", "void",
                                     "playing", "created"]  # fmt: skip


def test_bad_leaderboard_and_tournament_input_is_one_line_and_exit_2(
    db: Path, tmp_path: Path
) -> None:
    one_error_line(opsarena("leaderboard", "--db", str(db), "--json", "--csv"), "choose one")
    one_error_line(opsarena("leaderboard", "--db", str(db), "--tournament", "nope"), "nope")
    one_error_line(
        opsarena("leaderboard", "--db", str(db), "--challenge", "durable-records"),
        "no counted match",
    )
    one_error_line(opsarena("tournament", "show", "nope", "--db", str(db)), "no tournament")
    one_error_line(opsarena("tournament", "resume", "nope", "--db", str(db)), "no tournament")
    one_error_line(
        opsarena("tournament", "report", "nope", "--db", str(db), "--html",
                 str(tmp_path / "missing" / "r.html")),
        "does not exist",
    )  # fmt: skip
    one_error_line(
        opsarena("tournament", "run", "x.toml", "--id", "Bad/Id", "--db", str(db)), "--id"
    )
