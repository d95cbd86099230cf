"""Benchmark fairness: a neighbour's time to durable with and without a 16-way exec storm
next door, in the same run.

Usage: python bench/exec_storm.py [--runs N] [--storm-width W]

Each run has four conditions, interleaved so the machine's load reaches all alike:
- quiet: the neighbour alone (the storm's host is up and idle);
- storm, defaults: next door, a command agent (confined, through its gate, as in a
  match) runs W parallel `$OPSARENA_EXEC true` loops; its host handle has the default
  per-competitor cap and rate (`agents.throttle.DEFAULT_CONCURRENCY`,
  `DEFAULT_RATE_PER_S`, `DEFAULT_BURST`);
- storm, cap only: the default concurrency cap, no rate limit (the arena before the rate);
- storm, neither: the cap raised to W and no rate limit (the arena before issue 12).
The neighbour is the `reference` builder on a fresh host, judged by the referee from its
start, through its own capped handle. Reported: its start -> durable verdict, its two
fault times, and how many execs the storm got done per second.
Needs podman, bubblewrap and the host image; uses its own match ids, removes its hosts,
and writes bench/results/exec_storm.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opsarena.agents.base import AgentContext
from opsarena.agents.command import CommandAgent
from opsarena.agents.scripted import get_scripted
from opsarena.agents.throttle import DEFAULT_CONCURRENCY, DEFAULT_RATE_PER_S, ThrottledHost
from opsarena.challenges import Challenge, builtin_challenge
from opsarena.hosts import DEFAULT_IMAGE, Host, HostSpec, get_driver
from opsarena.referee.referee import Referee

STORM = """#!/bin/bash
for i in $(seq {width}); do
  (while true; do $OPSARENA_EXEC true >/dev/null 2>&1; done) &
done
wait
"""


async def quiet_emit(kind: str, data: dict[str, Any]) -> None:
    return None


async def neighbour_to_durable(challenge: Challenge, match_id: str, run: int) -> dict[str, float]:
    driver = get_driver("podman")
    host = await driver.create(
        HostSpec(match_id=match_id, territory=f"ref{run}", image=DEFAULT_IMAGE)
    )
    try:
        started = time.monotonic()
        referee = Referee(
            challenge, seed=secrets.token_bytes(16), emit=quiet_emit,
            clock=lambda: int((time.monotonic() - started) * 1000),
        )  # fmt: skip
        referee.add_territory("ref", host)
        judging = asyncio.create_task(referee.run())
        context = AgentContext(
            match_id=match_id, territory="ref", brief=challenge.brief,
            host=ThrottledHost(host), deadline=time.monotonic() + 180,
            params={"port": challenge.port, "unit": challenge.unit},
        )  # fmt: skip
        await get_scripted("reference").run(context)
        async with asyncio.timeout(180):
            await referee.durable_event("ref").wait()
        durable = time.monotonic() - started
        judging.cancel()
        await asyncio.gather(judging, return_exceptions=True)
        restart = referee.milestone_state("ref", "service-restart").evidence or {}
        reboot = referee.milestone_state("ref", "host-reboot").evidence or {}
        return {
            "start_to_durable_s": durable,
            "restart_fault_ms": float(restart.get("fault_ms", 0)),
            "reboot_fault_ms": float(reboot.get("fault_ms", 0)),
        }
    finally:
        await driver.remove(host.name)


async def with_storm(
    challenge: Challenge,
    match_id: str,
    run: int,
    storm_host: Host,
    program: Path,
    cap: int,
    rate: float,
) -> dict[str, float]:
    execs = 0

    async def count(kind: str, data: dict[str, Any]) -> None:
        nonlocal execs
        execs += kind == "transcript"

    ctx = AgentContext(
        match_id=match_id, territory="storm", brief="storm",
        host=ThrottledHost(storm_host, cap, rate=rate),
        deadline=time.monotonic() + 600, report=count,
    )  # fmt: skip
    storm = asyncio.create_task(CommandAgent([str(program)], grace_s=1.0).run(ctx))
    await asyncio.sleep(3.0)  # the storm is at full strength before the neighbour starts
    counted, since = execs, time.monotonic()
    try:
        result = await neighbour_to_durable(challenge, match_id, run)
    finally:
        rate = (execs - counted) / (time.monotonic() - since)
        storm.cancel()
        await asyncio.gather(storm, return_exceptions=True)
    return {**result, "storm_execs_per_s": rate}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--storm-width", type=int, default=16)
    args = parser.parse_args()
    challenge = builtin_challenge("durable-records")
    driver = get_driver("podman")
    match_id = f"bench{secrets.token_hex(4)}"
    workdir = Path(tempfile.mkdtemp(prefix="exec-storm-"))
    program = workdir / "storm.sh"
    program.write_text(STORM.format(width=args.storm_width))
    program.chmod(0o755)
    unlimited = 1e6
    conditions: dict[str, tuple[int, float] | None] = {
        "quiet": None,
        f"storm, defaults (cap {DEFAULT_CONCURRENCY}, {DEFAULT_RATE_PER_S:g}/s)": (
            DEFAULT_CONCURRENCY,
            DEFAULT_RATE_PER_S,
        ),
        f"storm, cap {DEFAULT_CONCURRENCY} only": (DEFAULT_CONCURRENCY, unlimited),
        f"storm, neither (cap {args.storm_width})": (args.storm_width, unlimited),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in conditions}
    load_before = os.getloadavg()
    try:
        storm_host = await driver.create(
            HostSpec(match_id=match_id, territory="storm", image=DEFAULT_IMAGE)
        )
        for run in range(args.runs):
            for name, limits in conditions.items():
                if limits is None:
                    result = await neighbour_to_durable(challenge, match_id, run)
                else:
                    cap, rate = limits
                    result = await with_storm(
                        challenge, match_id, run, storm_host, program, cap, rate
                    )
                results[name].append(result)
                extra = (
                    f", storm {result['storm_execs_per_s']:.1f} execs/s"
                    if "storm_execs_per_s" in result
                    else ""
                )
                print(
                    f"run {run + 1} {name}: start -> durable {result['start_to_durable_s']:.2f} s "
                    f"(restart {result['restart_fault_ms']:.0f} ms, "
                    f"reboot {result['reboot_fault_ms']:.0f} ms){extra}",
                    flush=True,
                )
    finally:
        await driver.cleanup(match_id=match_id)
        program.unlink(missing_ok=True)
        workdir.rmdir()
    summary = {}
    for name, runs in results.items():
        durable = [r["start_to_durable_s"] for r in runs]
        summary[name] = {
            "median_start_to_durable_s": statistics.median(durable),
            "max_start_to_durable_s": max(durable),
            "median_restart_fault_ms": statistics.median(r["restart_fault_ms"] for r in runs),
            "median_reboot_fault_ms": statistics.median(r["reboot_fault_ms"] for r in runs),
            "median_storm_execs_per_s": statistics.median(
                r.get("storm_execs_per_s", 0.0) for r in runs
            ),
        }
        figures = summary[name]
        print(
            f"{name}: neighbour start -> durable median "
            f"{figures['median_start_to_durable_s']:.2f} s, "
            f"max {figures['max_start_to_durable_s']:.2f} s"
        )
    out = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": args.runs,
        "storm_width": args.storm_width,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "summary": summary,
        "results": results,
    }
    path = Path(__file__).with_name("results") / "exec_storm.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"load average before {load_before}, after {os.getloadavg()}; wrote {path}")


if __name__ == "__main__":
    asyncio.run(main())
