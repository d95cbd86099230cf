"""A/B of two source trees of opsarena on the host layer, interleaved in one run.

Usage:
    git archive BASE src | tar -x -C /tmp/before
    python bench/ab_hosts.py --before /tmp/before/src [--rounds 6] [--per-round 4]
        [--json bench/results/ab_hosts.json]

Each round runs, in fresh processes and in turn, the `before` tree and this checkout's
`src`: provision → ready of a power-cut-capable host and of an ordinary one
(`--per-round` each, removed after each), then `--per-round` power cuts of one power-cut
host. Interleaving in one run puts both trees under the same machine load (which moves
these figures more than most changes do). Every host has its own match id and is
removed by match id; nothing else on the machine is touched.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1] / "src"


async def worker(kind: str, runs: int) -> dict[str, list[float]]:
    from opsarena.hosts import DEFAULT_IMAGE, HostSpec, get_driver

    driver = get_driver("podman")
    match_id = f"ab{secrets.token_hex(4)}"
    out: dict[str, list[float]] = {}
    try:
        if kind == "provision":
            out = {"provision_power_cut": [], "provision_ordinary": []}
            for index in range(runs):
                for key in out:
                    power_cut = key == "provision_power_cut"
                    spec = HostSpec(
                        match_id=match_id, territory=f"p{index}{'c' if power_cut else 'o'}",
                        image=DEFAULT_IMAGE, power_cut=power_cut,
                    )  # fmt: skip
                    started = time.perf_counter()
                    host = await driver.create(spec)
                    out[key].append((time.perf_counter() - started) * 1000)
                    await driver.remove(host.name)
        else:
            spec = HostSpec(match_id=match_id, territory="cut", image=DEFAULT_IMAGE, power_cut=True)
            host = await driver.create(spec)
            out = {"power_cut_to_ready": []}
            for _ in range(runs):
                started = time.perf_counter()
                await host.power_cut()
                out["power_cut_to_ready"].append((time.perf_counter() - started) * 1000)
    finally:
        await driver.cleanup(match_id=match_id)
    return out


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "runs": len(ordered),
        "p50": round(statistics.median(ordered), 1),
        "p90": round(ordered[max(0, round(0.9 * len(ordered)) - 1)], 1),
        "max": round(ordered[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-round", type=int, default=4)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", choices=["provision", "cut"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(worker(args.worker, args.per_round))))
        return
    if args.before is None:
        parser.error("--before is required")
    trees = {"before": args.before.resolve(), "after": HERE}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    failures: dict[str, list[str]] = {name: [] for name in trees}
    load = [os.getloadavg()]
    for _round in range(args.rounds):
        for kind in ("provision", "cut"):
            for name, tree in trees.items():
                env = {**os.environ, "PYTHONPATH": str(tree)}
                done = subprocess.run(
                    [sys.executable, __file__, "--worker", kind, "--per-round",
                     str(args.per_round)],
                    env=env, capture_output=True, text=True, check=False, timeout=900,
                )  # fmt: skip
                if done.returncode != 0:
                    failures[name].append(done.stderr.strip().splitlines()[-1])
                    continue
                for key, values in json.loads(done.stdout).items():
                    samples[name].setdefault(key, []).extend(values)
        load.append(os.getloadavg())
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_1min": [round(one, 2) for one, _five, _fifteen in load],
        **{name: {k: summary(v) for k, v in rows.items()} for name, rows in samples.items()},
        "failures": failures,
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
