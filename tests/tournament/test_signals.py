"""SIGTERM to a tournament playing two matches at once: both stop, no new match starts,
and `tournament resume` replays the two and finishes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ArenaRuns, new_match_id, podman_names
from tests.tournament.logs import match_events, read_tournament

pytestmark = pytest.mark.hosts

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]
FILE = """
challenges = ["durable-records"]
trials = 3
parallel = 2
retries = 1
[match]
time_limit_s = 90
drain_s = 1
[territories.reference]
agent = "scripted:reference"
[territories.idle]
agent = "scripted:idle"
"""


def test_sigterm_stops_every_running_match_and_starts_no_other(
    arena_runs: ArenaRuns, tmp_path: Path
) -> None:
    file = tmp_path / "t.toml"
    file.write_text(FILE)
    db = tmp_path / "log.db"
    tournament_id = new_match_id("tour")
    run = arena_runs.start(
        db,
        [*OPSARENA, "tournament", "run", str(file), "--id", tournament_id, "--db", str(db),
         "--quiet", "--parallel", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            assert time.monotonic() < deadline, "two matches never ran at once"
            assert run.poll() is None, run.communicate()
            record = read_tournament(db, tournament_id)
            playing = [] if record is None else [
                s.attempts[-1].match_id for s in record.slots if s.state == "playing"
            ]  # fmt: skip
            if len(playing) == 2 and all("match_started" in match_events(db, m) for m in playing):
                break
            time.sleep(0.2)
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=180)
        assert run.returncode == 2, stderr
        assert f"tournament {tournament_id} stopped by SIGTERM" in stderr
        stopped = read_tournament(db, tournament_id)
        assert stopped is not None and stopped.state == "running"
        assert [s.state for s in stopped.slots] == ["void", "void", "pending"]
        for match_id in playing:
            types = match_events(db, match_id)
            assert types[-1] == "match_closed"
            assert podman_names(match_id) == []

        resumed = subprocess.run(
            [*OPSARENA, "tournament", "resume", tournament_id, "--db", str(db), "--quiet"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        final = read_tournament(db, tournament_id)
        assert final is not None and final.state == "finished"
        assert [s.state for s in final.slots] == ["counted"] * 3
        assert [len(s.attempts) for s in final.slots] == [2, 2, 1]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(30)
        for match_id in (f"{tournament_id}-{n}{r}" for n in (1, 2, 3) for r in ("", "r1")):
            for name in podman_names(match_id):
                subprocess.run(["podman", "rm", "-f", name], check=False, capture_output=True)
