"""Challenge files: the built-in durable-records, validation problems, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opsarena.challenges import (
    Verdict,
    builtin_challenge,
    builtin_names,
    check_names,
    load_challenge,
    register_check,
)
from opsarena.errors import ChallengeError

SEED = Path(__file__).parent.parent / "data" / "seed-match-record.json"
BUILTIN = (
    Path(__file__).resolve().parents[2]
    / "src" / "opsarena" / "challenges" / "builtin" / "durable-records" / "challenge.toml"
)  # fmt: skip
OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]


def opsarena(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OPSARENA, *args], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def test_durable_records_is_exactly_the_issue() -> None:
    challenge = builtin_challenge("durable-records")
    assert "durable-records" in builtin_names()
    assert [(m.id, m.points) for m in challenge.milestones] == [
        ("service-up", 10), ("write-read", 20), ("service-restart", 30), ("host-reboot", 40),
    ]  # fmt: skip
    assert [m.check for m in challenge.milestones] == [
        "health", "write-read", "restart-durability", "reboot-durability",
    ]  # fmt: skip
    facts = (challenge.port, challenge.unit, challenge.cadence_s)
    assert facts == (8080, "builder-app.service", 1.0)
    assert set(check_names()) >= {m.check for m in challenge.milestones}


def test_milestones_match_the_seed_record() -> None:
    seed = json.loads(SEED.read_text())
    points = {
        name: milestone["points"]
        for territory in seed["territories"].values()
        for name, milestone in territory["milestones"].items()
        if milestone["passed"]
    }
    challenge = builtin_challenge("durable-records")
    assert {m.id: m.points for m in challenge.milestones} == points


def test_the_brief_states_the_whole_contract() -> None:
    challenge = builtin_challenge("durable-records")
    brief = challenge.brief
    for fact in ("port 8080", "GET /health", "PUT /records/<id>", "GET /records/<id>", "404",
                 "1 MiB", "builder-app.service", "enabled", "reboot", "/run"):  # fmt: skip
        assert fact in brief, fact
    for milestone in challenge.milestones:
        assert f"{milestone.id} ({milestone.points} points)" in brief
        if milestone.check.endswith("-durability"):
            assert f"within {milestone.ready_budget_s:g} s" in brief
    first = challenge.milestones[0]
    assert f"within {first.read_timeout_s:g} s" in brief
    assert "Faults come as soon as the earlier milestones pass" in brief


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "challenge.toml"
    path.write_text(text)
    return path


def test_every_problem_gets_its_own_line(tmp_path: Path) -> None:
    text = BUILTIN.read_text().replace("port = 8080", "port = 99999")
    text = text.replace("points = 20", "points = -1").replace('check = "health"', 'check = "nope"')
    text = "surprise = true\n" + text
    path = write(tmp_path, text)
    with pytest.raises(ChallengeError) as caught:
        load_challenge(path)
    problems = caught.value.problems
    assert all(p.startswith(f"{path}: ") for p in problems)
    fields = sorted(p.split(": ")[1] for p in problems)
    assert fields == ["milestones[0].check", "milestones[1].points", "port", "surprise"]
    # A key after the last [[milestones]] header belongs to that milestone: named so.
    with pytest.raises(ChallengeError) as late:
        load_challenge(write(tmp_path, BUILTIN.read_text() + "surprise = 1\n"))
    assert late.value.problems == [f"{path}: milestones[3].surprise: unknown field"]
    assert "unknown field" in next(p for p in problems if "surprise" in p)
    assert "\n" not in str(caught.value)


def test_other_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ChallengeError, match="no such file"):
        load_challenge(tmp_path / "absent.toml")
    with pytest.raises(ChallengeError, match="not valid TOML"):
        load_challenge(write(tmp_path, "name = \n"))
    doubled = BUILTIN.read_text().replace('id = "write-read"', 'id = "service-up"')
    with pytest.raises(ChallengeError, match="appears twice"):
        load_challenge(write(tmp_path, doubled))
    module = BUILTIN.read_text().replace(
        "opsarena.workloads.records.checks", "opsarena.no_such_module"
    )
    with pytest.raises(ChallengeError, match="checks_module"):
        load_challenge(write(tmp_path, module))
    with pytest.raises(ChallengeError, match="no built-in challenge"):
        builtin_challenge("nope")


def test_a_challenge_may_register_its_own_checks(tmp_path: Path) -> None:
    @register_check("test-always-fails")
    async def always_fails(host: object, ctx: object) -> Verdict:
        return Verdict.failed("bad_status", "never")

    text = BUILTIN.read_text().replace('check = "health"', 'check = "test-always-fails"')
    challenge = load_challenge(write(tmp_path, text))
    assert challenge.milestones[0].check == "test-always-fails"


def test_cli_ls_show_validate(tmp_path: Path) -> None:
    listed = opsarena("challenges", "ls")
    assert listed.returncode == 0 and "durable-records" in listed.stdout
    shown = opsarena("challenges", "show", "durable-records")
    assert shown.returncode == 0
    assert builtin_challenge("durable-records").brief.strip().splitlines()[0] in shown.stdout
    valid = opsarena("challenges", "validate", str(BUILTIN))
    assert valid.returncode == 0 and "valid challenge 'durable-records'" in valid.stdout

    bad = write(tmp_path, "x = 1\n" + BUILTIN.read_text().replace("port = 8080", "port = 0"))
    invalid = opsarena("challenges", "validate", str(bad))
    assert invalid.returncode == 2
    lines = invalid.stderr.strip().splitlines()
    assert lines == [
        f"opsarena: error: {bad}: port: Input should be greater than or equal to 1",
        f"opsarena: error: {bad}: x: unknown field",
    ]
    unknown = opsarena("challenges", "show", "nope")
    assert unknown.returncode == 2
    assert len(unknown.stderr.strip().splitlines()) == 1


def test_a_file_without_checks_module_uses_the_records_workload(tmp_path: Path) -> None:
    text = BUILTIN.read_text().replace('checks_module = "opsarena.workloads.records.checks"\n', "")
    assert "checks_module" not in text
    challenge = load_challenge(write(tmp_path, text))
    assert challenge.checks_module == "opsarena.workloads.records.checks"
    assert "write-read" in {m.check for m in challenge.milestones}


def test_a_file_naming_the_old_checks_module_still_loads(tmp_path: Path) -> None:
    """Before issue 24 the records checks lived in `opsarena.referee.checks`, which
    third-party files name: the module still imports and the checks are found."""
    text = BUILTIN.read_text().replace(
        "opsarena.workloads.records.checks", "opsarena.referee.checks"
    )
    challenge = load_challenge(write(tmp_path, text))
    assert challenge.checks_module == "opsarena.referee.checks"
    assert {m.check for m in challenge.milestones} <= set(check_names())
