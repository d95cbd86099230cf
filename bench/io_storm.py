"""A neighbour's time to durable, and the arena's log's, while another host runs an
O_DIRECT + fsync storm: with the per-host write caps (`hosts/disk.py`) and without.

Run: `python bench/io_storm.py [--rounds 4] [--seconds 8] [--json bench/results/io_storm.json]`.

Each round boots, for each configuration in turn (capped: the driver's default caps;
uncapped: `disk_write_mbps=0, disk_write_iops=0`), a storm host and a neighbour host.
The storm host writes 1 MiB blocks with O_DIRECT and fsyncs after each, over and over,
for `--seconds`; meanwhile the neighbour writes 4 KiB and fsyncs (a record made
durable) in a loop, and this process does the same on the machine's own disk, as the
arena's event log does at every commit. Also measured without any storm (quiet). Hosts
are removed by match id after each configuration; nothing else is touched.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from opsarena.hosts import DEFAULT_IMAGE, Host, HostSpec, get_driver
from opsarena.hosts.base import DEFAULT_WRITE_IOPS, DEFAULT_WRITE_MBPS

STORM = """
import mmap, os, sys, time
fd = os.open("/var/storm", os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
block = mmap.mmap(-1, 1 << 20); block.write(b"s" * (1 << 20))
end = time.monotonic() + float(sys.argv[1]); n = 0
while time.monotonic() < end:
    os.pwrite(fd, block, (n % 32) << 20); os.fsync(fd); n += 1
print(n)
"""

DURABLE = """
import json, os, sys, time
fd = os.open("/var/records", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
end = time.monotonic() + float(sys.argv[1]); out = []
while time.monotonic() < end:
    t = time.perf_counter(); os.write(fd, b"r" * 4096); os.fsync(fd)
    out.append((time.perf_counter() - t) * 1000); time.sleep(0.005)
print(json.dumps(out))
"""


def durable_on_machine(seconds: float, directory: str) -> list[float]:
    """4 KiB appended and fsynced on the machine's disk in a loop (the event log's
    commit), milliseconds each."""
    out = []
    with tempfile.NamedTemporaryFile(dir=directory) as log:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            os.write(log.fileno(), b"l" * 4096)
            os.fsync(log.fileno())
            out.append((time.perf_counter() - started) * 1000)
            time.sleep(0.005)
    return out


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, round(0.99 * len(ordered)))], 2),
        "max_ms": round(ordered[-1], 2),
    }


async def run_config(capped: bool, seconds: float, log_dir: str) -> dict[str, Any]:
    driver = get_driver("podman")
    match_id = f"io{secrets.token_hex(4)}"
    caps = {} if capped else {"disk_write_mbps": 0, "disk_write_iops": 0}
    try:
        storm, neighbour = await asyncio.gather(
            *(
                driver.create(
                    HostSpec(match_id=match_id, territory=t, image=DEFAULT_IMAGE, **caps)  # type: ignore[arg-type]
                )
                for t in ("storm", "neighbour")
            )
        )
        await neighbour.write_file("/opt/durable.py", DURABLE.encode())
        await storm.write_file("/opt/storm.py", STORM.encode())
        quiet = await measure(neighbour, None, seconds / 2, log_dir)
        loud = await measure(neighbour, storm, seconds, log_dir)
        return {"quiet": quiet, "storm": loud}
    finally:
        await driver.cleanup(match_id=match_id)


async def measure(
    neighbour: Host, storm: Host | None, seconds: float, log_dir: str
) -> dict[str, Any]:
    storming = (
        asyncio.ensure_future(
            storm.exec(f"python3 /opt/storm.py {seconds + 1}", timeout=seconds + 60)
        )
        if storm is not None
        else None
    )
    await asyncio.sleep(0.5 if storm is not None else 0)
    host_side = asyncio.ensure_future(
        neighbour.exec(f"python3 /opt/durable.py {seconds}", timeout=seconds + 60)
    )
    machine = await asyncio.to_thread(durable_on_machine, seconds, log_dir)
    result = await host_side
    out: dict[str, Any] = {
        "neighbour_ms": json.loads(result.stdout),
        "machine_ms": machine,
    }
    if storming is not None:
        blocks = int((await storming).stdout or 0)
        out["storm_mib_per_s"] = round(blocks / (seconds + 1), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path, default=Path("bench/results/io_storm.json"))
    parser.add_argument("--log-dir", default="/var/tmp", help="the machine's disk")
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    samples: dict[str, dict[str, list[float]]] = {}
    rates: dict[str, list[float]] = {"capped": [], "uncapped": []}
    for _round in range(args.rounds):
        for capped in (True, False):
            name = "capped" if capped else "uncapped"
            got = asyncio.run(run_config(capped, args.seconds, args.log_dir))
            for phase in ("quiet", "storm"):
                for who in ("neighbour_ms", "machine_ms"):
                    key = f"{name} {phase} {who.removesuffix('_ms')}"
                    samples.setdefault(key, {"ms": []})["ms"].extend(got[phase][who])
            rates[name].append(got["storm"]["storm_mib_per_s"])
            print(name, "storm MiB/s", got["storm"]["storm_mib_per_s"], flush=True)
    table = {key: quantiles(value["ms"]) for key, value in sorted(samples.items())}
    for key, row in table.items():
        print(f"{key:32} {row}")
    report = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "date": started,
        "load_at_start": load_at_start,
        "load_at_end": os.getloadavg(),
        "caps": {"mib_per_s": DEFAULT_WRITE_MBPS, "iops": DEFAULT_WRITE_IOPS},
        "rounds": args.rounds,
        "seconds": args.seconds,
        "storm_mib_per_s": rates,
        "fsync_latency": table,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
