"""Benchmark incident-repair: match clock from agents-go to the reference's verdict, per breakage.

Usage: python bench/incident_repair.py [--runs N]

For each breakage the seed can draw, N real matches `opsarena run --challenge
incident-repair --builder r=scripted:reference` with a seed that draws it (each a fresh
host, removed after). Reported per breakage from the match record: time to repair (the
match clock when service-up passed), time to the durable verdict (when the last milestone
passed; target <= 15 s), and the points. Prints the load average before and after, since
the machine may be shared. Needs podman and the host image.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from opsarena.challenges import builtin_challenge
from opsarena.challenges.catalog import import_checks_file


def breakage_seeds() -> dict[str, str]:
    """Breakage -> the first hex seed (`0000..n`) that draws it."""
    challenge = builtin_challenge("incident-repair")
    assert challenge.directory is not None and challenge.checks_file is not None
    module = sys.modules[import_checks_file(challenge.directory, challenge.checks_file)]
    seeds: dict[str, str] = {}
    for n in range(10_000):
        seed = f"{n:032x}"
        seeds.setdefault(module.breakage_of(bytes.fromhex(seed)), seed)  # type: ignore[attr-defined]
        if len(seeds) == len(module.BREAKAGES):  # type: ignore[attr-defined]
            return seeds
    raise SystemExit("no seed found for every breakage")


def one_match(seed: str, workdir: Path) -> tuple[float, float, int]:
    record = workdir / f"{seed}.json"
    subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", "run", "--challenge", "incident-repair",
         "--builder", "r=scripted:reference", "--seed", seed, "--quiet",
         "--db", str(workdir / "bench.db"), "--record", str(record)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    milestones = json.loads(record.read_text())["territories"]["r"]["milestones"]
    repaired = milestones["service-up"]["passed_at_ms"] / 1000
    durable = max(m["passed_at_ms"] or 0 for m in milestones.values()) / 1000
    return repaired, durable, sum(m["points"] for m in milestones.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        for breakage, seed in sorted(breakage_seeds().items()):
            runs = [one_match(seed, Path(tmp)) for _ in range(args.runs)]
            repaired = statistics.median(r[0] for r in runs)
            durable = statistics.median(r[1] for r in runs)
            points = {r[2] for r in runs}
            print(f"{breakage:14} repair {repaired:5.1f} s  durable {durable:5.1f} s  "
                  f"points {sorted(points)}  (median of {len(runs)})")  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
