"""Benchmark of the host layer: provisioning, exec, reboots and the referee's probe path.

Run: `python bench/hosts.py [--runs 20] [--json bench/results/hosts.json]`.
Prints p50/p90/max per operation and writes the figures, with the machine, as JSON.
The naive probe (`podman exec HOST curl ...`) is measured in the same run, so the
ratio compares like with like. So is the cost of the hosts' confinement: provision,
clean reboot and probe are also measured, interleaved, for hosts made without it (no
user namespace of their own, no start hook, podman's default seccomp profile), the way
hosts were made before issue 12 (`unconfined_*` rows). `restart_service` (over the
host's bus, confirmed from its cgroup) is measured too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from opsarena.hosts import DEFAULT_IMAGE, Host, HostDriver, HostSpec, get_driver
from opsarena.hosts.podman import PodmanDriver

UNIT = (
    "[Service]\nExecStart=/usr/bin/python3 /opt/bench/server.py\nRestart=always\n"
    "[Install]\nWantedBy=multi-user.target\n"
)

SERVER = (
    "import http.server\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.send_header('Content-Length', '5')\n"
    "        self.end_headers(); self.wfile.write(b'ready')\n"
    "    def log_message(self, *args): pass\n"
    "http.server.ThreadingHTTPServer(('127.0.0.1', 8080), H).serve_forever()\n"
)
REQUEST = b"GET /health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"


def summary(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    p90_index = max(0, round(0.9 * len(ordered)) - 1)
    return {
        "runs": len(ordered),
        "p50_ms": round(statistics.median(ordered), 2),
        "p90_ms": round(ordered[p90_index], 2),
        "max_ms": round(ordered[-1], 2),
    }


async def timed(runs: int, action: Callable[[], Awaitable[Any]]) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        await action()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


async def probe(host: Host) -> None:
    reader, writer = await host.connect(8080, timeout=5)
    try:
        writer.write(REQUEST)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"ready"), answer
    finally:
        writer.close()


def naive_probe(host_name: str) -> None:
    podman = shutil.which("podman") or "podman"
    out = subprocess.run(
        [podman, "exec", host_name, "curl", "-sf", "http://127.0.0.1:8080/health"],
        capture_output=True, check=True, timeout=30,
    )  # fmt: skip
    assert out.stdout == b"ready", out


def machine() -> dict[str, Any]:
    podman = subprocess.run(["podman", "--version"], capture_output=True, text=True, check=False)
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "os": platform.freedesktop_os_release().get("PRETTY_NAME", platform.system()),
        "python": platform.python_version(),
        "podman": podman.stdout.strip(),
    }


def unconfined(driver: HostDriver) -> HostDriver | None:
    """The same driver making hosts without issue 12's confinement (for comparison)."""
    if not isinstance(driver, PodmanDriver):
        return None
    plain = PodmanDriver()
    plain.podman.confine_flags = []
    plain.podman.global_flags = []
    plain.podman.own_disks = False  # a disk of its own would map its ids (issue 23)
    return plain


async def serve(host: Host) -> None:
    await host.write_file("/opt/bench/server.py", SERVER.encode())
    await host.write_file("/etc/systemd/system/bench-http.service", UNIT.encode())
    started = await host.exec(
        "systemctl daemon-reload && systemctl enable --now bench-http && for i in $(seq 200); "
        "do curl -sf localhost:8080/health >/dev/null && exit 0; sleep 0.05; done; exit 1",
        timeout=30,
    )
    assert started.exit_code == 0, started.stderr


async def bench(driver: HostDriver, runs: int, image: str) -> dict[str, dict[str, float]]:
    match_id = f"bench{secrets.token_hex(3)}"
    plain = unconfined(driver)
    variants = [("", driver)] + ([("unconfined_", plain)] if plain else [])
    results: dict[str, dict[str, float]] = {}
    try:
        provision: dict[str, list[float]] = {prefix: [] for prefix, _ in variants}
        for index in range(runs):
            for prefix, maker in variants:  # interleaved: both see the same load
                spec = HostSpec(match_id=match_id, territory=f"{prefix}p{index}", image=image)
                start = time.perf_counter()
                made = await maker.create(spec)
                provision[prefix].append((time.perf_counter() - start) * 1000)
                await maker.remove(made.name)
        for prefix, samples in provision.items():
            results[f"{prefix}provision_to_ready"] = summary(samples)

        hosts = {}
        for prefix, maker in variants:
            spec = HostSpec(match_id=match_id, territory=f"{prefix}main", image=image)
            hosts[prefix] = await maker.create(spec)
        host = hosts[""]
        results["exec_round_trip"] = summary(
            await timed(runs * 2, lambda: host.exec(["true"], timeout=10))
        )
        reboots: dict[str, list[float]] = {prefix: [] for prefix in hosts}
        for _ in range(runs):
            for prefix, each in hosts.items():
                reboots[prefix] += await timed(1, lambda each=each: each.reboot())  # type: ignore[misc]
        for prefix, samples in reboots.items():
            results[f"{prefix}clean_reboot_to_ready"] = summary(samples)
        results["hard_reboot_to_ready"] = summary(await timed(runs, lambda: host.reboot(hard=True)))

        for each in hosts.values():
            await serve(each)
            await timed(5, lambda each=each: probe(each))  # type: ignore[misc]  # warm-up
        probes: dict[str, list[float]] = {prefix: [] for prefix in hosts}
        for _ in range(runs * 5):
            for prefix, each in hosts.items():
                probes[prefix] += await timed(1, lambda each=each: probe(each))  # type: ignore[misc]
        for prefix, samples in probes.items():
            results[f"{prefix}probe_connect_get"] = summary(samples)
        results["naive_probe_podman_exec_curl"] = summary(
            await timed(runs, lambda: asyncio.to_thread(naive_probe, host.name))
        )
        results["restart_service"] = summary(
            await timed(runs, lambda: host.restart_service("bench-http.service"))
        )
        results["wait_ready_when_running"] = summary(
            await timed(runs * 2, lambda: host.wait_ready(10))
        )
    finally:
        await driver.cleanup(match_id=match_id)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per operation (>= 20)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/hosts.json"))
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--driver", default="podman")
    args = parser.parse_args()
    results = asyncio.run(bench(get_driver(args.driver), args.runs, args.image))
    probe_p50 = results["probe_connect_get"]["p50_ms"]
    naive_p50 = results["naive_probe_podman_exec_curl"]["p50_ms"]
    report = {
        "benchmark": "hosts",
        "driver": args.driver,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "results": results,
        "naive_over_probe_p50_ratio": round(naive_p50 / probe_p50, 1),
        "load_average_1_5_15": list(os.getloadavg()),
    }
    table = Table("operation", "runs", "p50 ms", "p90 ms", "max ms", title="opsarena hosts")
    for name, figures in results.items():
        table.add_row(
            name, str(figures["runs"]), f"{figures['p50_ms']:.1f}", f"{figures['p90_ms']:.1f}",
            f"{figures['max_ms']:.1f}",
        )  # fmt: skip
    console = Console()
    console.print(table)
    console.print(f"naive probe / connect() probe, p50: {report['naive_over_probe_p50_ratio']}x")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"written to {args.json}")


if __name__ == "__main__":
    main()
