"""The example tournament on real hosts: killed with SIGKILL mid-match, resumed, ranked.

`examples/tournament-scripted.toml` (every scripted builder, durable-records, 5 trials, 2
matches at once) runs as `opsarena tournament run` in a process of its own. Once one match
has ended and another is under way the process is killed; `opsarena tournament resume`
finishes it. Then: every slot has exactly one counted match, a match that ended before the
kill was not touched again, no host is left, and the leaderboard puts reference (and
webdav) above every flawed builder with non-overlapping 95 % intervals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsarena.tournament.record import TournamentRecord
from tests.conftest import ArenaRuns, new_match_id, podman_names
from tests.tournament.logs import match_events, read_tournament

pytestmark = pytest.mark.hosts

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tournament-scripted.toml"
FLAWED = ("in-memory", "volatile", "not-enabled", "wrong-health", "idle")
CORRECT = ("reference", "webdav")


def wait_until_mid_tournament(
    db: Path, tournament_id: str, process: subprocess.Popen[bytes], timeout: float = 400
) -> TournamentRecord:
    """The record once a match has ended and another is past its start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the tournament ended before it could be killed"
        record = read_tournament(db, tournament_id)
        if record is not None and record.summary_counts()["counted"] >= 1:
            for slot in record.slots:
                if slot.state == "playing" and "match_started" in match_events(
                    db, slot.attempts[-1].match_id
                ):
                    return record
        time.sleep(0.2)
    raise AssertionError("no point with one match ended and another running")


def test_the_example_tournament_survives_a_kill_and_ranks_the_flawed_below(
    arena_runs: ArenaRuns,
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    tournament_id = new_match_id("tour")
    run = arena_runs.start(
        db,
        [*OPSARENA, "tournament", "run", str(EXAMPLE), "--id", tournament_id, "--db", str(db),
         "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    match_ids: set[str] = set()
    try:
        before = wait_until_mid_tournament(db, tournament_id, run)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(30)
        ended_before = {
            a.match_id: match_events(db, a.match_id)
            for s in before.slots
            for a in s.attempts
            if a.ended
        }
        after_kill = read_tournament(db, tournament_id)
        assert after_kill is not None and after_kill.state == "running"
        cut_off = [s.attempts[-1].match_id for s in after_kill.slots if s.state == "playing"]
        assert cut_off, "the kill found no match in flight"
        at_kill = {match_id: match_events(db, match_id) for match_id in cut_off}

        resumed = subprocess.run(
            [*OPSARENA, "tournament", "resume", tournament_id, "--db", str(db), "--quiet"],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        final = read_tournament(db, tournament_id)
        assert final is not None
        match_ids = {a.match_id for s in final.slots for a in s.attempts}
        assert final.state == "finished"
        assert final.runs == 2
        assert len(final.slots) == 5 * len({s.challenge for s in final.slots})  # 5 trials each
        assert all(s.state == "counted" for s in final.slots), final.summary_counts()
        # Each slot counts once; a match that ended before the kill was not played again.
        assert len(final.counted_matches()) == len(set(final.counted_matches())) == len(final.slots)
        for match_id, types in ended_before.items():
            assert match_events(db, match_id) == types, f"{match_id} changed after it closed"
        # A match cut off was taken up by its own resume (match_resumed), never restarted;
        # one that had closed just before the kill (its tournament had not yet noted it)
        # is only recorded, never touched again.
        for match_id in cut_off:
            types = match_events(db, match_id)
            assert types.count("match_created") <= 1
            if at_kill[match_id][-1:] == ["match_closed"]:
                assert types == at_kill[match_id], f"{match_id} changed after it closed"
            elif types:
                assert "match_resumed" in types, types
                assert types[-1] == "match_closed"

        board = subprocess.run(
            [*OPSARENA, "leaderboard", "--tournament", tournament_id, "--db", str(db), "--json"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows = json.loads(board.stdout)
        order = [row["competitor"] for row in rows]
        by_name = {row["competitor"]: row for row in rows}
        assert set(order) == set(CORRECT + FLAWED)
        for good in CORRECT:
            assert by_name[good]["durable_rate"] == 1.0, by_name[good]
            for bad in FLAWED:
                assert order.index(good) < order.index(bad), order
                assert by_name[good]["durable_rate_ci"][0] > by_name[bad]["durable_rate_ci"][1]
                assert by_name[good]["ordinal"] > by_name[bad]["ordinal"]
        for bad in FLAWED:
            assert by_name[bad]["durable_rate"] == 0.0
            assert by_name[bad]["cost_per_durable_usd"] is None
        assert by_name["reference"]["cost_per_durable_usd"] == 0.0
        assert by_name["reference"]["matches"] == len(final.slots)

        plain = subprocess.run(
            [*OPSARENA, "leaderboard", "--tournament", tournament_id, "--db", str(db)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert "shuffled match orders agree within their sigma" in plain.stdout

        csv_out = subprocess.run(
            [*OPSARENA, "leaderboard", "--tournament", tournament_id, "--db", str(db), "--csv"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        lines = csv_out.stdout.splitlines()
        assert lines[0].startswith("competitor,matches,durable,durable_rate,")
        assert [line.split(",")[0] for line in lines[1:]] == order

        report = tmp_path / "report.html"
        subprocess.run(
            [*OPSARENA, "tournament", "report", tournament_id, "--html", str(report),
             "--db", str(db)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        html = report.read_text()
        # Nothing to fetch: no served path, no remote script, style, image or font.
        assert "/static/" not in html
        for fetching in ('src="http', "src='http", 'href="http', "url(http", "@import"):
            assert fetching not in html, fetching
        assert '"competitor":"reference"' in html
        again = subprocess.run(
            [*OPSARENA, "tournament", "resume", tournament_id, "--db", str(db)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert again.returncode == 2
        assert "finished already" in again.stderr
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        for match_id in match_ids or {f"{tournament_id}-{n}" for n in range(1, 12)}:
            left = podman_names(match_id)
            if left:
                subprocess.run(["podman", "rm", "-f", *left], check=False, capture_output=True)
    for match_id in match_ids:
        assert podman_names(match_id) == [], f"hosts of {match_id} left behind"
