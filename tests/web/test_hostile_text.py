"""Competitor text is untrusted HTML: the page and the API show it as text, never run it.

A running match whose every competitor-controlled string is hostile (the territory and
agent names a competitors file gives, agent output, transcript entries, failure details)
is served over real HTTP and opened in a real browser (Debian's chromium via Playwright).
The page must show the strings literally and run none of them, and the running match's
seed must not be on the page or in the API (its commitment is).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opsarena.match.commitment import seed_commitment
from tests.browser import chromium
from tests.match.simulated import Plan, simulate
from tests.web.conftest import serving

SCRIPT = "<script>window.__pwned = 'script'</script>"
IMG = "<img src=x onerror=\"window.__pwned='img'\">"
HOSTILE = f"{SCRIPT}{IMG}</pre></div><b>bold</b>"
TERRITORY = f"t{IMG}"
SEED = bytes.fromhex("5eed" * 8)
NONCE = bytes(16)
MATCH = "hostile1"


def hostile_log() -> list[dict[str, Any]]:
    events = simulate(MATCH, {TERRITORY: Plan(passes=1), "ref": Plan(passes=2)})
    cut = next(i for i, e in enumerate(events) if e["type"] == "match_finished")
    events = events[:cut]  # still running: the seed must stay hidden
    created = events[0]["data"]
    del created["seed"]
    created["seed_commitment"] = seed_commitment(MATCH, NONCE, SEED)
    for event in events:
        data = event["data"]
        if event["type"] == "agent_output":
            data["text"] = HOSTILE
        if data.get("failure_detail"):
            data["failure_detail"] = HOSTILE
        if data.get("failure_reason"):
            data["failure_reason"] = HOSTILE
    agent = f"{TERRITORY}-agent"
    entry = {"kind": "exec", "command": HOSTILE, "exit_code": 0, "stdout": HOSTILE}
    events.append({**events[-1], "seq": len(events) + 1, "type": "agent_transcript",
                   "data": {"agent": agent, "entry": entry}})  # fmt: skip
    tampered = {"first_seq": 9, "rows": 10, "detail": HOSTILE, "kind": "quarantined"}
    events.append({**events[-1], "seq": len(events) + 1, "type": "log_tampered",
                   "data": tampered})  # fmt: skip
    return events


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    with serving(tmp_path / "hostile.db", hostile_log()) as url:
        yield url


def test_the_api_serves_competitor_text_as_json_and_the_commitment_not_the_seed(
    served: str,
) -> None:
    with urllib.request.urlopen(f"{served}/api/matches/{MATCH}", timeout=10) as answer:
        assert answer.headers["content-type"] == "application/json"
        body = answer.read().decode()
    record = json.loads(body)
    assert record["match_state"] == "running" and TERRITORY in record["territories"]
    assert record["seed"] is None
    assert record["seed_commitment"] == seed_commitment(MATCH, NONCE, SEED)
    with urllib.request.urlopen(f"{served}/api/matches/{MATCH}/events", timeout=10) as answer:
        events = answer.read().decode()
    assert SEED.hex() not in body + events
    assert HOSTILE in {e["data"].get("text") for e in json.loads(events)}


def test_the_page_shows_hostile_text_literally_and_runs_none_of_it(served: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    executable = chromium()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(executable))
        page = browser.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: dialogs.append(dialog.message))
        page.goto(f"{served}/matches/{MATCH}")
        expect(page.locator("#match-state")).to_have_text("running", timeout=30_000)
        transcript = page.locator(".transcript .entry")
        expect(transcript.last).to_contain_text("window.__pwned", timeout=30_000)
        text = page.locator("body").inner_text()
        assert SCRIPT in text and IMG in text and TERRITORY in text
        assert page.evaluate("window.__pwned") is None and dialogs == []
        # Nothing from the match became markup: no image, no inline script, not its <b>.
        assert page.evaluate("document.querySelectorAll('img, script:not([src])').length") == 0
        bold = "[...document.querySelectorAll('b')].filter(b => b.textContent === 'bold').length"
        assert page.evaluate(bold) == 0
        expect(page.locator("#tampered")).to_have_text("forged log rows set aside: seq 9: 10 rows")
        seed_line = page.locator("#seed").inner_text()
        assert seed_commitment(MATCH, NONCE, SEED) in seed_line
        assert SEED.hex() not in page.content()
        browser.close()
