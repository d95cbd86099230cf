"""A challenge authored outside the package, as a directory: `opsarena run --challenge
PATH` plays it, the log says where it came from, `resume` finds it again after a kill,
and `show` renders its milestones without knowing them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from opsarena.challenges.catalog import builtin_root
from tests.conftest import ArenaRuns, podman_names
from tests.match.test_resume import OPSARENA, kill_after, record_of, resume, seqs_of, truncate_log

pytestmark = pytest.mark.hosts


def outside_challenge(tmp_path: Path) -> Path:
    directory = tmp_path / "elsewhere" / "outside-records"
    shutil.copytree(builtin_root() / "durable-records", directory)
    toml = directory / "challenge.toml"
    text = toml.read_text().replace('name = "durable-records"', 'name = "outside-records"')
    text = text.replace('title = "The service answers its health check"',
                        'title = "Outside: the service answers"')  # fmt: skip
    toml.write_text(text)
    (directory / "files" / "etc" / "outside").mkdir(parents=True)
    (directory / "files" / "etc" / "outside" / "note.txt").write_text("placed by the arena\n")
    return directory


def test_an_outside_directory_plays_resumes_and_shows(
    arena_runs: ArenaRuns, tmp_path: Path
) -> None:
    directory = outside_challenge(tmp_path)
    db = tmp_path / "log.db"
    process = arena_runs.start(
        db,
        [*OPSARENA, "run", "--quiet", "--db", str(db), "--time-limit", "120", "--drain", "10",
         "--challenge", str(directory), "--builder", "ref=scripted:reference"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    match_id = kill_after(process, db, "agent_ended")
    truncate_log(db, match_id, seqs_of(db, match_id, "agent_ended")[0])
    try:
        before = record_of(db, match_id)
        assert before.challenge == "outside-records"
        assert before.challenge_source == str(directory.resolve())
        # Moving the current directory does not matter: the log holds the absolute path.
        resumed = resume(db, match_id)
        assert resumed.returncode == 0, resumed.stderr
        record = record_of(db, match_id)
        assert record.match_state == "finished" and record.winner == "ref"
        assert record.territories["ref"].milestone_points == 100
        assert record.milestone_titles["service-up"] == "Outside: the service answers"
        shown = subprocess.run(
            [*OPSARENA, "show", match_id, "--db", str(db)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert "Outside: the service answers" in shown.stdout
    finally:
        subprocess.run([*OPSARENA, "hosts", "cleanup", "--match", match_id], check=False)
    assert podman_names(match_id) == []


def test_resume_says_so_when_the_directory_is_gone(arena_runs: ArenaRuns, tmp_path: Path) -> None:
    directory = outside_challenge(tmp_path)
    db = tmp_path / "log.db"
    process = arena_runs.start(
        db,
        [*OPSARENA, "run", "--quiet", "--db", str(db), "--time-limit", "120",
         "--challenge", str(directory), "--builder", "ref=scripted:idle"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    match_id = kill_after(process, db, "match_started")
    try:
        shutil.rmtree(directory)
        resumed = resume(db, match_id)
        assert resumed.returncode == 2
        assert "no such file" in resumed.stderr and str(directory.resolve()) in resumed.stderr
        assert len(resumed.stderr.strip().splitlines()) == 1
    finally:
        subprocess.run([*OPSARENA, "hosts", "cleanup", "--match", match_id], check=False)
