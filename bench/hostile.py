"""Measure the referee against hostile services and hostile competitors, for
docs/RELIABILITY.md.

Usage: python bench/hostile.py [--rounds N] [--attack-s S] [--out PATH]

1. Hostile services (tests/hardening/data/hostile_server.py in a real host): each
   case's failure_reason and wall time through the `health` check, and the traced
   memory peak of one probe for the cases that would grow memory without limits.
   Then a full referee judging a territory that never answers beside a responsive
   neighbour: the neighbour's attempt intervals.
2. Hostile competitors: a fork bomb, a memory hog and a /tmp fill, each N rounds in a
   fresh attacker host, while a full referee judges it and a responsive neighbour: the
   neighbour's attempt intervals (p50/p99/max), the arena event loop's worst lag, the
   neighbour's `exec true` times, and the attacker's process peak and verdict reasons.
Needs podman and the host image; uses its own match id and removes its hosts. Reuses
the hardening suite's cases (run from the repository root).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.hardening

from tests.hardening.hostile import (
    CASES,
    HEALTHY_PORT,
    MEMORY_CASES,
    PORTS,
    SEED,
    AttemptClock,
    neighbour_under_attack,
    on_port,
    percentile,
    run_check,
    start_hostile_server,
)
from tests.hardening.test_hostile_competitors import FORK_BOMB, MEMORY_HOG, TMP_FILL

from opsarena.challenges import Challenge, builtin_challenge
from opsarena.hosts import DEFAULT_IMAGE, HostDriver, HostSpec, get_driver
from opsarena.referee.failures import classify_error
from opsarena.referee.probe import ProbeError, ProbeLimits, http_request
from opsarena.referee.referee import Referee

ATTACKS: dict[str, tuple[str, dict[str, int]]] = {
    "fork bomb": (FORK_BOMB, {"pids_limit": 512}),
    "memory hog": (MEMORY_HOG, {"memory_mb": 256}),
    "tmp fill": (TMP_FILL, {"memory_mb": 256}),
}


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50_s": round(percentile(values, 50), 3),
        "p99_s": round(percentile(values, 99), 3),
        "max_s": round(max(values), 3),
    }


async def services(driver: HostDriver, match_id: str, challenge: Challenge) -> dict[str, Any]:
    host = await driver.create(HostSpec(match_id, "hostile", DEFAULT_IMAGE))
    neighbour = await driver.create(HostSpec(match_id, "neighbour", DEFAULT_IMAGE))
    await start_hostile_server(host, {**PORTS, "healthy": HEALTHY_PORT})
    await start_hostile_server(host, {"never-answers": challenge.port}, unit="hostile-main")
    await start_hostile_server(neighbour, {"healthy": challenge.port})
    cases: dict[str, Any] = {}
    for case, expected in CASES.items():
        started = time.monotonic()
        verdict = await run_check(host, on_port(challenge, PORTS[case]), "service-up")
        cases[case] = {
            "expected": expected,
            "reason": verdict.failure_reason,
            "passed": verdict.failure_reason == expected,
            "wall_s": round(time.monotonic() - started, 3),
        }
    m = challenge.milestones[0]
    limits = ProbeLimits(
        m.connect_timeout_s, m.read_timeout_s, m.max_header_bytes, m.max_body_bytes
    )
    for case in MEMORY_CASES:
        tracemalloc.start()
        try:
            await http_request(host, PORTS[case], "GET", "/health", limits=limits)
        except ProbeError as exc:
            assert classify_error(exc).reason == CASES[case]
        finally:
            cases[case]["traced_peak_bytes"] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    clock = AttemptClock()
    referee = Referee(challenge, seed=SEED, emit=clock.emit, clock=lambda: 0)
    referee.add_territory("hostile", host)
    referee.add_territory("neighbour", neighbour)
    judging = asyncio.create_task(referee.run())
    await asyncio.sleep(30)
    judging.cancel()
    await asyncio.gather(judging, return_exceptions=True)
    return {
        "cases": cases,
        "tried": len(cases),
        "passed": sum(c["passed"] for c in cases.values()),
        "neighbour_of_never_answers": summary(clock.intervals("neighbour")[2:]),
    }


async def competitors(
    driver: HostDriver, match_id: str, challenge: Challenge, rounds: int, attack_s: float
) -> dict[str, Any]:
    neighbour = await driver.create(HostSpec(match_id, "calm", DEFAULT_IMAGE))
    await start_hostile_server(neighbour, {"healthy": challenge.port})
    out: dict[str, Any] = {}
    for name, (script, spec) in ATTACKS.items():
        intervals: list[float] = []
        lags: list[float] = []
        execs: list[float] = []
        peaks: list[int] = []
        attacker_reasons: set[str | None] = set()
        neighbour_reasons: set[str | None] = set()
        for index in range(rounds):
            territory = f"{name.replace(' ', '')}{index}"
            attacker = await driver.create(HostSpec(match_id, territory, DEFAULT_IMAGE, **spec))
            try:
                attack = await neighbour_under_attack(
                    attacker, neighbour, challenge, script, attack_s=attack_s
                )
            finally:
                await driver.remove(attacker.name)
            intervals += attack.intervals
            lags += attack.lag.lags
            execs += attack.execs
            peaks.append(attack.peak_processes)
            attacker_reasons |= attack.attacker_reasons
            neighbour_reasons |= attack.neighbour_reasons
        out[name] = {
            "rounds": rounds,
            "attack_s": attack_s,
            "neighbour_intervals": summary(intervals),
            "loop_lag_worst_ms": round(1000 * max(lags, default=0.0), 1),
            "neighbour_exec_true": summary(execs),
            "attacker_peak_processes": max(peaks),
            "attacker_reasons": sorted(r or "passed" for r in attacker_reasons),
            "neighbour_reasons": sorted(r or "passed" for r in neighbour_reasons),
        }
        print(name, json.dumps(out[name]), flush=True)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attack-s", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/hostile.json"))
    args = parser.parse_args()
    challenge = builtin_challenge("durable-records")
    driver = get_driver("podman")
    match_id = f"bench{secrets.token_hex(4)}"
    try:
        result = {"services": await services(driver, match_id, challenge)}
        print("services", json.dumps(result["services"]), flush=True)
        result["competitors"] = await competitors(
            driver, match_id, challenge, args.rounds, args.attack_s
        )
    finally:
        await driver.cleanup(match_id=match_id)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
