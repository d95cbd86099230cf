"""The match page in a real browser (Debian's chromium driven by Playwright) while a real
match runs in another process: a milestone chip turns passed without a reload.

The territory `gated` is a command agent that tells the test its match id, then waits for
the test's go-ahead before deploying, so the page is certainly open (and the chip
certainly not passed) before the milestone can pass. The screenshot goes to artifacts/.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agents.records_service import APP, UNIT
from tests.browser import ARTIFACTS, WAIT_S, chromium, wait_for
from tests.conftest import ArenaRuns

pytestmark = pytest.mark.hosts

GATED = """\
import os, pathlib, shlex, subprocess, sys, time

work = pathlib.Path(sys.argv[1])  # read-only in the agent's sandbox
deadline = time.monotonic() + 120
while not (work / "go").exists():
    if time.monotonic() > deadline:
        sys.exit("no go-ahead from the test")
    time.sleep(0.1)
put = shlex.split(os.environ["OPSARENA_PUT"])
run = shlex.split(os.environ["OPSARENA_EXEC"])
subprocess.run([*put, str(work / "app.py"), "/opt/records/app.py"], check=True)
unit = "/etc/systemd/system/builder-app.service"  # the unit the challenge restarts
subprocess.run([*put, str(work / "records.service"), unit], check=True)
subprocess.run([*run, "systemctl daemon-reload && systemctl enable --now builder-app"], check=True)
print("deployed the records service, enabled", flush=True)
time.sleep(120)  # stay in the match until the referee finds the service durable
"""


def _started(db: Path) -> str:
    """The id of the match that started in `db`, or "" while none has."""
    if not db.exists():
        return ""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        try:
            row = conn.execute(
                "SELECT match_id FROM events WHERE type = 'match_started'"
            ).fetchone()
        except sqlite3.OperationalError:
            return ""
    return str(row[0]) if row else ""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "opsarena.cli.main", *args]


def test_chip_turns_passed_live(
    opsarena_serve: tuple[str, Path], arena_runs: ArenaRuns, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    executable = chromium()
    url, db = opsarena_serve
    work = tmp_path / "gated"
    work.mkdir(mode=0o755)
    work.chmod(0o755)  # the confined agent runs as an unprivileged user
    (work / "gated.py").write_text(GATED)
    (work / "app.py").write_text(APP)
    (work / "records.service").write_text(UNIT)
    gated = f"command:/usr/bin/python3 {work / 'gated.py'} {work}"
    match = arena_runs.start(
        db,
        _cli(
            "run",
            "--quiet",
            "--db",
            str(db),
            "--time-limit",
            "60",
            "--builder",
            f"gated={gated}",
            "--builder",
            "in-memory=scripted:in-memory",
            "--builder",
            "idle=scripted:idle",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: _started(db) or match.poll() is not None, "the match")
        assert match.poll() is None, match.communicate()[0]
        match_id = _started(db)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(executable))
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/matches/{match_id}")
            chip = page.locator('[data-territory="gated"] .chip[data-milestone="service-up"]')
            # The referee has judged the empty host: the chip says failed.
            expect(chip).to_have_attribute("data-state", "failed", timeout=WAIT_S * 1000)
            page.evaluate("window.notReloaded = true")
            (work / "go").touch()
            expect(chip).to_have_attribute("data-state", "passed", timeout=WAIT_S * 1000)
            assert page.evaluate("window.notReloaded") is True
            # The match goes on to its end on the same page: winner, final record.
            expect(page.locator("#live")).to_have_text(
                "match closed: final record", timeout=WAIT_S * 1000
            )
            expect(page.locator("#winner")).to_contain_text("gated")
            expect(page.locator("#finish-reason")).to_contain_text("first durable deployment")
            chips = page.locator('[data-territory="gated"] .chip')
            assert chips.evaluate_all("cs => cs.map(c => c.dataset.state)") == ["passed"] * 4
            reproduce = page.locator('.failure[data-territory="idle"] code.reproduce')
            expect(reproduce).to_contain_text("curl")
            idle_failure = page.locator('.failure[data-territory="idle"]')
            expect(idle_failure).to_have_attribute("data-resolved", "false")
            expect(idle_failure.locator(".reason")).to_contain_text("current failure: ")
            # gated failed service-up before its go-ahead; that failure is history now.
            gated_failure = page.locator('.failure[data-territory="gated"]')
            expect(gated_failure).to_have_attribute("data-resolved", "true")
            expect(gated_failure.locator(".reason")).to_contain_text("since passed")
            expect(page.locator('[data-agent="gated"] .entry[data-kind="exec"]')).not_to_have_count(
                0
            )
            expect(page.locator('li[data-type="fault_injected"]')).not_to_have_count(0)
            assert page.evaluate("window.notReloaded") is True
            # No absent field printed as such (the summary once said "nullnull").
            assert not re.search(r"\b(null|undefined|NaN)\b", page.locator("body").inner_text())
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "match-page.png"), full_page=True)
            browser.close()
        output, _ = match.communicate(timeout=WAIT_S)
        assert match.returncode == 0, output
    finally:
        if match.poll() is None:
            match.terminate()
            match.wait(60)
