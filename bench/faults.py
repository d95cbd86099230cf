"""Measure the crash and power-cut faults, for docs/PERFORMANCE.md.

Usage: python bench/faults.py [--runs N] [--trials N] [--out PATH] [--only STEP]

1. Provision of a power-cut-capable host (`HostSpec(power_cut=True)`) vs an ordinary
   one, N each.
2. On one `reference` host with the power-cut disk: crash → new main process
   (`crash_service`), power cut → ready (`power_cut`), N each; the reference service's
   PUT latency (HTTP through `Host.connect`, fsync + rename + directory fsync) on that
   disk vs on an ordinary host.
3. Loss rates, `--trials` trials per builder: 10 records PUT and acknowledged, then the
   builder's fault (power cut for reference/no-fsync/fsync-no-dirsync, crash for
   ack-before-write), then every record read back over HTTP. A trial "loses" when any
   acknowledged record is missing or wrong.
Needs podman and the host image; uses its own match id and removes its hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from opsarena.agents.scripted import get_scripted
from opsarena.agents.scripted.deploy import service_target
from opsarena.challenges.catalog import builtin_root
from opsarena.hosts import DEFAULT_IMAGE, Host, HostDriver, HostSpec, get_driver
from opsarena.referee.probe import ProbeError, http_request

TARGET = service_target({})
RECORDS_PER_TRIAL = 10
FAULT_OF = {
    "reference": "power-cut",
    "no-fsync": "power-cut",
    "fsync-no-dirsync": "power-cut",
    "ack-before-write": "crash",
}


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    return {"runs": len(ordered), "p50": pick(0.5), "p90": pick(0.9), "max": round(ordered[-1], 1)}


async def timed(coro: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = await coro
    return result, (time.monotonic() - started) * 1000


async def deploy(driver: HostDriver, match_id: str, territory: str, builder: str,
                 *, power_cut: bool) -> Host:  # fmt: skip
    host = await driver.create(HostSpec(
        match_id=match_id, territory=territory, image=DEFAULT_IMAGE, power_cut=power_cut
    ))  # fmt: skip
    builder_of = get_scripted(builder, builtin_root() / "crash-safe-records")
    result = await builder_of.deploy(host, TARGET, wait_seconds=30.0)
    if result is None or not result.ok:
        raise RuntimeError(f"{builder} did not deploy: {result and result.stderr[-300:]!r}")
    await host.exec("sync", timeout=60)
    return host


async def wait_serving(host: Host) -> None:
    for _ in range(400):
        try:
            if (await http_request(host, TARGET.port, "GET", "/health")).status == 200:
                return
        except ProbeError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("service did not come back")


async def put(host: Host, record_id: str, value: bytes) -> float:
    response = await http_request(host, TARGET.port, "PUT", f"/records/{record_id}", body=value)
    if not 200 <= response.status < 300:
        raise RuntimeError(f"PUT answered {response.status}")
    return float(response.elapsed_ms)


async def provision(driver: HostDriver, match_id: str, runs: int) -> dict[str, Any]:
    out: dict[str, list[float]] = {"ordinary": [], "power-cut": []}
    for index in range(runs):
        for kind in out:
            spec = HostSpec(match_id=match_id, territory=f"p{index}{kind[0]}",
                            image=DEFAULT_IMAGE, power_cut=kind == "power-cut")  # fmt: skip
            host, ms = await timed(driver.create(spec))
            out[kind].append(ms)
            await driver.remove(host.name)
    return {kind: summary(values) for kind, values in out.items()}


async def fault_times(driver: HostDriver, match_id: str, runs: int) -> dict[str, Any]:
    host = await deploy(driver, match_id, "ft", "reference", power_cut=True)
    crash, crash_call, cut = [], [], []
    for _ in range(runs):
        _, ms = await timed(host.crash_service(TARGET.unit))
        crash_call.append(ms)
        crash.append(float(getattr(host, "last_crash_restart_ms", None) or ms))
        await wait_serving(host)
        _, ms = await timed(host.power_cut())
        cut.append(ms)
        await wait_serving(host)
    return {
        "crash_to_new_main": summary(crash),
        "crash_service_call": summary(crash_call),
        "power_cut_to_ready": summary(cut),
    }


async def put_latency(driver: HostDriver, match_id: str, runs: int) -> dict[str, Any]:
    out = {}
    for kind in ("ordinary", "power-cut"):
        host = await deploy(driver, match_id, f"lat{kind[0]}", "reference",
                            power_cut=kind == "power-cut")  # fmt: skip
        values = [await put(host, f"lat-{i}", os.urandom(1024)) for i in range(runs)]
        out[kind] = summary(values)
        await driver.remove(host.name)
    out["ratio_p50"] = round(out["power-cut"]["p50"] / max(out["ordinary"]["p50"], 0.1), 2)
    return out


async def loss_rates(driver: HostDriver, match_id: str, trials: int) -> dict[str, Any]:
    out = {}
    for builder, fault in FAULT_OF.items():
        host = await deploy(driver, match_id, f"loss{len(out)}", builder, power_cut=True)
        lost_trials, lost_records, acked = 0, 0, 0
        for trial in range(trials):
            records = {f"t{trial}-r{i}": secrets.token_bytes(64) for i in range(RECORDS_PER_TRIAL)}
            for record_id, value in records.items():
                await put(host, record_id, value)
            acked += len(records)
            if fault == "power-cut":
                await host.power_cut()
            else:
                await host.crash_service(TARGET.unit)
            await wait_serving(host)
            lost = 0
            for record_id, value in records.items():
                got = await http_request(host, TARGET.port, "GET", f"/records/{record_id}")
                lost += (got.status, got.body) != (200, value)
            lost_trials += lost > 0
            lost_records += lost
        out[builder] = {"fault": fault, "trials": trials, "trials_with_loss": lost_trials,
                        "records_acknowledged": acked, "records_lost": lost_records}  # fmt: skip
        await driver.remove(host.name)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("bench/results/faults.json"))
    parser.add_argument("--only", choices=["provision", "faults", "put_latency", "loss"])
    args = parser.parse_args()
    driver = get_driver("podman")
    match_id = f"bench{secrets.token_hex(3)}"
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_start": os.getloadavg(),
    }
    try:
        steps = {
            "provision": lambda: provision(driver, match_id, args.runs),
            "faults": lambda: fault_times(driver, match_id, args.runs),
            "put_latency": lambda: put_latency(driver, match_id, 50),
            "loss": lambda: loss_rates(driver, match_id, args.trials),
        }
        for name, step in steps.items():
            if args.only not in (None, name):
                continue
            results[name] = await step()
            print(name, json.dumps(results[name]), file=sys.stderr, flush=True)
    finally:
        await driver.cleanup(match_id=match_id)
    results["load_average_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
