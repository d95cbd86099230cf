"""`GET /api/matches/M/events` pages by bytes as well as by count: a log of huge events
(a competitor's control characters, six bytes each as JSON) costs one request a page's
worth of memory, not the log's, and the `X-Next-After` header walks the rest."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from opsarena.match.events import AgentTranscript, MatchCreated, MilestoneSpec, TerritorySpec
from opsarena.store import SqliteEventStore
from opsarena.web import ScoreboardServer
from opsarena.web.app import EVENTS_BYTES

MATCH = "20261205-010000-beef"
EVENTS = 48
COMMAND = "\x01" * 150_000
"""As JSON, 900 000 bytes: close to the largest event the log takes."""


@pytest.fixture(scope="module")
def flooded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A scoreboard serving a log whose match holds `EVENTS` events of ~900 KB."""
    db: Path = tmp_path_factory.mktemp("paging") / "log.db"
    created = MatchCreated(
        match_id=MATCH,
        challenge="durable-records",
        challenge_title="Durable records",
        seed_commitment="0" * 64,
        finish_mode="all",
        time_limit_s=60,
        drain_s=1,
        milestones=[MilestoneSpec(id="service-up", points=10)],
        territories={"a": TerritorySpec(agent="a", model="m", kind="command")},
    )
    with SqliteEventStore(db) as store:
        store.append_blocking(MATCH, created.event_type, created.model_dump(mode="json"), 0)
        for _ in range(EVENTS - 1):
            entry = AgentTranscript(agent="a", entry={"kind": "exec", "command": COMMAND})
            store.append_blocking(MATCH, entry.event_type, entry.model_dump(mode="json"), 1)
    server = ScoreboardServer(db, port=0)
    url = server.start()
    try:
        yield f"{url}/api/matches/{MATCH}/events"
    finally:
        server.stop()


def test_one_request_holds_a_page_not_the_log(flooded: str) -> None:
    log_bytes = (EVENTS - 1) * 900_000
    tracemalloc.start()
    try:
        answer = httpx.get(flooded, timeout=60)  # the default limit: 1000 events
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer.status_code == 200
    page = answer.json()
    assert [event["seq"] for event in page] == list(range(1, len(page) + 1))
    assert len(answer.content) <= EVENTS_BYTES + 2 * 900_000, len(answer.content)
    assert answer.headers["X-Next-After"] == str(page[-1]["seq"])
    # What serving the page took (all threads: the server's and this one's copy of the
    # answer) is a small multiple of a page, far below the log it pages through.
    assert peak < log_bytes / 2, (peak, log_bytes)
    print(f"peak {peak} bytes for a page of {len(answer.content)}, log {log_bytes}")


def test_the_next_header_walks_every_event_once(flooded: str) -> None:
    seqs: list[int] = []
    after, pages = 0, 0
    while True:
        answer = httpx.get(flooded, params={"after": after, "max_bytes": 2_000_000}, timeout=60)
        assert answer.status_code == 200
        page = answer.json()
        assert page, "a page is never empty before the end"
        assert len(page) <= 3, "at most 2 MB: two ~0.9 MB events (and match_created)"
        seqs += [event["seq"] for event in page]
        pages += 1
        if "X-Next-After" not in answer.headers:
            assert 'rel="next"' not in answer.headers.get("Link", "")
            break
        assert f"after={page[-1]['seq']}" in answer.headers["Link"]
        after = int(answer.headers["X-Next-After"])
    assert seqs == list(range(1, EVENTS + 1)) and pages > 1


def test_a_byte_cap_smaller_than_one_event_still_returns_it(flooded: str) -> None:
    answer = httpx.get(flooded, params={"after": 3, "max_bytes": 1}, timeout=60)
    assert [event["seq"] for event in answer.json()] == [4]
    for bad in (0, 10**9):
        assert httpx.get(flooded, params={"max_bytes": bad}, timeout=60).status_code == 422
