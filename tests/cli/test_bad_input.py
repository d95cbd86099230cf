"""Bad input, command by command: one clear line per problem, exit code 2, nothing made.

A table of cases for every command and for challenge and competitors files. After
each, the event log holds no event and no file was half-written.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]

BAD_CHALLENGE = 'name = "x"\ntitle = 3\n'
UNKNOWN_CHECK = """\
name = "odd"
title = "Odd"
brief = "Do the thing."
image = "localhost/opsarena-host:bookworm"
port = 8080
unit = "builder-app.service"
time_limit_s = 60

[[milestones]]
id = "up"
title = "Up"
points = 10
check = "no-such-check"
"""
NEEDS_TELEPORT = UNKNOWN_CHECK.replace('check = "no-such-check"', 'check = "health"').replace(
    "time_limit_s = 60\n", 'time_limit_s = 60\nfaults = ["teleport"]\n'
)
DUPLICATE_TERRITORY = '[territories.a]\nagent = "human"\n[territories.a]\nagent = "human"\n'
IMPOSSIBLE_LIMITS = '[territories.a]\nagent = "llm:m"\nlimits = { turns = -1 }\n'
WRONG_TYPE = "[territories.a]\nagent = 42\n"
UNKNOWN_KIND = '[territories.a]\nagent = "martian:x"\n'
NOT_TOML = "[territories.a\nagent = \n"

CASES: list[tuple[str, list[str], str]] = [
    # command, arguments ({tmp} is a scratch directory), what the line must say
    ("run", ["--builder", "a=scripted:idle", "--time-limit", "0"], "--time-limit"),
    ("run", ["--builder", "a=scripted:idle", "--drain", "-1"], "--drain"),
    ("run", ["--competitors", "{tmp}/missing.toml"], "does not exist"),
    ("run", ["--competitors", "{tmp}/dup.toml"], "twice"),
    ("run", ["--competitors", "{tmp}/limits.toml"], "territories.a.limits.turns"),
    ("run", ["--competitors", "{tmp}/type.toml"], "territories.a.agent"),
    ("run", ["--competitors", "{tmp}/kind.toml"], "martian"),
    ("run", ["--competitors", "{tmp}/syntax.toml"], "not valid TOML"),
    ("run", ["--builder", "a=scripted:idle", "--challenge", "{tmp}/odd.toml"], "no-such-check"),
    ("run", ["--builder", "a=scripted:idle", "--unknown-flag"], "No such option"),
    (
        "run",
        ["--builder", "a=scripted:idle", "--challenge", "{tmp}/teleport.toml"],
        "needs the fault(s) teleport",
    ),
    ("demo", ["extra"], "unexpected extra argument"),
    ("show", ["no-such-match"], "no match 'no-such-match'"),
    ("show", [], "Missing argument"),
    ("events", ["no-such-match"], "no match 'no-such-match'"),
    ("ls", ["--limit", "0"], "--limit"),
    ("resume", ["no-such-match"], "no match 'no-such-match'"),
    ("done", ["no-such-match", "a"], "no match 'no-such-match'"),
    ("done", ["only-one-argument"], "Missing argument"),
    ("challenges", ["show", "no-such-challenge"], "no built-in challenge named"),
    ("challenges", ["validate", "{tmp}/bad.toml"], "bad.toml: title"),
    ("challenges", ["validate", "{tmp}/missing.toml"], "missing.toml"),
    ("challenges", ["frob"], "No such command 'frob'"),
    ("hosts", ["restart-service", "no-such-host"], "Missing argument"),
    ("hosts", ["reboot", "no-such-host", "--hard", "--soft"], "No such option"),
    ("image", ["build", "--name", "UPPER:case"], "not a valid image name"),
    ("image", ["ls", "extra"], "unexpected extra argument"),
]


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    files = {
        "bad.toml": BAD_CHALLENGE,
        "odd.toml": UNKNOWN_CHECK,
        "teleport.toml": NEEDS_TELEPORT,
        "dup.toml": DUPLICATE_TERRITORY,
        "limits.toml": IMPOSSIBLE_LIMITS,
        "type.toml": WRONG_TYPE,
        "kind.toml": UNKNOWN_KIND,
        "syntax.toml": NOT_TOML,
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize(("command", "args", "expected"), CASES, ids=lambda v: str(v)[:40])
def test_bad_input(scratch: Path, command: str, args: list[str], expected: str) -> None:
    db = scratch / "log.db"
    record = scratch / "record.json"
    argv = [a.replace("{tmp}", str(scratch)) for a in args]
    if command in ("run", "show", "events", "ls", "resume", "done", "demo"):
        argv += ["--db", str(db)]
    if command == "run":
        argv += ["--record", str(record), "--quiet"]
    before = sorted(p.name for p in scratch.iterdir())
    result = subprocess.run(
        [*OPSARENA, command, *argv], capture_output=True, text=True, timeout=60, check=False
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result
    assert lines and all(line.startswith("opsarena: error: ") for line in lines), lines
    assert any(expected in line for line in lines), lines
    if command != "challenges":  # a challenge file reports one line per problem
        assert len(lines) == 1, lines
    assert not record.exists(), "no record for a match that never ran"
    if db.exists():
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)
    leftovers = (
        set(p.name for p in scratch.iterdir())
        - set(before)
        - {"log.db", "log.db-wal", "log.db-shm"}
    )
    assert not leftovers, f"half-written files: {leftovers}"


def test_an_invalid_challenge_file_gets_one_line_per_problem(scratch: Path) -> None:
    result = subprocess.run(
        [*OPSARENA, "challenges", "validate", str(scratch / "bad.toml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) >= 3
    assert all(str(scratch / "bad.toml") in line or "bad.toml" in line for line in lines)
    assert any("brief" in line and "required" in line for line in lines)
