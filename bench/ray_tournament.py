"""Benchmark the Ray overhead: one tournament through a local two-node Ray cluster vs the
local pool, same machine, same matches.

Usage: python bench/ray_tournament.py [--matches N] [--territories T] [--json FILE]

The tournament: N slots of `durable-records` with `scripted:reference` against
`scripted:idle` (two territories per match), a fixed seed, 2 matches at once. Played twice
into fresh databases of one throw-away PostgreSQL server (tests/pg.py):

1. `local`: `TournamentRunner` in this process, `parallel = 2`;
2. `ray`: the same through `RayExecutor` on a `ray.cluster_utils.Cluster` of two nodes on
   127.0.0.1, each with 1 CPU, 80 MiB of object store and T `opsarena_territory` units
   (T = 2: one match per node at a time, so both arms play 2 at once).

Reported per arm: wall time from the first slot to the tournament's end, matches per hour,
the mean match's own wall time (its log's first to last event) and what is left per match
(2 lanes x wall / matches - mean match: starting it, on Ray the task's dispatch and its
worker's log reads);
then the ratio ray/local (the target is >= 0.9), and the load average before and after.
Needs podman, the host image and PostgreSQL's server binaries; removes its hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # this node's IP is 127.0.0.1

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.pg import new_database, postgres_server

from opsarena.hosts import get_driver
from opsarena.store import open_store
from opsarena.tournament import TournamentRunner, parse_tournament
from opsarena.tournament.ray_exec import RESOURCE, RayExecutor, connect

SEED = "be4c" * 8


def tournament_text(matches: int) -> str:
    return "\n".join([
        'name = "ray bench"', 'challenges = ["durable-records"]', f"trials = {matches}",
        "parallel = 2", "retries = 0", f'seed = "{SEED}"', "[match]", "time_limit_s = 120",
        "drain_s = 1", "[territories.reference]", 'agent = "scripted:reference"',
        "[territories.idle]", 'agent = "scripted:idle"', "",
    ])  # fmt: skip


async def play(db: str, text: str, base: Path, executor: RayExecutor | None) -> dict[str, Any]:
    plan = parse_tournament(text, str(base / "bench.toml"), base=base)
    with open_store(db) as store:
        runner = await TournamentRunner.create(store, plan, parallel=2, executor=executor)
        start = time.monotonic()
        try:
            record = await runner.run()
        finally:
            ids = [a.match_id for s in (runner.record.slots if runner.record else [])
                   for a in s.attempts]  # fmt: skip
            for match_id in ids:
                await get_driver("podman").cleanup(match_id=match_id)
        wall = time.monotonic() - start
        spans = []
        for slot in record.slots:
            events = await store.read(slot.counted_match or "")
            if events:
                spans.append(_seconds(events[-1].wall) - _seconds(events[0].wall))
    counts = record.summary_counts()
    return {
        "wall_s": round(wall, 1),
        "matches": len(record.slots),
        "counted": counts["counted"],
        "void": counts["void"],
        "matches_per_hour": round(len(record.slots) * 3600 / wall, 1),
        "match_wall_s_mean": round(statistics.mean(spans), 1) if spans else None,
        "scheduling_overhead_s_per_match": round(
            wall * 2 / len(record.slots) - statistics.mean(spans), 1
        )
        if spans
        else None,
        "nodes": sorted({a.node for s in record.slots for a in s.attempts if a.node}),
    }


def _seconds(wall: str) -> float:
    return datetime.fromisoformat(wall.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matches", type=int, default=6)
    parser.add_argument("--territories", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("bench/results/ray_tournament.json"))
    args = parser.parse_args()
    from ray import cluster_utils

    text = tournament_text(args.matches)
    load_before = os.getloadavg()
    node = {"num_cpus": 1, "resources": {RESOURCE: args.territories},
            "object_store_memory": 80 * 1024 * 1024, "node_ip_address": "127.0.0.1"}  # fmt: skip
    results: dict[str, Any] = {}
    with postgres_server() as url, tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        results["local"] = asyncio.run(play(new_database(url), text, base, None))
        print("local", results["local"], flush=True)
        cluster = cluster_utils.Cluster(
            initialize_head=True, head_node_args={**node, "include_dashboard": False}
        )
        try:
            cluster.add_node(**node)
            cluster.wait_for_nodes()
            db = new_database(url)
            with open_store(db):
                pass
            executor = RayExecutor(connect(cluster.address), db, territories=2, driver="podman")
            results["ray"] = asyncio.run(play(db, text, base, executor))
            print("ray", results["ray"], flush=True)
        finally:
            import ray

            ray.shutdown()  # the driver leaves first: the cluster refuses to remove its node
            cluster.shutdown()
    results["ratio_ray_over_local"] = round(
        results["ray"]["matches_per_hour"] / results["local"]["matches_per_hour"], 3
    )
    results["load_before"] = [round(x, 2) for x in load_before]
    results["load_after"] = [round(x, 2) for x in os.getloadavg()]
    results["date"] = datetime.now().isoformat(timespec="seconds")
    results["cpus"] = os.cpu_count()
    print(json.dumps(results, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
