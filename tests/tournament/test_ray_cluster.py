"""A tournament over a real two-node Ray cluster on this machine, one node killed midway.

Ray's own `ray.cluster_utils.Cluster` starts a head and a worker node (both on 127.0.0.1,
no dashboard, no usage stats), each declaring 2 `opsarena_territory` units: one match of
two territories at a time per node. `opsarena tournament run --ray ADDRESS --db
postgresql://...` plays two slots; once both nodes play a match, the worker node is
removed without grace (its raylet and workers are killed). Then: the tournament finishes,
every slot has exactly one counted match, the killed match is recorded as lost (not
charged, replayed with its own seed), and every counted match has the same seed, points
and verdicts as the same tournament played by the local pool into SQLite.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opsarena.hosts import get_driver
from opsarena.match.fold import fold_events
from opsarena.match.record import MatchRecord
from opsarena.store import EventStore, open_store
from opsarena.tournament import TournamentRunner, load_tournament, stream_id
from opsarena.tournament.ray_exec import RESOURCE
from opsarena.tournament.record import TournamentRecord, fold_tournament
from tests.conftest import new_match_id, podman_names
from tests.pg import new_database, postgres_available, postgres_server

# Loopback only: no usage stats, and this node's IP is 127.0.0.1 (set before Ray is imported).
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = [
    pytest.mark.hosts,
    pytest.mark.skipif(not postgres_available(), reason="PostgreSQL server binaries missing"),
]

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]
SEED = "5eed" * 8
FILE = f"""
challenges = ["durable-records"]
trials = 2
parallel = 2
retries = 1
seed = "{SEED}"
[match]
time_limit_s = 90
drain_s = 1
[territories.reference]
agent = "scripted:reference"
[territories.idle]
agent = "scripted:idle"
"""
NODE = {
    "num_cpus": 1,
    "resources": {RESOURCE: 2},
    "object_store_memory": 80 * 1024 * 1024,
    "node_ip_address": "127.0.0.1",
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    made = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={**NODE, "include_dashboard": False},
    )
    try:
        made.add_node(**NODE)
        made.wait_for_nodes()
        yield made
    finally:
        made.shutdown()


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture
def postgres(postgres_url: str) -> str:
    database = new_database(postgres_url)
    with open_store(database):  # creates the schema, so readers can open it at once
        pass
    return database


def _wait_for_two_playing(url: str, tournament_id: str, run: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 300
    while True:  # both nodes play a match
        assert time.monotonic() < deadline, "two matches never ran at once"
        assert run.poll() is None, run.communicate()
        record = _tournament(url, tournament_id)
        playing = [] if record is None else [
            s.attempts[-1].match_id for s in record.slots if s.state == "playing"
        ]  # fmt: skip
        if len(playing) == 2 and all(
            "match_started" in [e.type for e in _read(url, m)] for m in playing
        ):
            return
        time.sleep(0.5)


def _diagnosis(url: str, tournament_id: str, address: str) -> str:
    """What a stuck tournament was doing: each attempt's state and its match's last events,
    the cluster's free units, and the Ray workers' error output (a timeout's message)."""
    lines: list[str] = []
    record = _tournament(url, tournament_id)
    for slot in [] if record is None else record.slots:
        for a in slot.attempts:
            types = [e.type for e in _read(url, a.match_id)]
            lines.append(
                f"slot {slot.slot} attempt {a.attempt} {a.match_id} counted={a.counted} "
                f"lost={a.lost} why={a.why!r} node={a.node!r} events={types[-6:]}"
            )
    probe = (
        f"import ray; ray.init(address={address!r}, log_to_driver=False);"
        "print('free', ray.available_resources());"
        "print('nodes', [(n['NodeID'][:8], n['Alive']) for n in ray.nodes()])"
    )
    seen = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )  # fmt: skip
    lines.append(seen.stdout.strip() or seen.stderr.strip()[-500:])
    logs = sorted(Path("/tmp/ray/session_latest/logs").glob("worker-*.err"),
                  key=lambda f: f.stat().st_mtime)  # fmt: skip
    for log in [f for f in logs if f.stat().st_size][-3:]:
        lines.append(f"--- {log.name}: " + log.read_text(errors="replace")[-1500:])
    return "\n".join(lines)


def _assert_matches_not_deprioritized(url: str, tournament_id: str) -> None:
    """Ray starts its workers at niceness 15: the task playing a match and the hosts it
    started (which inherit it) run at 0, or a busy node would starve the referee."""
    title = f"ray::opsarena match {tournament_id} ".encode()
    nice: dict[int, int] = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            if cmdline.read_bytes().startswith(title):  # (or one forked, not yet exec'd)
                pid = int(cmdline.parent.name)
                nice[pid] = os.getpriority(os.PRIO_PROCESS, pid)
    assert len(nice) >= 2 and set(nice.values()) == {0}, nice
    record = _tournament(url, tournament_id)
    assert record is not None
    for slot in record.slots:
        for name in podman_names(slot.attempts[-1].match_id):
            pid = subprocess.run(
                ["podman", "inspect", "--format", "{{.State.Pid}}", name],
                capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            if pid not in ("", "0"):
                assert os.getpriority(os.PRIO_PROCESS, int(pid)) == 0, name


def _read(url: str, stream: str) -> list[Any]:
    with open_store(url, read_only=True) as store:
        return list(asyncio.run(store.read(stream)))


def _tournament(url: str, tournament_id: str) -> TournamentRecord | None:
    events = _read(url, stream_id(tournament_id))
    return fold_tournament(events, reveal_seed=True) if events else None


def _standing(record: MatchRecord) -> dict[str, Any]:
    """What must not depend on where a match ran: its seed, points and verdicts."""
    return {
        "seed": record.seed,
        "winner": record.winner,
        "territories": {
            t.agent: (
                t.milestone_points,
                t.durable_at_ms is not None,
                {n: (m.passed, m.points, m.failure_reason) for n, m in t.milestones.items()},
            )
            for t in record.territories.values()
        },
    }


async def _local_run(db: Path, file: Path, tournament_id: str) -> dict[int, dict[str, Any]]:
    with open_store(str(db)) as store:
        runner = await TournamentRunner.create(
            store, load_tournament(file), parallel=2, tournament_id=tournament_id
        )
        record = await runner.run()
        return await _standings(store, record)


async def _standings(store: EventStore, record: TournamentRecord) -> dict[int, dict[str, Any]]:
    out = {}
    for slot in record.slots:
        counted = slot.counted_match
        assert counted is not None, f"slot {slot.slot} has no counted match: {slot}"
        out[slot.slot] = _standing(fold_events(await store.read(counted)))
    return out


def _cleanup(match_ids: set[str]) -> None:
    async def clean() -> None:
        for match_id in match_ids:
            await get_driver("podman").cleanup(match_id=match_id)

    asyncio.run(clean())


def test_a_tournament_over_two_ray_nodes_survives_losing_one(
    tmp_path: Path, cluster: Any, postgres: str
) -> None:
    file = tmp_path / "t.toml"
    file.write_text(FILE)
    tournament_id = new_match_id("tour")
    match_ids: set[str] = set()
    run = subprocess.Popen(
        [*OPSARENA, "tournament", "run", str(file), "--id", tournament_id, "--db", postgres,
         "--ray", cluster.address, "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for_two_playing(postgres, tournament_id, run)  # the worker node holds one
        _assert_matches_not_deprioritized(postgres, tournament_id)
        worker = next(iter(cluster.worker_nodes))
        cluster.remove_node(worker, allow_graceful=False)
        try:
            stdout, stderr = run.communicate(timeout=400)
        except subprocess.TimeoutExpired:
            pytest.fail(_diagnosis(postgres, tournament_id, cluster.address))
        assert run.returncode == 0, stderr
        assert f"tournament {tournament_id} finished: 2 matches counted" in stdout

        record = _tournament(postgres, tournament_id)
        assert record is not None and record.state == "finished"
        match_ids = {a.match_id for s in record.slots for a in s.attempts}
        lost = [(s, a) for s in record.slots for a in s.attempts if a.lost]
        assert len(lost) == 1, record.slots
        slot, gone = lost[0]
        assert gone.counted is False and gone.why.startswith("lost to infrastructure"), gone
        replay = slot.attempts[gone.attempt]  # the next attempt at the same slot
        assert replay.counted and replay.seed_attempt == gone.seed_attempt == 1
        assert slot.charged_attempts == 1  # the loss used up none of the slot's retries
        assert "match_started" in [e.type for e in _read(postgres, gone.match_id)]
        assert podman_names(gone.match_id) == []  # removed by a clean-up task on a live node
        assert all(a.node for s in record.slots for a in s.attempts if a.counted)
        for s in record.slots:  # a counted match removed its own hosts on its node
            assert podman_names(s.counted_match or "") == [], s
        with open_store(postgres, read_only=True) as store:
            over_ray = asyncio.run(_standings(store, record))

        local_id = new_match_id("tour")
        local = asyncio.run(_local_run(tmp_path / "local.db", file, local_id))
        with open_store(str(tmp_path / "local.db"), read_only=True) as store:
            local_record = fold_tournament(asyncio.run(store.read(stream_id(local_id))))
        match_ids |= {a.match_id for s in local_record.slots for a in s.attempts}
        assert over_ray == local
        assert {st["territories"]["reference"][1] for st in local.values()} == {True}
        assert {st["territories"]["idle"][0] for st in local.values()} == {0}
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
        seen = _tournament(postgres, tournament_id)
        if seen is not None:
            match_ids |= {a.match_id for s in seen.slots for a in s.attempts}
        _cleanup(match_ids)  # the lost match's hosts outlived its node's Ray processes
        if not cluster.worker_nodes:  # the next test has two nodes again
            cluster.add_node(**NODE)
            cluster.wait_for_nodes()
    for match_id in match_ids:
        assert podman_names(match_id) == [], f"hosts of {match_id} left behind"


def test_a_killed_ray_driver_is_resumed_and_its_cut_off_matches_replayed(
    tmp_path: Path, cluster: Any, postgres: str
) -> None:
    file = tmp_path / "t.toml"
    file.write_text(FILE)
    tournament_id = new_match_id("tour")
    command = ["--id", tournament_id, "--db", postgres, "--ray", cluster.address, "--quiet"]
    run = subprocess.Popen(
        [*OPSARENA, "tournament", "run", str(file), *command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for_two_playing(postgres, tournament_id, run)
        run.kill()  # SIGKILL: Ray kills the tasks of a driver that died
        run.communicate()
        try:
            resumed = subprocess.run(
                [*OPSARENA, "tournament", "resume", tournament_id, *command[2:]],
                capture_output=True, text=True, timeout=400,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.fail(_diagnosis(postgres, tournament_id, cluster.address))
        assert resumed.returncode == 0, resumed.stderr
        record = _tournament(postgres, tournament_id)
        assert record is not None and record.state == "finished" and record.runs == 2
        for slot in record.slots:
            assert [a.lost for a in slot.attempts] == [True, False], slot
            assert slot.attempts[0].why.startswith("lost to infrastructure: the controller")
            assert slot.attempts[1].counted and slot.attempts[1].seed_attempt == 1
            assert podman_names(slot.attempts[0].match_id) == []  # removed on resume
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
        seen = _tournament(postgres, tournament_id)
        match_ids = set() if seen is None else {
            a.match_id for s in seen.slots for a in s.attempts
        }  # fmt: skip
        _cleanup(match_ids)
