"""What only the PostgreSQL event log does: schema ownership, migration, URLs, `opsarena db`,
and followers (scoreboard streams, tournament progress) woken by LISTEN/NOTIFY."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from rich.console import Console

from opsarena.cli import tournament as cli_tournament
from opsarena.errors import LogTamperedError, StoreError
from opsarena.store import SqliteEventStore, chain_problems, open_store
from opsarena.store.postgres import SCHEMA_VERSION, PostgresEventStore, follow_safety_poll_s
from opsarena.web.server import ScoreboardServer
from opsarena.web.tournament import tournament_messages
from tests.match.simulated import Plan, simulate
from tests.pg import new_database, postgres_for_tests
from tests.tournament.logs import created, ended, started
from tests.web.sse import messages


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with postgres_for_tests() as url:
        yield url


@pytest.fixture
def url(server: str) -> str:
    return new_database(server)


def opsarena(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", *args],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_the_schema_is_created_once_with_its_version(url: str) -> None:
    # Two stores opening a new database at the same moment: the advisory lock serialises them.
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            PostgresEventStore(url).close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version FROM opsarena_schema").fetchall() == [(SCHEMA_VERSION,)]


def test_a_database_of_another_application_is_refused_and_left_alone(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    with pytest.raises(StoreError, match="not an opsarena event log") as err:
        PostgresEventStore(url)
    assert "\n" not in str(err.value)
    with psycopg.connect(url) as conn:
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables "
                                             "WHERE schemaname = 'public'")}  # fmt: skip
    assert tables == {"notes"}


def test_a_newer_schema_is_refused(url: str) -> None:
    PostgresEventStore(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO opsarena_schema (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError, match="newer than this opsarena understands"):
        PostgresEventStore(url)


def test_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open the event log") as err:
        PostgresEventStore(f"postgresql:///x?host={tmp_path}&user=nobody&password=hunter2")
    assert "\n" not in str(err.value)
    assert "hunter2" not in str(err.value)


def test_a_row_written_behind_the_store_is_refused_then_quarantined(url: str) -> None:
    with open_store(url) as store:
        asyncio.run(store.append("m", "x", {}, 0))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO events VALUES ('m', 2, 'forged', 0, 'w', '{}', '', '')")
        with pytest.raises(LogTamperedError, match="seq 2 is taken") as err:
            asyncio.run(store.append("m", "y", {}, 1))
        assert "\n" not in str(err.value)
        assert [e.seq for e in asyncio.run(store.read("m"))] == [1]  # never the forged row
        audit = asyncio.run(store.audit("m"))
        assert (audit.last_seq, [e.seq for e in audit.events]) == (1, [1, 2])
        moved = asyncio.run(store.quarantine_tail("m", "test forger"))
        assert moved is not None and (moved.first_seq, moved.rows) == (2, 1)
        assert asyncio.run(store.append("m", "y", {}, 1)) == 2
        events = asyncio.run(store.read("m"))
        assert not chain_problems([e.link() for e in events])
        quarantined = asyncio.run(store.audit("m")).quarantined
        assert [(q.event.type, q.reason) for q in quarantined] == [("forged", "test forger")]


def test_an_edited_event_breaks_the_chain_and_the_next_append(url: str) -> None:
    with open_store(url) as store:
        for i in range(3):
            asyncio.run(store.append("m", "x", {"i": i}, i))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("""UPDATE events SET data = '{"i":99}' WHERE match_id = 'm' AND seq = 3""")
        with pytest.raises(LogTamperedError, match="seq 3"):
            asyncio.run(store.append("m", "y", {}, 9))
        problems = chain_problems([e.link() for e in asyncio.run(store.audit("m")).events])
        assert [p.seq for p in problems][:1] == [3]


def test_the_vault_is_a_table_of_the_database(url: str) -> None:
    with open_store(url) as store:
        vault = store.vault()
        assert vault.get("m1") is None
        vault.put("m1", {"seed": "ab", "nonce": "cd"})
        vault.put("m1", {"seed": "ef", "nonce": "01"})
        with open_store(url) as other:  # another machine sees it: resume works anywhere
            assert other.vault().get("m1") == {"seed": "ef", "nonce": "01"}
        vault.discard("m1")
        vault.discard("m1")
        assert vault.get("m1") is None
        with pytest.raises(ValueError):
            vault.put("../escape", {})


def test_db_migrate_and_copy_from_sqlite(url: str, tmp_path: Path) -> None:
    done = opsarena("db", "migrate", "--db", url)
    assert done.returncode == 0, done.stderr
    assert f"schema version {SCHEMA_VERSION}" in done.stdout

    source = tmp_path / "old.db"
    with SqliteEventStore(source) as old:
        for i in range(5):
            old.append_blocking("a", "x", {"i": i}, i * 10, wall=f"2026-01-01T00:00:0{i}.000Z")
        old.append_blocking("b", "y", {"k": "v"}, 7)
        want = {m: [e.to_json() for e in old.read_blocking(m)] for m in ("a", "b")}

    done = opsarena("db", "copy", str(source), url)
    assert done.returncode == 0, done.stderr
    assert "2 matches (6 events) copied" in done.stdout
    with open_store(url) as store:
        for match_id, events in want.items():
            assert [e.to_json() for e in asyncio.run(store.read(match_id))] == events
        assert asyncio.run(store.append("a", "next", {}, 99)) == 6  # the sequence goes on

    again = opsarena("db", "copy", str(source), url)
    assert again.returncode != 0  # match "a" now differs: one line, exit 2
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    assert "'a'" in again.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["db", "copy", "/nonexistent.db", "postgresql:///x"], "no SQLite event log"),
        (["db", "copy", "__SOURCE__", "/tmp/x.db"], "must be a PostgreSQL URL"),
    ],
)
def test_db_copy_bad_input(args: list[str], message: str, tmp_path: Path) -> None:
    source = tmp_path / "s.db"
    SqliteEventStore(source).close()
    done = opsarena(*[str(source) if a == "__SOURCE__" else a for a in args])
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_run_show_and_serve_read_postgres(url: str) -> None:
    with open_store(url) as store:
        asyncio.run(store.append("pgm", "x", {}, 0))
    shown = opsarena("events", "pgm", "--db", url)
    assert shown.returncode == 0, shown.stderr
    assert "x" in shown.stdout
    verified = opsarena("verify", "pgm", "--db", url)  # read-only, as from a file
    assert verified.returncode in (0, 1) and "pgm" in verified.stdout, verified.stderr
    server = ScoreboardServer(url, port=0)
    base = server.start()
    try:
        # A log that cannot be folded is one row with its `error`, never a failed list.
        listed = httpx.get(f"{base}/api/matches", timeout=30)
        assert listed.status_code == 200
        (row,) = listed.json()
        assert row["match_id"] == "pgm" and row["last_seq"] == 1 and row["state"] is None
        assert "unknown event type 'x'" in row["error"]
        events = httpx.get(f"{base}/api/matches/pgm/events", timeout=30)
        assert events.status_code == 200 and events.json()[0]["type"] == "x"
    finally:
        server.stop()


@pytest.fixture
def notified_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Followers read only when notified: the safety poll is pushed out of any test's
    reach, so whatever arrives within seconds came by LISTEN/NOTIFY."""
    monkeypatch.setenv("OPSARENA_FOLLOW_POLL_S", "120")


@pytest.mark.parametrize("value", ["soon", "0", "-1", "inf", "nan"])
def test_a_follow_poll_that_is_not_seconds_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("OPSARENA_FOLLOW_POLL_S", value)
    with pytest.raises(StoreError, match=r"^OPSARENA_FOLLOW_POLL_S=.* is not a number of seconds"):
        follow_safety_poll_s()
    monkeypatch.setenv("OPSARENA_FOLLOW_POLL_S", "0.5")
    assert follow_safety_poll_s() == 0.5


LIVE_S = 15.0
"""How soon a notified follower must see an append (far below the safety poll)."""


async def test_a_waiter_for_some_matches_wakes_at_their_appends_only(
    url: str, notified_only: None
) -> None:
    with open_store(url) as store, open_store(url) as other, open_store(url) as third:
        async with store.changes() as wake, third.changes() as third_wake:
            waiting = asyncio.create_task(wake({"a", "b"}, 60.0))
            witness = asyncio.create_task(third_wake("c", 60.0))
            await other.append("c", "x", {}, 0)
            await asyncio.wait_for(witness, LIVE_S)  # the notification for c went out
            assert not waiting.done()  # and another match's append did not wake this one
            await other.append("b", "x", {}, 0)
            await asyncio.wait_for(waiting, LIVE_S)


async def test_a_waiter_cancelled_as_its_notification_lands_is_cancelled(
    url: str, notified_only: None
) -> None:
    """A cancellation that lands in the same turn of the loop as a notification ends the
    waiter. Python 3.11's `asyncio.wait_for` returned the notification instead and
    dropped the cancellation: a match's `opsarena done` watcher, cancelled at the end of
    the match while its own last events were being notified, followed forever and the
    match never closed (two Ray tournaments lost in CI)."""
    with open_store(url) as store:
        for _ in range(3):
            async with store.changes() as wake:
                waiting = asyncio.create_task(wake("m", 60.0))
                await asyncio.sleep(0)  # one turn of the loop: it waits for a notification now
                assert not waiting.done()
                # What the LISTEN thread hands over, then the cancel, before it resumes.
                wake.__self__._deliver("m")  # type: ignore[attr-defined]
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting


def test_a_match_stream_over_postgres_delivers_each_new_event_live(
    url: str, notified_only: None
) -> None:
    log = simulate("pglive", {"t1": Plan(passes=4), "t2": Plan(passes=1)})
    with open_store(url) as writer:

        def append(index: int) -> None:
            event = log[index]
            writer.append_blocking(  # type: ignore[attr-defined]
                "pglive", event["type"], event["data"], event["t_ms"], wall=event["wall"]
            )

        for index in range(3):
            append(index)
        server = ScoreboardServer(url, port=0)
        base = server.start()
        try:
            stream_url = f"{base}/api/matches/pglive/stream"
            with httpx.stream("GET", stream_url, timeout=LIVE_S) as response:
                stream = messages(response)
                first = [next(stream).event for _ in range(4)]
                assert first == ["event", "event", "event", "record"]
                for index in (3, 4, 5):
                    appended = time.monotonic()
                    append(index)
                    message = next(stream)
                    assert (message.event, message.json()["seq"]) == ("event", index + 1)
                    assert time.monotonic() - appended < LIVE_S
                    assert next(stream).event == "record"
            listed = httpx.get(f"{base}/api/matches", timeout=30).json()
            assert [(r["match_id"], r["error"]) for r in listed] == [("pglive", None)]
        finally:
            server.stop()


TOURNAMENT = "tournament:tx"


def _tournament_event(store: Any, kind: str, data: dict[str, Any]) -> None:
    store.append_blocking(TOURNAMENT, kind, data, 0)


async def printed(out: io.StringIO, line: str) -> None:
    """Return once `line` is in `out` (LIVE_S of waiting fails the test)."""
    deadline = time.monotonic() + LIVE_S
    while line not in out.getvalue():
        assert time.monotonic() < deadline, out.getvalue()
        await asyncio.sleep(0.05)


async def test_tournament_progress_is_woken_by_the_log_not_a_timer(
    url: str, notified_only: None
) -> None:
    """On PostgreSQL the watcher's `POLL_S` is not used: with the safety poll pushed away,
    only the notification of the tournament's append can wake it in time."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with open_store(url) as store, open_store(url) as writer:
        _tournament_event(writer, "tournament_created", created())
        _tournament_event(writer, "tournament_started", {"parallel": 2})
        _tournament_event(writer, *started(2, 1, "tx-2"))
        _tournament_event(writer, *ended(2, 1, "tx-2", True))
        _tournament_event(writer, *started(1, 1, "tx-1"))
        stop = asyncio.Event()
        watching = asyncio.create_task(
            cli_tournament._watch(store, "tx", console, live=False, stop=stop)
        )
        await printed(out, "slot 2/2 match tx-2: counted")  # its first look is done
        assert "tx-1" not in out.getvalue()
        await asyncio.to_thread(_tournament_event, writer, *ended(1, 1, "tx-1", True))
        await printed(out, "slot 1/2 match tx-1: counted")
        stop.set()
        await asyncio.wait_for(watching, LIVE_S)


async def test_the_tournament_stream_wakes_at_its_running_matchs_appends(
    url: str, notified_only: None
) -> None:
    log = simulate("tx-1", {"a": Plan(passes=2), "b": Plan(passes=0)})
    with open_store(url) as store, open_store(url) as writer:
        _tournament_event(writer, "tournament_created", created())
        _tournament_event(writer, "tournament_started", {"parallel": 2})
        _tournament_event(writer, *started(1, 1, "tx-1"))
        # poll_s far beyond the test: only a notification can bring the next message.
        messages_ = tournament_messages(store, "tx", poll_s=120.0)
        try:
            first = await asyncio.wait_for(anext(messages_), LIVE_S)
            assert first.event == "tournament"
            assert json.loads(first.data)["running"][0]["state"] == "starting"
            for event in log[:2]:  # the running match begins to log
                writer.append_blocking(  # type: ignore[attr-defined]
                    "tx-1", event["type"], event["data"], event["t_ms"], wall=event["wall"]
                )
            changed = json.loads((await asyncio.wait_for(anext(messages_), LIVE_S)).data)
            assert changed["running"][0]["match_id"] == "tx-1"
            assert changed["running"][0]["state"] != "starting"
            _tournament_event(writer, *started(2, 1, "tx-2"))  # and its own stream
            again = json.loads((await asyncio.wait_for(anext(messages_), LIVE_S)).data)
            assert [r["match_id"] for r in again["running"]] == ["tx-1", "tx-2"]
        finally:
            await messages_.aclose()
