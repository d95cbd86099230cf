"""Benchmark zero-downtime-deploy: match clock from the agents' start to the `reference`
builder's verdict, and what the steady load saw during each deploy.

Usage: python bench/zero_downtime.py [--runs N]

For the `reference` builder, N times: a fresh host with the challenge placed (a fresh
seed each run); the referee runs from the start, as in a match, while the builder
installs release v1 and its deploy command. Reported per run: agent start -> verdict
(the match clock a match would show; target <= 15 s), each milestone's passing attempt,
and per deploy the requests sent, failed, p99 latency and the deploy command's duration.
Needs podman and the host image; uses its own match ids and removes its hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
from typing import Any

from opsarena.agents.base import AgentContext
from opsarena.agents.scripted import get_scripted
from opsarena.challenges import Challenge, builtin_challenge
from opsarena.challenges.catalog import place_challenge
from opsarena.hosts import HostSpec, get_driver
from opsarena.hosts.image import image_for
from opsarena.referee.contract import agent_params, brief_for
from opsarena.referee.referee import Referee


async def one_run(challenge: Challenge) -> dict[str, Any]:
    driver = get_driver("podman")
    match_id = f"bench{secrets.token_hex(4)}"
    seed = secrets.token_bytes(16)
    image = image_for(challenge.packages, challenge.image)
    spec = HostSpec(match_id=match_id, territory="ref", image=image)
    host = await driver.create(spec)
    try:
        await place_challenge(challenge, host, seed)
        durations: dict[str, int] = {}

        async def note(kind: str, data: dict[str, Any]) -> None:
            if kind == "attempt_result" and data["verdict"] == "passed":
                durations[data["milestone"]] = data["duration_ms"]

        started = time.monotonic()
        referee = Referee(
            challenge, seed=seed, emit=note,
            clock=lambda: int((time.monotonic() - started) * 1000),
        )  # fmt: skip
        referee.add_territory("ref", host)
        judging = asyncio.create_task(referee.run())
        context = AgentContext(
            match_id=match_id, territory="ref", brief=brief_for(challenge, seed), host=host,
            deadline=time.monotonic() + 120, params=agent_params(challenge, seed),
        )  # fmt: skip
        await get_scripted("reference", challenge.directory).run(context)
        agent_s = time.monotonic() - started
        async with asyncio.timeout(120):
            await referee.durable_event("ref").wait()
        verdict_s = time.monotonic() - started
        judging.cancel()
        await asyncio.gather(judging, return_exceptions=True)
        deploys = [
            d
            for m in ("deploy", "rollback-and-forward")
            for d in (referee.milestone_state("ref", m).evidence or {}).get("deploys", [])
        ]
        return {"verdict_s": verdict_s, "agent_s": agent_s, "durations": durations,
                "deploys": deploys, "points": referee.points("ref")}  # fmt: skip
    finally:
        await driver.cleanup(match_id=match_id)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    challenge = builtin_challenge("zero-downtime-deploy")
    runs = [await one_run(challenge) for _ in range(args.runs)]
    for index, run in enumerate(runs, 1):
        print(
            f"run {index}: {run['points']} points; agent start -> verdict {run['verdict_s']:.2f} s "
            f"(agent done at {run['agent_s']:.2f} s); passing attempts: "
            + ", ".join(f"{m} {ms} ms" for m, ms in run["durations"].items())
            + "; deploys: "
            + ", ".join(
                f"{d['version']}: {d['requests']} requests, {d['failed_requests']} failed, "
                f"p99 {d['p99_ms']} ms, command {d['deploy_ms']} ms"
                for d in run["deploys"]
            )
        )
    verdicts = [run["verdict_s"] for run in runs]
    print(
        f"agent start -> verdict: median {statistics.median(verdicts):.2f} s, "
        f"max {max(verdicts):.2f} s (target <= 15 s)"
    )


if __name__ == "__main__":
    asyncio.run(main())
