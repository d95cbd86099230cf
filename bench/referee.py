"""Benchmark the referee: time from a service's first listen to the durable verdict, and
the referee's own CPU time per territory per second.

Usage: python bench/referee.py [--challenge NAME] [--runs N] [--idle-territories K]
                               [--idle-seconds S]

`--challenge` (default durable-records) benches any built-in challenge's `reference`:
its setup places what it gives each host first, and each run also reports the match
clock (referee and agent started together) to the durable verdict (issue 16's target:
<= 15 s).

1. For the `reference` builder, N times: a fresh host; the referee runs from the start
   (as in a match) while the builder deploys; a 20 ms poller notes when port 8080 first
   accepts a connection. Reported: first listen -> durable verdict, with the default
   cadence and budgets of `durable-records` (target: median <= 3 s), and what one
   passing write-read attempt sends: its requests and the value bytes PUT (the whole
   contract: 1 MiB, binary, parallel writes; request headers add about 150 bytes each).
2. CPU: the same runs' arena-process CPU time (user+sys, `time.process_time`) and that of
   the podman processes it waited for (RUSAGE_CHILDREN), per territory per second; and a
   steady state of K idle territories judged for S seconds (every probe refused).
Needs podman and the host image; uses its own match ids and removes its hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import secrets
import statistics
import time
from typing import Any

from opsarena.agents.base import AgentContext
from opsarena.agents.scripted import get_scripted
from opsarena.challenges import Challenge, builtin_challenge
from opsarena.challenges.catalog import place_challenge
from opsarena.hosts import DEFAULT_IMAGE, FAULT_POWER_CUT, Host, HostSpec, get_driver
from opsarena.referee.contract import agent_params, brief_for
from opsarena.referee.nemesis import faults_needed
from opsarena.referee.referee import Referee

WRITE_READ_REQUESTS = 18 + 15 + 1
"""One write-read attempt's contract: 18 PUTs, 15 GETs of written ids, 1 GET of an
unwritten one (then its seeded `traffic` stretch, not counted here)."""


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def quiet_emit(kind: str, data: dict[str, Any]) -> None:
    return None


async def first_listen(host: Host, port: int) -> float:
    while True:
        try:
            _reader, writer = await host.connect(port, timeout=1.0)
        except OSError:
            await asyncio.sleep(0.02)
            continue
        writer.close()
        return time.monotonic()


async def one_durable_run(challenge: Challenge) -> dict[str, float]:
    driver = get_driver("podman")
    match_id = f"bench{secrets.token_hex(4)}"
    # As the controller does: only a challenge that cuts the power gets a disk that can.
    power_cut = FAULT_POWER_CUT in faults_needed(challenge)
    host = await driver.create(
        HostSpec(match_id=match_id, territory="ref", image=DEFAULT_IMAGE, power_cut=power_cut)
    )
    try:
        seed = secrets.token_bytes(16)
        await place_challenge(challenge, host, seed)
        started = time.monotonic()
        durations: dict[str, int] = {}

        async def note(kind: str, data: dict[str, Any]) -> None:
            if kind == "attempt_result" and data["verdict"] == "passed":
                durations[data["milestone"]] = data["duration_ms"]

        referee = Referee(
            challenge, seed=seed, emit=note,
            clock=lambda: int((time.monotonic() - started) * 1000),
        )  # fmt: skip
        referee.add_territory("ref", host)
        listen = asyncio.create_task(first_listen(host, challenge.port))
        cpu0, child0, wall0 = time.process_time(), children_cpu(), time.monotonic()
        judging = asyncio.create_task(referee.run())
        context = AgentContext(
            match_id=match_id, territory="ref", brief=brief_for(challenge, seed), host=host,
            deadline=time.monotonic() + 120, params=agent_params(challenge, seed),
        )  # fmt: skip
        await get_scripted("reference", challenge.directory).run(context)
        async with asyncio.timeout(120):
            await referee.durable_event("ref").wait()
        durable = time.monotonic()
        cpu, child, wall = time.process_time() - cpu0, children_cpu() - child0, durable - wall0
        judging.cancel()
        listened = await listen
        await asyncio.gather(judging, return_exceptions=True)
        ids = {m.id for m in challenge.milestones}

        def evidence(milestone: str) -> dict[str, Any]:
            if milestone not in ids:
                return {}
            return referee.milestone_state("ref", milestone).evidence or {}

        write_read = evidence("write-read")
        restart = evidence("service-restart")
        reboot = evidence("host-reboot")
        return {
            "listen_to_durable_s": durable - listened,
            "clock_to_durable_s": durable - started,
            "restart_fault_ms": restart.get("fault_ms", 0),
            "reboot_fault_ms": reboot.get("fault_ms", 0),
            "cpu_per_s": cpu / wall,
            "children_cpu_per_s": child / wall,
            "wall_s": wall,
            "write_read_bytes": write_read.get("bytes_sent", 0),
            **{f"{m}_ms": ms for m, ms in durations.items()},
            "reread_after_reboot": reboot.get("reread", 0),
        }
    finally:
        await driver.cleanup(match_id=match_id)


async def idle_cpu(challenge: Challenge, territories: int, seconds: float) -> dict[str, float]:
    driver = get_driver("podman")
    match_id = f"bench{secrets.token_hex(4)}"
    try:
        hosts = [
            await driver.create(HostSpec(match_id=match_id, territory=f"t{i}", image=DEFAULT_IMAGE))
            for i in range(territories)
        ]
        attempts = 0

        async def count(kind: str, data: dict[str, Any]) -> None:
            nonlocal attempts
            attempts += kind == "attempt_result"

        referee = Referee(challenge, seed=b"bench", emit=count, clock=lambda: 0)
        for host in hosts:
            referee.add_territory(host.territory, host)
        cpu0, child0 = time.process_time(), children_cpu()
        judging = asyncio.create_task(referee.run())
        await asyncio.sleep(seconds)
        judging.cancel()
        await asyncio.gather(judging, return_exceptions=True)
        cpu, child = time.process_time() - cpu0, children_cpu() - child0
        return {
            "cpu_ms_per_territory_s": 1000 * cpu / territories / seconds,
            "children_cpu_ms_per_territory_s": 1000 * child / territories / seconds,
            "attempts_per_territory_s": attempts / territories / seconds,
        }
    finally:
        await driver.cleanup(match_id=match_id)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--challenge", default="durable-records")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--idle-territories", type=int, default=4)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    args = parser.parse_args()
    challenge = builtin_challenge(args.challenge)

    runs = [await one_durable_run(challenge) for _ in range(args.runs)]
    for index, run in enumerate(runs, 1):
        print(
            f"run {index} ({challenge.name}): first listen -> durable "
            f"{run['listen_to_durable_s']:.2f} s, match clock -> durable "
            f"{run['clock_to_durable_s']:.2f} s "
            f"(restart fault {run['restart_fault_ms']:.0f} ms, reboot fault "
            f"{run['reboot_fault_ms']:.0f} ms); arena CPU {1000 * run['cpu_per_s']:.0f} ms/s, "
            f"podman children {1000 * run['children_cpu_per_s']:.0f} ms/s "
            f"over {run['wall_s']:.1f} s; passing attempts: "
            + ", ".join(
                f"{m.removesuffix('_ms')} {run[m]:.0f} ms"
                for m in run
                if m.endswith("_ms") and "fault" not in m
            )
            + f"; write-read PUT {run['write_read_bytes']} value "
            f"bytes in {WRITE_READ_REQUESTS} requests (then its traffic stretch); "
            f"{run['reread_after_reboot']:.0f} "
            "records re-read after the reboot"
        )
    to_durable = [run["listen_to_durable_s"] for run in runs]
    clock = [run["clock_to_durable_s"] for run in runs]
    print(
        f"first listen -> durable: median {statistics.median(to_durable):.2f} s, "
        f"max {max(to_durable):.2f} s (target median <= 3 s); match clock -> durable: "
        f"median {statistics.median(clock):.2f} s, max {max(clock):.2f} s (target <= 15 s)"
    )
    if args.idle_territories <= 0:
        return
    idle = await idle_cpu(challenge, args.idle_territories, args.idle_seconds)
    print(
        f"steady state, {args.idle_territories} idle territories for {args.idle_seconds:g} s: "
        f"arena CPU {idle['cpu_ms_per_territory_s']:.1f} ms per territory per s, podman "
        f"children {idle['children_cpu_ms_per_territory_s']:.1f} ms, "
        f"{idle['attempts_per_territory_s']:.2f} attempts per territory per s"
    )


if __name__ == "__main__":
    asyncio.run(main())
