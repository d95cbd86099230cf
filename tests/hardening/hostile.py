"""The hostile-service cases and what the hardening tests and bench/hostile.py share.

`CASES` names each hostile behaviour of `data/hostile_server.py` with the failure_reason
the referee must give it. `start_hostile_server` runs that server inside a host (one
port per behaviour); `run_check` runs one registered check against a port exactly as
the referee would (same limits, same table enforcement); `AttemptClock` records when
the referee started each territory's attempts, to measure its cadence;
`neighbour_under_attack` runs an attack in one host while the referee judges it and a
neighbour, and measures what the neighbour and the arena saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsarena.challenges import Challenge
from opsarena.errors import HostError
from opsarena.hosts import Host
from opsarena.referee.contract import CheckContext, Verdict, get_check
from opsarena.referee.referee import Referee, enforce_table

SERVER = Path(__file__).parent / "data" / "hostile_server.py"
SERVER_PATH = "/opt/hostile_server.py"

CASES: dict[str, str] = {
    "slowloris": "timeout",
    "endless-body": "body_too_large",
    "endless-chunked": "body_too_large",
    "content-length-100gb": "body_too_large",
    "huge-header": "headers_too_large",
    "endless-headers": "headers_too_large",
    "endless-informational": "timeout",
    "invalid-http": "protocol_error",
    "never-answers": "timeout",
    "close-mid-body": "connection_closed",
    "redirect-loop": "bad_status",
    "broken-chunked": "protocol_error",
    "late-answer": "timeout",
    "switching-protocols": "protocol_error",
}
"""Each hostile behaviour and the failure_reason of the `health` check against it."""

MEMORY_CASES = ("endless-body", "endless-chunked", "huge-header", "endless-headers")
"""Cases that would grow the referee's memory without limits."""

PORTS: dict[str, int] = {name: 9100 + index for index, name in enumerate(CASES)}
HEALTHY_PORT = 9090
STAGE_PORT = 9091
REPLAY_PORT = 9092
SEED = b"hardening-seed"


async def start_hostile_server(host: Host, ports: dict[str, int], *, unit: str = "hostile") -> None:
    """Run the hostile server in `host` as transient unit `unit`, one behaviour per port
    of `ports` (name -> port; names as in `hostile_server.BEHAVIOURS`, or `stage`), and
    return once every port accepts connections (AssertionError after 15 s)."""
    await host.write_file(SERVER_PATH, SERVER.read_bytes())
    specs = [f"{name}:{port}" for name, port in ports.items()]
    started = await host.exec(
        ["systemd-run", f"--unit={unit}", "/usr/bin/python3", SERVER_PATH, *specs], timeout=30
    )
    assert started.ok, started.stderr
    deadline = time.monotonic() + 15
    for port in ports.values():
        while True:
            try:
                _reader, writer = await host.connect(port, timeout=2)
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, f"port {port} never listened"
                await asyncio.sleep(0.05)
                continue
            writer.close()
            break


def on_port(challenge: Challenge, port: int) -> Challenge:
    """`challenge` with its service on `port` (checks probe `challenge.port`), served by
    `start_hostile_server`'s default unit (the referee checks that the unit owns the port)."""
    return challenge.model_copy(update={"port": port, "unit": "hostile.service"})


async def run_check(
    host: Host, challenge: Challenge, milestone_id: str, *, attempt: int = 1
) -> Verdict:
    """Run `milestone_id`'s registered check once against `host`, as the referee does
    (a fresh record, the milestone's own limits, the failure table enforced), without
    faults. An exception from the check propagates: that is a referee crash."""
    milestone = challenge.milestone(milestone_id)
    ctx = CheckContext(
        challenge=challenge,
        milestone=milestone,
        territory=host.territory,
        attempt=attempt,
        seed=SEED,
    )
    return enforce_table(await get_check(milestone.check)(host, ctx))


async def stage(host: Host, data: bytes) -> None:
    """Make the server's `replay` port answer the next request with exactly `data`. The
    bounds are the harness's own, generous: a loaded machine must not fail the fuzz here
    (it did once in CI, at load 33)."""
    reader, writer = await host.connect(STAGE_PORT, timeout=30)
    try:
        writer.write(data)
        writer.write_eof()
        async with asyncio.timeout(30):
            assert await reader.read() == b"ok"
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


@dataclass
class AttemptClock:
    """An `emit` for the referee that keeps when each territory's attempts started, and
    each attempt_result (monotonic seconds)."""

    started: dict[str, list[float]] = field(default_factory=dict)
    results: list[dict[str, Any]] = field(default_factory=list)

    async def emit(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "attempt_started":
            self.started.setdefault(data["territory"], []).append(time.monotonic())
        elif kind == "attempt_result":
            self.results.append(data)

    def intervals(
        self, territory: str, *, after: float = 0.0, before: float = math.inf
    ) -> list[float]:
        """Seconds between consecutive attempt starts of `territory` whose later start
        lies in [after, before)."""
        times = self.started.get(territory, [])
        return [b - a for a, b in itertools.pairwise(times) if after <= b < before]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-th percentile (0 < q <= 100) of non-empty `values`."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class LoopLag:
    """Measures how late the arena's event loop wakes a 50 ms sleeper (the controller
    and the referee share that loop): `worst` and every lag, in seconds."""

    period: float = 0.05
    lags: list[float] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.period)
            self.lags.append(time.monotonic() - before - self.period)

    @property
    def worst(self) -> float:
        return max(self.lags, default=0.0)


@dataclass
class Attack:
    """What happened while an attack ran: the neighbour's attempt intervals (s), the
    arena loop's lag, the neighbour's `exec true` times (s), the most processes seen in
    the attacker, what the attack printed, and both territories' verdict reasons."""

    intervals: list[float]
    lag: LoopLag
    execs: list[float]
    peak_processes: int
    printed: str
    neighbour_reasons: set[str | None]
    attacker_reasons: set[str | None]


def processes_in(host: Host) -> int:
    """How many processes of this machine live in `host`'s pid namespace (0 if gone)."""
    inspect = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.Pid}}", host.name],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    try:
        target = os.readlink(f"/proc/{int(inspect.stdout.strip())}/ns/pid")
    except (ValueError, OSError):
        return 0
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                count += os.readlink(f"/proc/{entry}/ns/pid") == target
    return count


async def neighbour_under_attack(
    attacker: Host,
    neighbour: Host,
    challenge: Challenge,
    attack: str,
    *,
    attack_s: float = 8.0,
    warmup_s: float = 2.0,
) -> Attack:
    """Judge attacker and neighbour with a full referee (after `warmup_s`), and run
    `attack` in the attacker for `attack_s` (killed then, with its process group).
    Intervals count from one second into the attack."""
    clock = AttemptClock()
    referee = Referee(challenge, seed=SEED, emit=clock.emit, clock=lambda: 0)
    referee.add_territory("attacker", attacker)
    referee.add_territory("neighbour", neighbour)
    lag = LoopLag()
    lagging = asyncio.create_task(lag.run())
    judging = asyncio.create_task(referee.run())
    execs: list[float] = []
    peak = 0
    try:
        await asyncio.sleep(warmup_s)
        begin = time.monotonic()
        attacking = asyncio.create_task(attacker.exec(attack, timeout=attack_s))
        while time.monotonic() < begin + attack_s:
            started = time.monotonic()
            assert (await neighbour.exec("true", timeout=10)).ok
            execs.append(time.monotonic() - started)
            peak = max(peak, await asyncio.to_thread(processes_in, attacker))
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        end = time.monotonic()
        try:
            result = await attacking
            printed = (result.stdout + result.stderr).decode(errors="replace")
        except HostError as exc:  # the attack may take the attacker's host down with it
            printed = f"host error: {exc}"
    finally:
        judging.cancel()
        lagging.cancel()
        await asyncio.gather(judging, lagging, return_exceptions=True)
    neighbour_reasons = {
        r["failure_reason"] for r in clock.results if r["territory"] == "neighbour"
    }
    assert neighbour_reasons <= {None, "record_corrupted"}, neighbour_reasons
    return Attack(
        intervals=clock.intervals("neighbour", after=begin + 1.0, before=end),
        lag=lag,
        execs=execs,
        peak_processes=peak,
        printed=printed,
        neighbour_reasons={
            r["failure_reason"] for r in clock.results if r["territory"] == "neighbour"
        },
        attacker_reasons={
            r["failure_reason"] for r in clock.results if r["territory"] == "attacker"
        },
    )
