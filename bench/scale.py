"""Benchmark: one match with 16 territories (8 reference builders, 8 others).

Run: `python bench/scale.py [--territories 16] [--json bench/results/scale.json]`.
Records time to verdict, the controller's CPU and peak memory, memory per host, and
whether the referee kept its cadence for every territory (the gaps between attempts
at a milestone that keeps failing, which the referee retries once per cadence).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import secrets
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console

from opsarena.agents.competitors import competitor_from_cli
from opsarena.challenges.catalog import find_challenge
from opsarena.match.controller import Controller, MatchPlan
from opsarena.store import SqliteEventStore, StoredEvent

OTHERS = ["in-memory", "volatile", "not-enabled", "wrong-health", "idle", "webdav"]


def host_memory_mb(match_id: str) -> list[float]:
    """Memory in use by each host of the match, from podman stats."""
    out = subprocess.run(
        ["podman", "stats", "--no-stream", "--format", "json",
         "--filter", f"label=opsarena.match={match_id}"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if out.returncode != 0 or not out.stdout.strip():
        return []
    rows = json.loads(out.stdout)
    return [row["mem_usage_bytes"] / 2**20 for row in rows if "mem_usage_bytes" in row]


def cadence_gaps(events: list[StoredEvent]) -> dict[str, list[int]]:
    """Per territory, ms between consecutive starts of failed attempts at one milestone."""
    starts: dict[tuple[str, str], list[int]] = defaultdict(list)
    failed: set[tuple[str, str, int]] = set()
    for event in events:
        data = event.data
        if event.type == "attempt_started":
            starts[(data["territory"], data["milestone"])].append(event.t_ms)
        elif event.type == "attempt_result" and data["verdict"] != "passed":
            failed.add((data["territory"], data["milestone"], data["attempt"]))
    gaps: dict[str, list[int]] = defaultdict(list)
    for (territory, milestone), times in starts.items():
        for attempt, (first, second) in enumerate(zip(times, times[1:], strict=False), 1):
            if (territory, milestone, attempt) in failed:
                gaps[territory].append(second - first)
    return gaps


async def bench(territories: int) -> dict[str, Any]:
    builders = {}
    for index in range(territories):
        kind = "reference" if index < territories // 2 else OTHERS[index % len(OTHERS)]
        builders[f"t{index:02d}-{kind}"] = f"scripted:{kind}"
    plan = MatchPlan(
        challenge=find_challenge("durable-records"),
        competitors=[competitor_from_cli(t, a) for t, a in builders.items()],
        time_limit_s=300.0,
        finish="all",
        match_id=f"scale{secrets.token_hex(3)}",
    )
    peak_hosts: list[float] = []

    async def sample_memory() -> None:
        while True:
            await asyncio.sleep(5)
            sample = await asyncio.to_thread(host_memory_mb, plan.match_id)
            if sum(sample) > sum(peak_hosts):
                peak_hosts[:] = sample

    with tempfile.TemporaryDirectory() as tmp, SqliteEventStore(Path(tmp) / "log.db") as store:
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.monotonic()
        sampler = asyncio.create_task(sample_memory())
        try:
            record = await Controller(plan, store).run()
        finally:
            sampler.cancel()
        wall = time.monotonic() - started
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        events = await store.read(plan.match_id)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    gaps = cadence_gaps(events)
    all_gaps = sorted(g for values in gaps.values() for g in values)
    cadence_ms = int(plan.challenge.cadence_s * 1000)
    late = [g for g in all_gaps if g > cadence_ms * 2]
    return {
        "territories": territories,
        "finish_reason": record.finish_reason,
        "winner": record.winner,
        "durable": sum(1 for t in record.territories.values() if t.durable_at_ms is not None),
        "match_elapsed_s": round(record.elapsed_ms / 1000, 1),
        "first_durable_s": round(
            min(t.durable_at_ms for t in record.territories.values() if t.durable_at_ms) / 1000, 1
        ),
        "wall_incl_provisioning_s": round(wall, 1),
        "controller_cpu_s": round(cpu, 2),
        "controller_cpu_per_match_s": round(cpu / wall, 3),
        "controller_peak_rss_mb": round(cpu_after.ru_maxrss / 1024, 1),
        "host_memory_mb_mean": round(statistics.mean(peak_hosts), 1) if peak_hosts else None,
        "host_memory_mb_max": round(max(peak_hosts), 1) if peak_hosts else None,
        "cadence_ms": cadence_ms,
        "retry_gap_ms_p50": statistics.median(all_gaps) if all_gaps else None,
        "retry_gap_ms_max": all_gaps[-1] if all_gaps else None,
        "retry_gaps_over_2x_cadence": len(late),
        "retry_gaps_measured": len(all_gaps),
        "events": len(events),
        "infrastructure_failures": record.infrastructure_failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--territories", type=int, default=16)
    parser.add_argument("--json", type=Path, default=Path("bench/results/scale.json"))
    args = parser.parse_args()
    result = asyncio.run(bench(args.territories))
    result["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    console = Console()
    for key, value in result.items():
        console.print(f"{key:32} {value}", markup=False)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
