"""The scoreboard's JSON API and streams over real HTTP, against the log of a real match."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from opsarena.errors import StoreError
from opsarena.match.commitment import seed_commitment
from opsarena.match.fold import fold_events
from opsarena.store import SqliteEventStore, open_store
from tests.web.conftest import Played, opsarena
from tests.web.sse import messages

pytestmark = pytest.mark.hosts

TIMEOUT = httpx.Timeout(30.0)


def get(url: str, **params: object) -> httpx.Response:
    return httpx.get(url, params=params, timeout=TIMEOUT)  # type: ignore[arg-type]


def test_matches_list_has_the_finished_match(played: Played, scoreboard: str) -> None:
    answer = get(f"{scoreboard}/api/matches")
    assert answer.status_code == 200
    rows = {row["match_id"]: row for row in answer.json()}
    row = rows[played.match_id]
    assert row["challenge"] == "durable-records"
    assert row["state"] == "finished"
    assert row["winner"] == "reference"
    assert row["finish_reason"] == "first durable deployment"
    assert row["duration_ms"] > 0
    assert row["started_at"] and row["territories"] == 4 and row["error"] is None


def test_record_is_the_fold_that_opsarena_show_prints(played: Played, scoreboard: str) -> None:
    answer = get(f"{scoreboard}/api/matches/{played.match_id}")
    assert answer.status_code == 200
    shown = json.loads(opsarena("show", played.match_id, "--json", db=played.db).stdout)
    assert answer.json() == shown
    assert answer.json()["territories"]["reference"]["class"] == "builder"


def test_events_after_a_seq_and_paging(played: Played, scoreboard: str) -> None:
    url = f"{scoreboard}/api/matches/{played.match_id}/events"
    everything = get(url).json()
    assert [event["seq"] for event in everything] == list(range(1, len(everything) + 1))
    assert everything[0]["type"] == "match_created"
    assert everything[-1]["type"] == "match_closed"
    with open_store(played.db) as store:
        stored = store.read_blocking(played.match_id)  # type: ignore[attr-defined]
    assert everything == [event.to_json() for event in stored]
    page = get(url, after=10, limit=5).json()
    assert [event["seq"] for event in page] == [11, 12, 13, 14, 15]
    assert get(url, after=len(everything)).json() == []


@pytest.mark.parametrize(
    "params",
    [{"after": -1}, {"after": "x"}, {"after": 2**60}, {"limit": 0}, {"limit": 10**6}],
)
def test_bad_query_values_are_422(
    played: Played, scoreboard: str, params: dict[str, object]
) -> None:
    answer = get(f"{scoreboard}/api/matches/{played.match_id}/events", **params)
    assert answer.status_code == 422
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["detail"][0]["loc"][0] == "query"


@pytest.mark.parametrize("suffix", ["", "/events", "/stream"])
def test_unknown_match_is_404_json(scoreboard: str, suffix: str) -> None:
    answer = get(f"{scoreboard}/api/matches/no-such-match{suffix}")
    assert answer.status_code == 404
    assert answer.json() == {"detail": "no match 'no-such-match' in this event log"}


def test_stream_of_a_finished_match_replays_it_and_closes(played: Played, scoreboard: str) -> None:
    record = get(f"{scoreboard}/api/matches/{played.match_id}").json()
    url = f"{scoreboard}/api/matches/{played.match_id}/stream"
    with httpx.stream("GET", url, params={"after": 5}, timeout=TIMEOUT) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        got = list(messages(response))  # ends: the server closes the stream after `end`
    events = [m for m in got if m.event == "event"]
    assert [m.json()["seq"] for m in events] == list(range(6, record["last_sequence"] + 1))
    assert all(m.id == str(m.json()["seq"]) for m in events)
    assert [m.event for m in got[-2:]] == ["record", "end"]
    assert got[-2].json() == record
    assert got[-2].id == str(record["last_sequence"])


def test_stream_resumes_after_last_event_id(played: Played, scoreboard: str) -> None:
    last = get(f"{scoreboard}/api/matches/{played.match_id}").json()["last_sequence"]
    url = f"{scoreboard}/api/matches/{played.match_id}/stream"
    headers = {"Last-Event-ID": str(last - 5)}
    with httpx.stream("GET", url, headers=headers, timeout=TIMEOUT) as response:
        seqs = [m.json()["seq"] for m in messages(response) if m.event == "event"]
    assert seqs == list(range(last - 4, last + 1))


def test_a_match_written_by_another_writer_streams_live(played: Played, scoreboard: str) -> None:
    """Copy the real match's events under a new id while a stream and the list watch it:
    both see each event the other writer appends, and the match stream ends at the close."""
    with open_store(played.db) as source:
        events = source.read_blocking(played.match_id)  # type: ignore[attr-defined]
    copy_id = f"{played.match_id}-copy"
    writer = open_store(played.db)
    revealed = events[-1].data  # match_closed: the seed and nonce, revealed

    def append(index: int) -> None:
        event = events[index]
        data = dict(event.data)
        if event.type == "match_created":
            data["match_id"] = copy_id
            # The commitment names its match: a copy needs its own, or the reveal fails.
            data["seed_commitment"] = seed_commitment(
                copy_id, bytes.fromhex(revealed["seed_nonce"]), bytes.fromhex(revealed["seed"])
            )
        writer.append_blocking(  # type: ignore[attr-defined]
            copy_id, event.type, data, event.t_ms, wall=event.wall
        )

    try:
        append(0)
        url = f"{scoreboard}/api/matches/{copy_id}/stream"
        with httpx.stream("GET", url, timeout=TIMEOUT) as response:
            stream = messages(response)
            first = [next(stream), next(stream)]
            assert [m.event for m in first] == ["event", "record"]
            assert first[1].json()["match_state"] == "created"
            seen = 1
            # Ten events at a time: each batch must reach the stream before the next.
            for start in range(1, len(events), 10):
                stop = min(start + 10, len(events))
                for index in range(start, stop):
                    append(index)
                while seen < stop:
                    message = next(stream)
                    if message.event == "event":
                        assert message.json()["seq"] == seen + 1
                        seen += 1
            rest = [m.event for m in stream]
        assert seen == len(events)
        assert rest[-2:] == ["record", "end"]
        listed = {row["match_id"]: row for row in get(f"{scoreboard}/api/matches").json()}
        assert listed[copy_id]["state"] == "finished"
        expected = fold_events(events).model_dump(mode="json", by_alias=True)
        got = get(f"{scoreboard}/api/matches/{copy_id}").json()
        assert isinstance(got.get("seed_commitment"), str)  # the copy's own commitment
        assert got == {**expected, "match_id": copy_id, "seed_commitment": got["seed_commitment"]}
        assert got["seed_commitment"] != expected["seed_commitment"]
    finally:
        writer.close()


def test_matches_stream_sends_the_list(played: Played, scoreboard: str) -> None:
    with httpx.stream("GET", f"{scoreboard}/api/stream", timeout=TIMEOUT) as response:
        first = next(messages(response))
    assert first.event == "matches"
    assert played.match_id in {row["match_id"] for row in first.json()}


def test_openapi_schema_lists_the_api(scoreboard: str) -> None:
    schema = get(f"{scoreboard}/openapi.json").json()
    assert set(schema["paths"]) == {
        "/api/matches",
        "/api/matches/{match_id}",
        "/api/matches/{match_id}/events",
        "/api/matches/{match_id}/stream",
        "/api/stream",
        "/api/tournaments/{tournament_id}",
        "/api/tournaments/{tournament_id}/stream",
    }
    stream = schema["paths"]["/api/matches/{match_id}/stream"]["get"]["responses"]["200"]
    assert "text/event-stream" in stream["content"]


def test_pages_and_static_files_are_served(played: Played, scoreboard: str) -> None:
    assert "matches" in get(f"{scoreboard}/").text
    page = get(f"{scoreboard}/matches/{played.match_id}")
    assert page.status_code == 200 and "/static/match.js" in page.text
    assert get(f"{scoreboard}/static/match.js").status_code == 200


def test_the_server_never_writes_the_log(played: Played, scoreboard: str) -> None:
    before = hashlib.sha256(played.db.read_bytes()).hexdigest()
    for path in ("/api/matches", f"/api/matches/{played.match_id}", "/api/matches/x"):
        get(f"{scoreboard}{path}")
    assert hashlib.sha256(played.db.read_bytes()).hexdigest() == before
    store = SqliteEventStore(played.db, read_only=True)
    try:
        with pytest.raises(StoreError, match="cannot append"):
            store.append_blocking("m", "match_closed", {}, 0)
    finally:
        store.close()
