"""Benchmark the event log back ends side by side, in one run: SQLite and PostgreSQL.

Usage: python bench/store.py [--appends N] [--matches M] [--per-match K] [--fold-events E]
       [--postgres URL]

1. Append latency: N sequential appends of a typical referee event (~300 bytes) to one
   match, each durable on return; p50 / p99 / max.
2. Throughput: M concurrent matches (one writer process each, as M controllers would be)
   appending K events each; events per second over the whole run.
3. Fold: read a match of E events back and fold it (`fold_events`), median of 5.

Without --postgres a throw-away cluster is started (tests/pg.py, unix socket only).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.match.simulated import Plan, simulate
from tests.pg import new_database, postgres_server

from opsarena.match.fold import fold_events
from opsarena.store import open_store

EVENT = {
    "territory": "builder-one",
    "milestone": "write-read",
    "attempt": 3,
    "verdict": "passed",
    "evidence": {"record": "record-17a9a70ac04b2eff", "value": "opaque-" + "f" * 32},
    "failure_category": None,
    "failure_detail": None,
    "duration_ms": 12,
}

WRITER = """
import sys
from opsarena.store import open_store
target, match_id, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = open_store(target)
data = {"territory": "t", "milestone": "write-read", "attempt": 1, "verdict": "passed",
        "evidence": {"record": "r", "value": "v" * 40}, "duration_ms": 12}
print("ready", flush=True)
sys.stdin.readline()
for i in range(count):
    store.append_blocking(match_id, "attempt_result", data, i)
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def append_latency(target: str, n: int) -> dict[str, float]:
    with open_store(target) as store:
        append = store.append_blocking
        append("lat", "match_created", {}, 0)
        times: list[float] = []
        for i in range(n):
            start = time.perf_counter()
            append("lat", "attempt_result", EVENT, i)
            times.append((time.perf_counter() - start) * 1000)
    return {"p50": statistics.median(times), "p99": pct(times, 0.99), "max": max(times)}


def throughput(target: str, matches: int, per_match: int) -> float:
    open_store(target).close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, target, f"tp{i}", str(per_match)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(matches)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    start = time.perf_counter()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        proc.wait(timeout=600)
        assert proc.returncode == 0
    return matches * per_match / (time.perf_counter() - start)


def match_log(events: int) -> list[dict[str, object]]:
    """A real-shaped match log (the fold tests' simulator) of about `events` events: four
    territories, the slowest failing many attempts before it passes."""
    fails = max(1, (events - 120) // 11)
    plans = {
        "a": Plan(passes=4, fails=(fails, fails, fails, fails, 1)),
        "b": Plan(passes=2), "c": Plan(passes=1), "d": Plan(passes=0),
    }  # fmt: skip
    return simulate("fold", plans)


def fold_time(target: str, events: int) -> tuple[int, float]:
    log = match_log(events)
    with open_store(target) as store:
        append = store.append_blocking
        for e in log:
            append("fold", e["type"], e["data"], e["t_ms"], wall=e["wall"])
        times = []
        for _ in range(5):
            start = time.perf_counter()
            fold_events(asyncio.run(store.read("fold")))
            times.append((time.perf_counter() - start) * 1000)
    return len(log), statistics.median(times)


def measure(name: str, target: str, args: argparse.Namespace) -> None:
    lat = append_latency(target, args.appends)
    eps = throughput(target, args.matches, args.per_match)
    count, fold = fold_time(target, args.fold_events)
    print(
        f"{name:10} append p50 {lat['p50']:6.2f} ms  p99 {lat['p99']:6.2f} ms  "
        f"max {lat['max']:7.2f} ms | {args.matches} matches: {eps:7.0f} events/s | "
        f"read+fold {count} events: {fold:6.1f} ms",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=1000)
    parser.add_argument("--matches", type=int, default=8)
    parser.add_argument("--per-match", type=int, default=250)
    parser.add_argument("--fold-events", type=int, default=1000)
    parser.add_argument("--postgres", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        measure("sqlite", str(Path(tmp) / "bench.db"), args)
    if args.postgres:
        measure("postgres", new_database(args.postgres), args)
    else:
        with postgres_server() as url:
            measure("postgres", new_database(url), args)


if __name__ == "__main__":
    main()
