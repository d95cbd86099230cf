"""Benchmark what exec output floods cost the controller: its CPU, and a neighbour's
deployment time, while a command agent runs two `cat /dev/zero` execs at once.

Usage: python bench/exec_flood.py [--runs N] [--window S]

Each run has three conditions, interleaved so the machine's load reaches all alike:
- quiet: the neighbour deploys alone (the flooder's host is up and idle);
- flood, drained: next door a command agent (confined, through its gate, with the
  default per-competitor cap and rate) loops two `$OPSARENA_EXEC 'cat /dev/zero'` at
  once, and the arena reads each exec's output past its 1 MiB limit away until the exec's
  timeout (`OPSARENA_EXEC_TIMEOUT` 30 s): the arena before issue 23 (`run_process`
  without `on_overflow`);
- flood, ended: the same, with each exec ended at its output limit (the arena now).
Measured over `--window` seconds of flood (the neighbour deploys inside it): this
process's CPU (the controller's part: the gate, the readers), the whole machine's busy
CPU (from /proc/stat), the bytes this process read (`rchar`: what the drain costs,
whatever the machine's load lets it reach), how many floods ran, and the neighbour's
deployment time (the
`reference` builder's run on a fresh host, through its own capped handle).
Needs podman, bubblewrap and the host image; uses its own match ids, removes its hosts,
and writes bench/results/exec_flood.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import opsarena.hosts.podman.cli as podman_cli
from opsarena.agents.base import AgentContext
from opsarena.agents.command import CommandAgent
from opsarena.agents.scripted import get_scripted
from opsarena.agents.throttle import ThrottledHost
from opsarena.challenges import builtin_challenge
from opsarena.hosts import DEFAULT_IMAGE, Host, HostSpec, get_driver
from opsarena.hosts.process import run_process

FLOOD = """#!/bin/bash
export OPSARENA_EXEC_TIMEOUT=30
for i in 1 2; do
  (while true; do $OPSARENA_EXEC 'cat /dev/zero' >/dev/null 2>&1; done) &
done
wait
"""


def machine_busy() -> float:
    """Seconds of CPU the whole machine has spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_reads() -> int:
    """Bytes this process has read (`rchar`: files, pipes and sockets alike)."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def own_cpu() -> float:
    times = os.times()
    return times.user + times.system


@contextlib.contextmanager
def drained() -> Iterator[None]:
    """Execs read past their output limit until they end: the arena before issue 23."""

    async def without_ending(*args: Any, on_overflow: Any = None, **kwargs: Any) -> Any:
        return await run_process(*args, **kwargs)

    with mock.patch.object(podman_cli, "run_process", without_ending):
        yield


async def neighbour_deploys(match_id: str, run: int, name: str) -> float:
    challenge = builtin_challenge("durable-records")
    driver = get_driver("podman")
    host = await driver.create(
        HostSpec(match_id=match_id, territory=f"n{run}{name[:1]}", image=DEFAULT_IMAGE)
    )
    try:
        context = AgentContext(
            match_id=match_id, territory="neighbour", brief=challenge.brief,
            host=ThrottledHost(host), deadline=time.monotonic() + 180,
            params={"port": challenge.port, "unit": challenge.unit},
        )  # fmt: skip
        started = time.monotonic()
        outcome = await get_scripted("reference").run(context)
        assert outcome.successful, outcome
        return time.monotonic() - started
    finally:
        await driver.remove(host.name)


async def condition(
    match_id: str, run: int, name: str, flood_host: Host | None, program: Path, window: float
) -> dict[str, float]:
    floods = 0

    async def count(kind: str, data: dict[str, Any]) -> None:
        nonlocal floods
        floods += kind == "transcript" and data["entry"].get("kind") == "exec_request"

    storm = None
    if flood_host is not None:
        ctx = AgentContext(
            match_id=match_id, territory="flood", brief="flood",
            host=ThrottledHost(flood_host), deadline=time.monotonic() + 600, report=count,
        )  # fmt: skip
        storm = asyncio.create_task(CommandAgent([str(program)], grace_s=1.0).run(ctx))
        await asyncio.sleep(3.0)  # both floods are running before the window opens
    cpu, busy, reads, since = own_cpu(), machine_busy(), own_reads(), time.monotonic()
    try:
        deploy = await neighbour_deploys(match_id, run, name)
        await asyncio.sleep(max(0.0, window - (time.monotonic() - since)))
        elapsed = time.monotonic() - since
        result = {
            "neighbour_deploy_s": deploy,
            "controller_cpu_pct": 100 * (own_cpu() - cpu) / elapsed,
            "controller_read_mb_per_s": (own_reads() - reads) / elapsed / 1e6,
            "machine_busy_pct": 100 * (machine_busy() - busy) / elapsed,
            "floods_started": float(floods),
        }
    finally:
        if storm is not None:
            storm.cancel()
            await asyncio.gather(storm, return_exceptions=True)
    return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--window", type=float, default=20.0)
    args = parser.parse_args()
    driver = get_driver("podman")
    match_id = f"bench{secrets.token_hex(4)}"
    workdir = Path(tempfile.mkdtemp(prefix="exec-flood-"))
    program = workdir / "flood.sh"
    program.write_text(FLOOD)
    program.chmod(0o755)
    names = ["quiet", "flood, drained (before)", "flood, ended (now)"]
    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    load_before = os.getloadavg()
    try:
        flood_host = await driver.create(
            HostSpec(match_id=match_id, territory="flood", image=DEFAULT_IMAGE)
        )
        for run in range(args.runs):
            for name in names:
                host = None if name == "quiet" else flood_host
                with drained() if "drained" in name else contextlib.nullcontext():
                    result = await condition(match_id, run, name, host, program, args.window)
                results[name].append(result)
                print(
                    f"run {run + 1} {name}: neighbour deploy {result['neighbour_deploy_s']:.2f} s, "
                    f"controller {result['controller_cpu_pct']:.1f} % of a core, "
                    f"{result['controller_read_mb_per_s']:.1f} MB/s read, machine "
                    f"{result['machine_busy_pct']:.0f} %, {result['floods_started']:.0f} floods",
                    flush=True,
                )
    finally:
        await driver.cleanup(match_id=match_id)
        program.unlink(missing_ok=True)
        workdir.rmdir()
    summary = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in results.items()
    }
    for name, figures in summary.items():
        print(f"{name}: medians {figures}")
    out = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": args.runs,
        "window_s": args.window,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "summary": summary,
        "results": results,
    }
    target = Path(__file__).parent / "results" / "exec_flood.json"
    target.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    asyncio.run(main())
