"""Benchmark of the `opsarena` Inspect sandbox: what its in-host wrappers cost per exec.

Run: `python bench/inspect_sandbox.py [--runs 20] [--json bench/results/inspect_sandbox.json]`.
Measures, on one host, `Host.exec(["true"])` (the driver's round trip), the sandbox's
`exec(["true"])` (the same plus `env -C`, a transient systemd scope and `env`), the
sandbox's `exec` as another user (plus `runuser`), and a `read_file`/`write_file` of
1 KiB, interleaved so load affects them alike. Needs the `inspect` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import time
from pathlib import Path
from typing import Any

from opsarena.hosts import get_driver
from opsarena.integrations.inspect.sandbox import (
    OpsarenaSandboxConfig,
    OpsarenaSandboxEnvironment,
)

try:  # run as a script (`python bench/inspect_sandbox.py`) or as a module
    from hosts import summary
except ImportError:  # pragma: no cover
    from bench.hosts import summary


async def main(runs: int, out: Path | None) -> dict[str, Any]:
    prefix = f"inspect-bench{secrets.token_hex(3)}-"
    config = OpsarenaSandboxConfig(match_prefix=prefix)
    environments = await OpsarenaSandboxEnvironment.sample_init("bench", config, {})
    sandbox = environments["default"]
    assert isinstance(sandbox, OpsarenaSandboxEnvironment)
    samples: dict[str, list[float]] = {
        "Host.exec(['true'])": [],
        "sandbox exec(['true'])": [],
        "sandbox exec(['true'], user='nobody')": [],
        "sandbox write_file 1 KiB": [],
        "sandbox read_file 1 KiB": [],
    }
    actions = [
        lambda: sandbox.host.exec(["true"], timeout=30),
        lambda: sandbox.exec(["true"]),
        lambda: sandbox.exec(["true"], user="nobody"),
        lambda: sandbox.write_file("bench.txt", "x" * 1024),
        lambda: sandbox.read_file("bench.txt"),
    ]
    try:
        for _ in range(runs):
            for name, action in zip(samples, actions, strict=True):
                start = time.perf_counter()
                await action()
                samples[name].append((time.perf_counter() - start) * 1000)
    finally:
        await OpsarenaSandboxEnvironment.sample_cleanup("bench", config, environments, False)
        driver = get_driver("podman")
        for info in await driver.list():
            if info.match_id.startswith(prefix):
                await driver.remove(info.name)
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "operations": {name: summary(values) for name, values in samples.items()},
    }
    for name, figures in result["operations"].items():
        print(f"{name:40} p50 {figures['p50_ms']:8.1f} ms  p90 {figures['p90_ms']:8.1f} ms")
    print(f"load average {result['load_average']}")
    if out is not None:
        out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.json))
