"""The calibration harness and the authoring commands: `opsarena challenges calibrate`
(its matrix file's checks, its exit codes), `opsarena challenges new` (a scaffold that
validates and calibrates on a real host as made), and a built-in challenge copied and
renamed elsewhere, calibrated with no edit outside its directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opsarena.agents.scripted import challenge_builders
from opsarena.challenges import builtin_challenge, builtin_names, load_challenge
from opsarena.challenges.calibrate import PASS, load_calibration
from opsarena.challenges.catalog import builtin_root
from opsarena.errors import ChallengeError

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]


def opsarena(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400"}
    return subprocess.run(
        [*OPSARENA, *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def test_every_built_in_challenge_has_its_builders_and_a_valid_calibration() -> None:
    for name in builtin_names():
        challenge = builtin_challenge(name)
        plan = load_calibration(challenge)
        builders = challenge_builders(challenge.directory)
        assert "reference" in plan.expected and set(plan.expected) <= set(builders), name
        reference = plan.expected["reference"]
        assert reference.stops_at is None and reference.points == challenge.total_points
        assert reference.outcomes(challenge) == [PASS] * len(challenge.milestones)


def copy_of(name: str, tmp_path: Path, new_name: str) -> Path:
    directory = tmp_path / new_name
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copytree(builtin_root() / name, directory)
    toml = directory / "challenge.toml"
    toml.write_text(toml.read_text().replace(f'name = "{name}"', f'name = "{new_name}"', 1))
    return directory


def test_a_wrong_matrix_is_refused_with_a_line_per_problem(tmp_path: Path) -> None:
    directory = copy_of("durable-records", tmp_path, "matrix-records")
    (directory / "calibration.toml").write_text(
        "seed = 3\ncolour = 1\n"
        "[builders.reference]\npoints = 90\n"
        '[builders.in-memory]\npoints = 30\nstops_at = "service-restart"\n'
        '[builders.idle]\npoints = 0\nstops_at = "nowhere"\nreason = "no_such_reason"\n'
        "[builders.nobody]\npoints = 100\n"
    )
    with pytest.raises(ChallengeError) as caught:
        load_calibration(load_challenge(directory))
    lines = caught.value.problems
    assert all(line.startswith(f"{directory / 'calibration.toml'}: ") for line in lines)
    text = "\n".join(lines)
    for part in ("seed: must be text", "colour: unknown field",
                 "builders.reference.points: 90, but the milestones before the end are worth 100",
                 "builders.in-memory: stops_at and reason go together",
                 "builders.idle.stops_at: no milestone 'nowhere'",
                 "builders.idle.reason: 'no_such_reason' is not in",
                 "builders.nobody: no such builder"):  # fmt: skip
        assert part in text, text
    assert len(lines) == 7, lines


def test_calibrate_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    for args, says in (
        (["nonesuch"], "no built-in challenge named 'nonesuch'"),
        (["durable-records", "--builders", "reference,nobody"], "--builders: nobody not in"),
        (["durable-records", "--builders", ","], "--builders names no builder"),
        ([str(tmp_path / "missing")], "no such file"),
    ):
        run = opsarena("challenges", "calibrate", *args)
        assert run.returncode == 2, (args, run.stdout, run.stderr)
        assert says in run.stderr and run.stderr.count("\n") == 1, (args, run.stderr)


def test_new_refuses_a_bad_name_or_an_existing_path_writing_nothing(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    for path, says in ((tmp_path / "Bad_Name", "is the challenge's name"),
                       (tmp_path / "taken", "exists already"),
                       (tmp_path / "no" / "such-dir", "no directory")):  # fmt: skip
        run = opsarena("challenges", "new", str(path))
        assert run.returncode == 2 and says in run.stderr, run.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]


def test_a_copied_renamed_challenge_is_listed_with_path_and_validates(tmp_path: Path) -> None:
    # durable-records: a copy of a challenge whose checks file registers checks or a setup
    # collides with the built-in's registrations in one process (the registries' rule).
    directory = copy_of("durable-records", tmp_path / "mine", "copied-listed")
    listed = opsarena("challenges", "ls", "--path", str(tmp_path / "mine"))
    assert listed.returncode == 0, listed.stderr
    assert "copied-listed" in listed.stdout and "durable-records" in listed.stdout
    alone = opsarena("challenges", "ls", "--path", str(directory))
    assert alone.returncode == 0 and "copied-listed" in alone.stdout, alone.stderr
    assert opsarena("challenges", "validate", str(directory)).returncode == 0
    # Its builders are the copy's own.
    assert "in-memory" in challenge_builders(directory)
    (tmp_path / "empty").mkdir()
    empty = opsarena("challenges", "ls", "--path", str(tmp_path / "empty"))
    assert empty.returncode == 2 and "no challenge directory" in empty.stderr, empty.stderr


def test_the_scaffold_validates_and_has_what_an_author_fills_in(tmp_path: Path) -> None:
    made = opsarena("challenges", "new", str(tmp_path / "my-first"))
    assert made.returncode == 0, made.stderr
    directory = tmp_path / "my-first"
    assert sorted(p.name for p in directory.iterdir()) == [
        "builders.py", "calibration.toml", "challenge.toml", "checks.py", "files"
    ]  # fmt: skip
    assert (directory / "files" / "etc" / "my-first" / "greeting").is_file()
    validated = opsarena("challenges", "validate", str(directory))
    assert validated.returncode == 0, validated.stderr
    assert "valid challenge 'my-first'" in validated.stdout
    plan = load_calibration(load_challenge(directory))
    assert sorted(plan.expected) == ["idle", "reference"]
    assert sorted(challenge_builders(directory)) == ["idle", "reference"]


@pytest.mark.hosts
def test_a_new_scaffold_calibrates_on_real_hosts_as_made(tmp_path: Path) -> None:
    assert opsarena("challenges", "new", str(tmp_path / "fresh-greeter")).returncode == 0
    run = opsarena(
        "challenges", "calibrate", str(tmp_path / "fresh-greeter"), "--parallel", "2",
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert "reference: expected 100 pts, all | measured 100 pts, all | ok" in run.stdout
    assert "idle: expected 0 pts, stops at greeting: connection_refused" in run.stdout
    assert "fresh-greeter: 2/2 as calibrated" in run.stdout


@pytest.mark.hosts
def test_a_copied_renamed_challenge_calibrates_its_own_builders(tmp_path: Path) -> None:
    """durable-records copied elsewhere and renamed: its builders (in-memory is no other
    challenge's) and its matrix come from the copy; a wrong row is a mismatch (exit 1)."""
    directory = copy_of("durable-records", tmp_path, "copied-records")
    calibration = directory / "calibration.toml"
    # The copy's own matrix, made wrong for `idle` (it stops at service-up, with 0 points).
    calibration.write_text(
        calibration.read_text().replace(
            '[builders.idle]\npoints = 0\nstops_at = "service-up"\nreason = "connection_refused"',
            '[builders.idle]\npoints = 0\nstops_at = "service-up"\nreason = "wrong_body"',
        )
    )
    run = opsarena(
        "challenges", "calibrate", str(directory), "--builders", "in-memory,idle",
        "--parallel", "2", timeout=600,
    )  # fmt: skip
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "in-memory: expected 30 pts, stops at service-restart: record_missing" in run.stdout
    assert "measured 30 pts, stops at service-restart: record_missing | ok" in run.stdout
    assert "idle: expected 0 pts, stops at service-up: wrong_body" in run.stdout
    assert "measured 0 pts, stops at service-up: connection_refused | MISMATCH" in run.stdout
    assert "copied-records: 1/2 as calibrated; MISMATCH: idle" in run.stdout
