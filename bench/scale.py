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
import os
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
from opsarena.challenges import Challenge
from opsarena.challenges.catalog import find_challenge
from opsarena.hosts import diskcount
from opsarena.match.controller import Controller, MatchPlan
from opsarena.referee.nemesis import milestone_fault
from opsarena.referee.referee import retry_delay
from opsarena.store import SqliteEventStore, StoredEvent

OTHERS = [
    "in-memory", "volatile", "not-enabled", "wrong-health", "idle", "webdav", "ignore-ids",
    "racy",
]  # fmt: skip


UNITS = {
    "B": 1,
    "kB": 1e3,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
}


def to_mb(text: str) -> float:
    """'15.57MB' -> 15.57 (podman prints decimal units)."""
    number = text.rstrip("BkKMGi")
    unit = text[len(number) :]
    return float(number) * UNITS[unit] / 1e6


def host_memory_mb(match_id: str) -> list[float]:
    """Memory in use by each host of the match, from podman stats."""
    names = subprocess.run(
        ["podman", "ps", "--filter", f"label=opsarena.match={match_id}", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=False, timeout=60,
    ).stdout.split()  # fmt: skip
    if not names:
        return []
    out = subprocess.run(
        ["podman", "stats", "--no-stream", "--format", "json", *names],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if out.returncode != 0 or not out.stdout.strip():
        return []
    return [to_mb(row["mem_usage"].split("/")[0].strip()) for row in json.loads(out.stdout)]


def cadence_lateness(events: list[StoredEvent], challenge: Challenge) -> dict[str, list[int]]:
    """Per territory, how late (ms) each retry started after a failed attempt.

    The referee starts the next attempt `retry_delay` after the last one started (the
    cadence; more for a fault milestone failing again and again: the back-off), or at
    once when that attempt took longer (a fault and its readiness budget), so lateness
    is next start - max(start + delay, end of the failed attempt). Attempt N of a
    milestone not passed yet is its N-th failure in a row.
    """
    faults = {m.id: milestone_fault(m.check, m.fault) is not None for m in challenge.milestones}
    starts: dict[tuple[str, str, int], int] = {}
    ends: dict[tuple[str, str, int], int] = {}
    failed: list[tuple[str, str, int]] = []
    for event in events:
        data = event.data
        if event.type not in ("attempt_started", "attempt_result"):
            continue
        key = (data["territory"], data["milestone"], data["attempt"])
        if event.type == "attempt_started":
            starts[key] = event.t_ms
        else:
            ends[key] = event.t_ms
            if data["verdict"] != "passed":
                failed.append(key)
    lateness: dict[str, list[int]] = defaultdict(list)
    for territory, milestone, attempt in failed:
        following = starts.get((territory, milestone, attempt + 1))
        if following is None:
            continue
        key = (territory, milestone, attempt)
        delay_ms = int(1000 * retry_delay(challenge.cadence_s, attempt, fault=faults[milestone]))
        due = max(starts[key] + delay_ms, ends[key])
        lateness[territory].append(max(0, following - due))
    return lateness


def disk_helper_cpu() -> float | None:
    """CPU seconds of the kept disk counting helper (`hosts/diskcount.py`) and what it
    waited for, or None when there is none."""
    helper = diskcount._helper
    if helper is None:
        return None
    try:
        fields = Path(f"/proc/{helper.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return round(ticks / os.sysconf("SC_CLK_TCK"), 2)


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
        children_before = sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])
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
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    children_cpu = children.ru_utime + children.ru_stime - children_before
    cadence_ms = int(plan.challenge.cadence_s * 1000)
    lateness = cadence_lateness(events, plan.challenge)
    all_late = sorted(g for values in lateness.values() for g in values)
    p99 = all_late[min(len(all_late) - 1, int(0.99 * len(all_late)))] if all_late else None
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
        "controller_user_s": round(cpu_after.ru_utime - cpu_before.ru_utime, 2),
        "controller_system_s": round(cpu_after.ru_stime - cpu_before.ru_stime, 2),
        # Not in the controller's figure, listed so that none of it hides: programs it
        # started and waited for (podman, du, the bus connector), and the disk counting
        # helper it keeps (alive: read from /proc).
        "children_cpu_s": round(children_cpu, 2),
        "disk_helper_cpu_s": disk_helper_cpu(),
        "controller_peak_rss_mb": round(cpu_after.ru_maxrss / 1024, 1),
        "host_memory_mb_mean": round(statistics.mean(peak_hosts), 1) if peak_hosts else None,
        "host_memory_mb_max": round(max(peak_hosts), 1) if peak_hosts else None,
        "cadence_ms": cadence_ms,
        "retries_measured": len(all_late),
        "retry_lateness_ms_p50": statistics.median(all_late) if all_late else None,
        "retry_lateness_ms_p99": p99,
        "retry_lateness_ms_max": all_late[-1] if all_late else None,
        "territories_with_a_retry_over_1_cadence_late": sorted(
            t for t, values in lateness.items() if max(values) > cadence_ms
        ),
        "events": len(events),
        "infrastructure_failures": record.infrastructure_failures,
        "referee_errors": [
            {k: e.data.get(k) for k in ("territory", "milestone", "attempt", "failure_reason")}
            | {"detail": str(e.data.get("failure_detail") or "")[:300], "t_ms": e.t_ms}
            for e in events
            if e.type == "attempt_result" and e.data.get("verdict") == "referee_error"
        ],
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
