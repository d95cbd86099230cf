"""Measure how often a fault attempt catches a service durable only while it thinks the
referee is looking (docs/PERFORMANCE.md, "Fault rounds against cheaters").

Usage: python bench/cheaters.py [--triggers signature,body,...] [--samples N] [--tag T]

On one power-cut host, for each trigger of tests/security/data/cheater_server.py (a
service that acknowledges with nothing fsynced except for 15 s after it sees its
trigger), N fresh referees (seeds `T-TRIGGER-i`) walk crash-safe-records up to the power
cut; each one's first power-cut attempt is recorded: caught (record_missing or
record_corrupted) or passed. Needs podman and the host image; uses its own match id and
removes its host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opsarena.challenges import builtin_challenge
from opsarena.challenges.catalog import place_challenge
from opsarena.hosts import DEFAULT_IMAGE, HostSpec, get_driver
from opsarena.referee.referee import Referee

ROOT = Path(__file__).resolve().parent.parent
CHEATER = ROOT / "tests" / "security" / "data" / "cheater_server.py"
UNIT = """[Unit]
Description=records service (durable only when it thinks it is watched)

[Service]
ExecStart=/usr/bin/python3 /opt/cheat/server.py --trigger {trigger}
Restart=always
RestartSec=0.1

[Install]
WantedBy=multi-user.target
"""
DEPLOY = """set -e
systemctl stop builder-app.service 2>/dev/null || true
rm -rf /var/lib/cheat
systemctl daemon-reload
systemctl enable --now builder-app.service
sleep 1
sync
"""


async def quiet_emit(kind: str, data: dict[str, Any]) -> None:
    return None


def clock_from_now() -> Callable[[], int]:
    started = time.monotonic()
    return lambda: int((time.monotonic() - started) * 1000)


async def main(triggers: list[str], samples: int, tag: str) -> dict[str, list[int]]:
    driver = get_driver("podman")
    match_id = "bc" + secrets.token_hex(4)
    challenge = builtin_challenge("crash-safe-records")
    totals: dict[str, list[int]] = {}
    try:
        host = await driver.create(
            HostSpec(match_id=match_id, territory="a", image=DEFAULT_IMAGE, power_cut=True)
        )
        await host.write_file("/opt/cheat/server.py", CHEATER.read_bytes())
        for trigger in triggers:
            unit = UNIT.format(trigger=trigger).encode()
            await host.write_file("/etc/systemd/system/builder-app.service", unit)
            deployed = await host.exec(DEPLOY, timeout=120)
            if not deployed.ok:
                raise RuntimeError(f"the cheater did not deploy: {deployed.stderr[-300:]!r}")
            caught = 0
            for i in range(samples):
                seed = f"{tag}-{trigger}-{i}".encode()
                await place_challenge(challenge, host, seed)
                referee = Referee(challenge, seed=seed, emit=quiet_emit, clock=clock_from_now())
                referee.add_territory("a", host)
                while (m := referee.first_unpassed("a")) is not None and m.id != "power-cut":
                    verdict = await referee.evaluate_next("a")
                    if verdict is None or verdict.outcome != "passed":
                        raise RuntimeError(f"{trigger}: {m.id} did not pass: {verdict}")
                verdict = await referee.evaluate_next("a")
                assert verdict is not None
                got = verdict.outcome == "failed" and verdict.failure_reason in (
                    "record_missing", "record_corrupted"
                )  # fmt: skip
                caught += got
                evidence = verdict.evidence or {}
                print(
                    trigger, i, "caught" if got else verdict.outcome, verdict.failure_reason,
                    evidence.get("fault_after_acknowledged"), evidence.get("decoys"), flush=True,
                )  # fmt: skip
            totals[trigger] = [caught, samples]
            print(trigger, f"caught {caught} of {samples}", flush=True)
    finally:
        await driver.cleanup(match_id=match_id)
    return totals


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--triggers", default="signature,body,concurrent,overwrite")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tag", default="bench")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.triggers.split(","), args.samples, args.tag))))
