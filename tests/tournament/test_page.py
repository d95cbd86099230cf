"""The tournament page in a real browser while a real tournament runs in another process,
and the shared report opened from disk with every network request refused."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.browser import ARTIFACTS, WAIT_S, chromium, wait_for
from tests.conftest import ArenaRuns, new_match_id, podman_names

pytestmark = pytest.mark.hosts

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]
SMALL = """
name = "page test"
challenges = ["durable-records"]
trials = 3
parallel = 1
[match]
time_limit_s = 90
drain_s = 1
[territories.reference]
agent = "scripted:reference"
[territories.in-memory]
agent = "scripted:in-memory"
[territories.idle]
agent = "scripted:idle"
"""


def test_the_page_follows_a_running_tournament_and_the_report_needs_no_network(
    opsarena_serve: tuple[str, Path], arena_runs: ArenaRuns, tmp_path: Path
) -> None:
    from playwright.sync_api import Route, expect, sync_playwright

    executable = chromium()
    url, db = opsarena_serve
    file = tmp_path / "small.toml"
    file.write_text(SMALL)
    tournament_id = new_match_id("tour")
    missing = httpx.get(f"{url}/api/tournaments/{tournament_id}", timeout=10)
    assert missing.status_code == 404
    run = arena_runs.start(
        db,
        [*OPSARENA, "tournament", "run", str(file), "--id", tournament_id, "--db", str(db),
         "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(
            lambda: (
                httpx.get(f"{url}/api/tournaments/{tournament_id}", timeout=10).status_code == 200
                or run.poll() is not None
            ),
            "the tournament to start",
        )
        assert run.poll() is None, run.communicate()[0]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(executable))
            page = browser.new_page(viewport={"width": 1200, "height": 1400})
            page.goto(f"{url}/tournaments/{tournament_id}")
            expect(page.locator("#state")).to_have_text("running", timeout=WAIT_S * 1000)
            during = httpx.get(f"{url}/api/tournaments/{tournament_id}", timeout=10).json()
            if during["tournament"]["state"] == "running":  # the seed stays hidden until the end
                assert during["tournament"]["seed"] is None
                assert len(during["tournament"]["seed_commitment"]) == 64
            # ... also from the match routes, which would otherwise show its raw stream.
            for route in ("", "/events", "/stream"):
                raw = httpx.get(f"{url}/api/matches/tournament:{tournament_id}{route}", timeout=10)
                assert raw.status_code == 404, route
            page.evaluate("window.notReloaded = true")
            expect(page.locator("#state")).to_have_text("finished", timeout=3 * WAIT_S * 1000)
            expect(page.locator("#live")).to_have_text("finished")
            assert page.evaluate("window.notReloaded") is True
            expect(page.locator("#counted")).to_have_text("3 of 3 matches counted")
            rows = page.locator("#board tbody tr")
            assert rows.evaluate_all("rs => rs.map(r => r.dataset.competitor)")[0] == "reference"
            expect(page.locator("#plot-rate circle")).to_have_count(3)
            in_memory = page.locator('#per-challenge tr[data-competitor="in-memory"] .pass-hat')
            expect(in_memory).to_have_text("1: 0.00  2: 0.00  3: 0.00")
            reference = page.locator('#per-challenge tr[data-competitor="reference"] .pass-hat')
            expect(reference).to_have_text("1: 1.00  2: 1.00  3: 1.00")
            expect(page.locator("#plot-time circle")).to_have_count(3)  # reference, 3 trials
            after = httpx.get(f"{url}/api/tournaments/{tournament_id}", timeout=10).json()
            revealed = after["tournament"]
            assert (
                hashlib.sha256(bytes.fromhex(revealed["seed"])).hexdigest()
                == (revealed["seed_commitment"])
            )
            assert after["leaderboard"][0]["competitor"] == "reference"
            assert after["counts"] == {"pending": 0, "playing": 0, "counted": 3, "void": 0}
            assert after["order_check"]["agree"] is True
            assert after["running"] == []
            assert not re.search(r"\b(null|undefined|NaN)\b", page.locator("body").inner_text())
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "tournament-page.png"), full_page=True)

            report = tmp_path / "report.html"
            subprocess.run(
                [*OPSARENA, "tournament", "report", tournament_id, "--html", str(report),
                 "--db", str(db)],
                check=True, capture_output=True,
            )  # fmt: skip
            offline = browser.new_page()
            asked: list[str] = []

            def refuse(route: Route) -> None:
                asked.append(route.request.url)
                route.abort()

            offline.route("**/*", lambda route: route.continue_()
                          if route.request.url.startswith("file:") else refuse(route))  # fmt: skip
            offline.goto(report.as_uri())
            expect(offline.locator("#state")).to_have_text("finished")
            expect(offline.locator("#live")).to_have_text("report")
            expect(offline.locator("#board tbody tr")).to_have_count(3)
            expect(offline.locator("#plot-rate circle")).to_have_count(3)
            assert asked == []
            browser.close()
        output, _ = run.communicate(timeout=WAIT_S)
        assert run.returncode == 0, output
        # Not a terminal: one progress line per match that ended, the last one included.
        for slot in (1, 2, 3):
            assert f"slot {slot}/3 match {tournament_id}-{slot}: counted" in output, output
        assert "tournament " + tournament_id + " finished: 3 matches counted, 0 void" in output
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(30)
        for n in range(1, 7):
            for name in podman_names(f"{tournament_id}-{n}"):
                subprocess.run(["podman", "rm", "-f", name], check=False, capture_output=True)
