"""The `EventStore` contract, run against every back end: SQLite files and a real PostgreSQL.

Each test gets an empty log: a new SQLite file, or a new database on a throw-away
PostgreSQL server started for this test session (tests/pg.py). Writers in other processes
open the same log through `open_store`, as `opsarena run` on another machine would.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsarena.errors import StoreError
from opsarena.store import (
    MAX_EVENT_BYTES,
    StoredEvent,
    chain_problems,
    content_digest,
    open_store,
)
from tests.pg import new_database, postgres_for_tests

OLD = "2000-01-01T00:00:00.000Z"

WRITER = """
import sys
from opsarena.store import open_store
target, match_id, writer, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = open_store(target)
for i in range(count):
    seq = store.append_blocking(match_id, "agent_output", {"writer": writer, "i": i}, i)
    print(seq, flush=True)
"""


def writer(target: str, match_id: str, name: str, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, target, match_id, name, str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with postgres_for_tests() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "events.db")
    return new_database(request.getfixturevalue("postgres_url"))


async def test_append_read_and_summaries(target: str) -> None:
    with open_store(target) as store:
        assert await store.append("m1", "match_created", {"a": 1}, -5, wall=OLD) == 1
        assert await store.append("m1", "host_provisioning", {"é": "ü", "n": None}, 3) == 2
        assert await store.append("m2", "match_created", {}, 0) == 1
        assert await store.append("m1", "match_started", {}, 0) == 3
        events = await store.read("m1")
        assert [(e.seq, e.type, e.t_ms) for e in events] == [
            (1, "match_created", -5), (2, "host_provisioning", 3), (3, "match_started", 0),
        ]  # fmt: skip
        first = events[0]
        assert (first.match_id, first.seq, first.type, first.t_ms, first.wall, first.data) == (
            "m1", 1, "match_created", -5, OLD, {"a": 1}
        )  # fmt: skip
        assert not chain_problems([e.link() for e in events])  # the chain holds
        assert events[1].data == {"é": "ü", "n": None} and events[1].wall.endswith("Z")
        assert [e.seq for e in await store.read("m1", after=1, limit=1)] == [2]
        assert await store.read("nope") == []
        assert (await store.exists("m1"), await store.exists("nope")) == (True, False)
        summary = await store.summary("m1")
        assert summary is not None
        assert (summary.last_seq, summary.last_type, summary.created_wall) == (
            3, "match_started", OLD
        )  # fmt: skip
        assert await store.summary("nope") is None
        assert [m.match_id for m in await store.list_matches()] == ["m2", "m1"]  # newest first
        assert len(await store.list_matches(limit=1)) == 1


async def test_a_read_holds_at_most_max_bytes_of_data_but_always_one_event(target: str) -> None:
    with open_store(target) as store:
        for i in range(6):  # 1000, 2000, ... 6000 bytes of "é" (2 bytes each): UTF-8 counts
            await store.append("m", "agent_output", {"t": "é" * (500 * (i + 1))}, i)
        sizes = [len(f'{{"t":"{"é" * (500 * (i + 1))}"}}'.encode()) for i in range(6)]
        read = store.read
        assert [e.seq for e in await read("m", max_bytes=sizes[0] + sizes[1])] == [1, 2]
        assert [e.seq for e in await read("m", max_bytes=sizes[0] + sizes[1] - 1)] == [1]
        assert [e.seq for e in await read("m", after=2, max_bytes=1)] == [3]  # one, always
        assert [e.seq for e in await read("m", after=2, limit=2, max_bytes=10**6)] == [3, 4]
        assert [e.seq for e in await read("m", after=4, max_bytes=10**6)] == [5, 6]
        assert await read("m", after=6, max_bytes=1) == []


async def test_data_comes_back_as_written(target: str) -> None:
    # Key order, nesting and unicode survive (PostgreSQL keeps the text, not jsonb).
    data = {"z": 1, "a": [1, {"y": "\u2603", "b": 2.5}], "m": "line\nbreak\t\u0000ok"}
    with open_store(target) as store:
        await store.append("m", "x", data, 0)
        (event,) = await store.read("m")
        assert list(event.data) == ["z", "a", "m"] and event.data == data


async def test_bad_event_data_is_refused(target: str) -> None:
    with open_store(target) as store:
        with pytest.raises(ValueError, match="over the"):
            await store.append("m", "agent_output", {"text": "x" * MAX_EVENT_BYTES}, 0)
        with pytest.raises(ValueError, match="JSON object"):
            await store.append("m", "x", ["not", "a", "dict"], 0)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await store.append("m", "x", {"bytes": b"raw"}, 0)
        assert await store.exists("m") is False  # nothing half-written


async def test_text_the_arena_observed_is_stored_escaped_never_refused(target: str) -> None:
    # A host's file name with a non-UTF-8 byte reaches the log as U+DCFF (surrogateescape):
    # the store keeps it escaped, in values and keys at any depth, NUL too, and the chain
    # and the appender's own digest hold over the escaped text.
    hostile = {
        "failure_detail": "writable: /opt/plant/\udcff (-rw-rw-rw- 1000:1000)",
        "evidence": {"p\udcff": ["\ud800", {"k\udfff": "nul\x00 é \U0001f600"}]},
        "n": 3,
        "\x00k": None,
    }
    with open_store(target) as store:
        seq = await store.append("m", "attempt_result", hostile, 0)
        await store.append("m", "agent_output", {"text": "after"}, 1)
        first, second = await store.read("m")
        assert first.data == {
            "failure_detail": "writable: /opt/plant/\\xff (-rw-rw-rw- 1000:1000)",
            "evidence": {"p\\xff": ["\\ud800", {"k\\udfff": "nul\x00 é \U0001f600"}]},
            "n": 3,
            "\x00k": None,
        }
        assert second.data == {"text": "after"}
        assert not chain_problems([e.link() for e in (first, second)])
        assert content_digest("attempt_result", 0, hostile) == content_digest(
            first.type, first.t_ms, first.data
        )  # the controller's check at the close finds its own event as written
        assert seq == first.seq == 1


async def test_appends_from_many_tasks_of_one_process_are_gap_free(target: str) -> None:
    with open_store(target) as store:
        seqs = await asyncio.gather(*(store.append("m", "x", {"i": i}, i) for i in range(200)))
        assert sorted(seqs) == list(range(1, 201))
        assert [e.seq for e in await store.read("m")] == list(range(1, 201))


def test_appends_from_many_processes_never_gap_or_duplicate(target: str) -> None:
    open_store(target).close()
    writers = [writer(target, "shared", f"w{i}", 150) for i in range(4)]
    writers.append(writer(target, "other", "o", 50))
    outputs = [w.communicate(timeout=180)[0] for w in writers]
    assert [w.returncode for w in writers] == [0] * 5
    with open_store(target) as store:
        events = asyncio.run(store.read("shared"))
        assert [e.seq for e in events] == list(range(1, 601))
        for index, output in enumerate(outputs[:4]):
            mine = [e for e in events if e.data["writer"] == f"w{index}"]
            assert [e.data["i"] for e in mine] == list(range(150))  # each writer's order kept
            assert [e.seq for e in mine] == [int(line) for line in output.split()]
        assert [e.seq for e in asyncio.run(store.read("other"))] == list(range(1, 51))
        summary = asyncio.run(store.summary("shared"))
        assert summary is not None and summary.last_seq == 600


def test_a_killed_writer_loses_no_acknowledged_event(target: str) -> None:
    open_store(target).close()
    proc = writer(target, "crash", "w", 1_000_000)
    assert proc.stdout is not None
    acknowledged: list[int] = []
    for line in proc.stdout:
        acknowledged.append(int(line))
        if len(acknowledged) == 200:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with open_store(target) as store:
        stored = [e.seq for e in asyncio.run(store.read("crash"))]
        assert stored == list(range(1, len(stored) + 1))  # gap-free
        assert set(acknowledged) <= set(stored)  # every append that returned is there
        # and the match goes on after the crash with the next number
        assert asyncio.run(store.append("crash", "after", {}, 0)) == len(stored) + 1


async def test_follow_sees_events_appended_by_another_process(target: str) -> None:
    with open_store(target) as store:
        await store.append("live", "match_created", {}, 0)
        proc = writer(target, "live", "w", 40)
        seen: list[StoredEvent] = []

        async def collect() -> None:
            async for event in store.follow("live", after=0, poll_s=0.02):
                seen.append(event)
                if len(seen) == 41:
                    return

        await asyncio.wait_for(collect(), timeout=120)
        await asyncio.to_thread(proc.wait, 60)
    assert [e.seq for e in seen] == list(range(1, 42))
    assert [e.data.get("i") for e in seen[1:]] == list(range(40))


async def test_changes_wake_a_waiter_for_any_match(target: str) -> None:
    with open_store(target) as store, open_store(target) as other:
        async with store.changes() as wake:
            waiting = asyncio.create_task(wake("", 0.05))
            await other.append("somewhere", "x", {}, 0)
            await asyncio.wait_for(waiting, timeout=30)
        assert await store.exists("somewhere")


async def test_a_read_only_log_refuses_writes_but_sees_other_writers(target: str) -> None:
    with open_store(target) as writer_store:
        await writer_store.append("m", "x", {}, 0)
        with open_store(target, read_only=True) as reader:
            with pytest.raises(StoreError) as err:
                await reader.append("m", "y", {}, 1)
            assert "\n" not in str(err.value)
            await writer_store.append("m", "z", {}, 2)
            assert [e.type for e in await reader.read("m")] == ["x", "z"]


def test_reopening_keeps_the_events(target: str) -> None:
    with open_store(target) as store:
        asyncio.run(store.append("m", "x", {"k": 1}, 0))
    with open_store(target) as store:
        assert asyncio.run(store.append("m", "y", {}, 1)) == 2
        assert [e.type for e in asyncio.run(store.read("m"))] == ["x", "y"]
