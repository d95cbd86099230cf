"""The issue's done-when for plug-ins: a package (tests/plugins/package.py, on the
PYTHONPATH of the `opsarena` subprocess, no pip) adds a challenge with its own checks and
a fault, and `opsarena run --challenge NAME` plays a match with them on real hosts, with
no edit to opsarena: the record shows the plug-in's milestones passed and its fault
injected."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agents.contexts import script
from tests.conftest import ArenaRuns
from tests.plugins.package import (
    CHALLENGE,
    FAULT,
    GREETER_AGENT,
    GREETING,
    plugin_env,
    write_plugin,
)

pytestmark = pytest.mark.hosts

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]


def test_a_plugin_challenge_and_fault_play_a_match_through_the_cli(
    arena_runs: ArenaRuns, tmp_path: Path
) -> None:
    root = write_plugin(tmp_path / "site")
    agent = script(tmp_path / "greeter.sh", GREETER_AGENT)
    db, record_path = tmp_path / "log.db", tmp_path / "record.json"
    process = arena_runs.start(
        db,
        [*OPSARENA, "run", "--quiet", "--db", str(db), "--record", str(record_path),
         "--time-limit", "240", "--drain", "10", "--challenge", CHALLENGE,
         "--builder", f"a=command:{agent}"],
        env=plugin_env(root), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err
    record = json.loads(record_path.read_text())
    assert (record["challenge"], record["challenge_source"]) == (CHALLENGE, CHALLENGE)
    assert record["winner"] == "a"
    milestones = record["territories"]["a"]["milestones"]
    assert milestones["greets"]["passed"] and milestones["greets"]["evidence"] == {
        "greeting": GREETING
    }
    after = milestones["greets-after-double-restart"]
    assert after["passed"] and after["evidence"]["fault"] == FAULT
    assert record["territories"]["a"]["milestone_points"] == 100
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT data FROM events WHERE type = 'fault_injected'").fetchall()
    injected = [json.loads(data) for (data,) in rows]
    assert [(f["fault"], f["milestone"], f["ok"]) for f in injected] == [
        (FAULT, "greets-after-double-restart", True)
    ]
    assert injected[0]["detail"].startswith(f"{FAULT}: plugin-greeter.service restarted twice")
