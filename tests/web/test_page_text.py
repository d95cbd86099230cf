"""What the pages print for absent fields, and the cost plot's labels, in a real browser.

A field a record or an event does not have is null (or missing) in the JSON: the match
page once printed `nullnull` under its header (two absent lists handed to the DOM's
`replaceChildren`, which writes null as text). Here the match list, a finished and a
running match (with transcript entries missing every optional field) and a tournament
report are opened in Debian's chromium: no text and no tooltip says `null`, `undefined`
or `NaN`. The report's cost plot once drew the names of competitors whose points
coincide (every scripted builder at $0) on top of each other: every label's box must be
clear of every other's, and inside the plot.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opsarena.ratings.leaderboard import Entry, MatchOutcome, leaderboard
from opsarena.tournament import fold_tournament
from opsarena.web.tournament import report_html
from tests.browser import chromium
from tests.match.simulated import Plan, demo_events, simulate
from tests.tournament.logs import created, ended, log, started
from tests.web.conftest import serving

ABSENT = re.compile(r"\b(null|undefined|NaN)\b")
SHOWN = """() => [...document.querySelectorAll('body, body *')]
  .filter((node) => !['SCRIPT', 'STYLE'].includes(node.tagName)).flatMap((node) => [
  ...[...node.childNodes].filter((c) => c.nodeType === Node.TEXT_NODE).map((c) => c.data),
  ...[...node.attributes].filter((a) => a.name === 'title' || a.name === 'aria-label')
    .map((a) => a.value),
  ...(node.tagName === 'title' ? [node.textContent] : []),
])"""
"""Every text node (but scripts') and tooltip of the page."""


def sparse_transcript(match_id: str, agent: str) -> list[dict[str, Any]]:
    """A running match whose agent's transcript entries carry only their kind."""
    events = simulate(match_id, {"solo": Plan(passes=1)})
    events = events[: next(i for i, e in enumerate(events) if e["type"] == "match_finished")]
    for kind in ("tool_call", "exec", "put", "retry", "tool_result", "assistant", "mystery"):
        events.append({**events[-1], "seq": len(events) + 1, "type": "agent_transcript",
                       "data": {"agent": agent, "entry": {"kind": kind}}})  # fmt: skip
    return events


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    events = demo_events("done1") + sparse_transcript("live1", "solo-agent")
    with serving(tmp_path / "pages.db", events) as url:
        yield url


def absent_words(page: Any) -> list[str]:
    return [text for text in page.evaluate(SHOWN) if ABSENT.search(text)]


def test_no_page_prints_null_or_undefined_for_an_absent_field(served: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium()))
        page = browser.new_page()
        page.goto(f"{served}/")
        expect(page.locator("#rows tr")).to_have_count(2, timeout=30_000)
        assert absent_words(page) == []
        page.goto(f"{served}/matches/done1")
        expect(page.locator("#live")).to_have_text("match closed: final record", timeout=30_000)
        expect(page.locator("#match-state")).to_have_text("finished")
        assert absent_words(page) == []
        assert "null" not in page.locator("#summary").inner_text()
        page.goto(f"{served}/matches/live1")
        expect(page.locator("#match-state")).to_have_text("running", timeout=30_000)
        entries = page.locator('.transcript[data-agent="solo-agent"] .entry[data-kind]')
        expect(entries).to_have_count(7, timeout=30_000)
        assert absent_words(page) == []
        browser.close()


def entry(name: str, durable: bool, cost_microusd: int) -> Entry:
    return Entry(name, 5000 if durable else None, 100 if durable else 10, 5000, 100, 50,
                 cost_microusd)  # fmt: skip


# Three builders durable every time at $0 (one point), two at nearly the same rate and
# cost, one alone, one never durable (no cost point).
COMPETITORS = {
    "reference": (4, 0), "reference-twin": (4, 0), "a-much-longer-builder-name": (4, 0),
    "costly": (3, 1500), "costly-too": (3, 1510), "half": (2, 400), "idle": (0, 0),
}  # fmt: skip


def report(path: Path) -> Path:
    names = list(COMPETITORS)
    outcomes = [
        MatchOutcome(f"tx-{i}", "durable-records", tuple(
            entry(name, i < durable, cost) for name, (durable, cost) in COMPETITORS.items()))
        for i in range(4)
    ]  # fmt: skip
    board = leaderboard(outcomes, bootstrap_samples=20)
    plan = created()
    plan["competitors"] = dict.fromkeys(names, "scripted:reference")
    for slot in plan["slots"]:
        slot["group"] = names
    events = [("tournament_created", plan), ("tournament_started", {"parallel": 1})]
    for slot in (1, 2):
        events += [started(slot, 1, f"tx-{slot}"), ended(slot, 1, f"tx-{slot}", True)]
    record = fold_tournament(log(*events, ("tournament_finished", {})))
    path.write_text(report_html(record, board))
    return path


LABEL_BOXES = """(names) => [...document.querySelectorAll('#plot-cost svg text')]
  .filter((t) => names.includes(t.textContent))
  .map((t) => { const b = t.getBoundingClientRect();
                return [t.textContent, b.left, b.top, b.right, b.bottom]; })"""


def test_the_cost_plot_labels_of_coinciding_points_do_not_overlap(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    shared = report(tmp_path / "report.html")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium()))
        page = browser.new_page(viewport={"width": 1200, "height": 1400})
        page.goto(shared.as_uri())
        expect(page.locator("#state")).to_have_text("finished")
        boxes = page.evaluate(LABEL_BOXES, list(COMPETITORS))
        plot = page.locator("#plot-cost svg").bounding_box()
        assert absent_words(page) == []
        browser.close()
    assert sorted(b[0] for b in boxes) == sorted(n for n, (d, _) in COMPETITORS.items() if d)
    assert plot is not None
    for name, left, top, right, bottom in boxes:
        assert plot["x"] <= left and right <= plot["x"] + plot["width"], name
        assert plot["y"] <= top and bottom <= plot["y"] + plot["height"], name
    for i, (a, *box_a) in enumerate(boxes):
        for b, *box_b in boxes[i + 1 :]:
            apart = (
                box_a[2] <= box_b[0] or box_b[2] <= box_a[0]
                or box_a[3] <= box_b[1] or box_b[3] <= box_a[1]
            )  # fmt: skip
            assert apart, f"the labels {a} {box_a} and {b} {box_b} overlap"
