"""Benchmark: the event log's append latency and read throughput, with the hash chain.

Run: `python bench/chain.py [--events 2000] [--json bench/results/chain.json]`.
Appends `--events` events to one match in a fresh log (a realistic mix: 3 in 4 small
referee-sized events, 1 in 4 a 4 KiB agent output chunk), each a durable commit, then
reads the whole match back. Run it with `PYTHONPATH=<an older checkout>/src` to measure
that code the same way (`docs/PERFORMANCE.md` compares the store before and after the
chain, in the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import opsarena.store
from opsarena.store import SqliteEventStore


def payload(i: int) -> dict[str, Any]:
    if i % 4 == 3:
        return {"agent": "a", "stream": "stdout", "text": "x" * 4096}
    return {"territory": "t", "milestone": "write-read", "attempt": i, "verdict": "failed",
            "failure_detail": "connect: connection refused after 3 ms"}  # fmt: skip


def run(events: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        store = SqliteEventStore(Path(directory) / "bench.db")
        latencies = []
        for i in range(events):
            started = time.perf_counter()
            store.append_blocking("bench", "attempt_result", payload(i), i)
            latencies.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        read = store.read_blocking("bench")
        read_ms = (time.perf_counter() - started) * 1000
        store.close()
    assert len(read) == events
    latencies.sort()
    return {
        # Which checkout's store was measured, relative to this repository when it is ours.
        "code": _relative(Path(opsarena.store.__file__).parent),
        "events": events,
        "append_p50_ms": round(statistics.median(latencies), 3),
        "append_p90_ms": round(latencies[int(len(latencies) * 0.9)], 3),
        "append_max_ms": round(latencies[-1], 3),
        "read_all_ms": round(read_ms, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _relative(path: Path) -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return path.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = run(args.events)
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
