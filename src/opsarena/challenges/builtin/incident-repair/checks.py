"""incident-repair: the broken deployment each host arrives with, and the checks of its repair.

The setup (`incident-repair`) deploys the records service of `files/` (its program the
records workload's server, `SERVER_PATH`) on each host,
seeds it with records derived from the match seed, enables it and its metrics exporter,
then breaks it in one of `BREAKAGES` (chosen from the seed: every territory of a match
faces the same one, a replay the same one). Checks, by probes through `Host.connect`
and kernel facts read from the arena side:

- `seeded-records`: every seeded record reads back byte for byte (`seeded_record_lost`
  otherwise), a fresh record is written and read; the seeded ones join the ledger, so
  the restart and reboot milestones (the built-in durability checks) re-read them too.
- `companions-running`: the metrics exporter still answers on its port, and the kernel
  shows a process of its unit holding that port (`collateral_damage` otherwise).
"""

from __future__ import annotations

import asyncio
import hashlib
import shlex
import time
from collections.abc import Coroutine
from dataclasses import replace
from importlib import resources
from typing import Any

from opsarena.errors import ChallengeError, HostError
from opsarena.hosts import Host
from opsarena.ledger import Slot
from opsarena.referee.checks import Decided, error_verdict, request
from opsarena.referee.contract import CheckContext, Setup, Verdict, register_check, register_setup
from opsarena.referee.failures import Observation, body_summary, curl_line, describe_error
from opsarena.referee.ownership import judge_port_ownership
from opsarena.workloads.records.checks import (
    pending_of,
    put_record,
    read_record,
    text_record,
    workload_seed,
)
from opsarena.workloads.records.workload import slot_id, slot_value

SETUP_NAME = "incident-repair"
SEEDED_MILESTONE = "seeded"
"""The `Slot.milestone` of the seeded records (no milestone has this id)."""
SEEDED_SLOTS = ("text", "binary", "empty", *(f"seeded-{i}" for i in range(3, 12)))
"""The seeded records' slots: a text value, all 256 byte values, an empty value and
nine 512-byte binary values (`opsarena.workloads.records.workload.slot_value`)."""
DATA_DIR = "/srv/records/data"
CONFIG = "/etc/records/records.conf"
LAUNCHER = "/usr/local/lib/records/records-launch"
MOVED_LAUNCHER = "/usr/local/lib/records.old/records-launch"
METRICS_PORT = 9100
METRICS_UNIT = "records-metrics.service"
METRICS_BODY = b"metrics ok"
POLL_S = 0.2

BREAKAGES: dict[str, str] = {
    "program-moved": "the unit's program (records-launch) was moved to another directory",
    "data-owner": "the data directory is owned by root, not by the service's user",
    "port-held": "another enabled unit (legacy-records.socket) holds port 8080",
    "config-syntax": "the service's configuration file has a syntax error",
    "user-missing": "the service's user was deleted",
}
"""Every way the host can arrive broken, by name. (A disk filled by a runaway log is
not one: a challenge cannot ask for a fixed-size host disk yet; see docs/CHALLENGES.md.)"""


def breakage_of(seed: bytes) -> str:
    """The breakage the match keyed by `seed` gets. Pure."""
    names = sorted(BREAKAGES)
    digest = hashlib.sha256(b"opsarena-incident-repair:" + seed).digest()
    return names[int.from_bytes(digest[:8], "big") % len(names)]


def seeded_records(seed: bytes, territory: str) -> list[tuple[Slot, str, bytes]]:
    """The records a territory's host arrives with: (slot, id, value). Pure."""
    slots = [Slot(territory, SEEDED_MILESTONE, 0, name) for name in SEEDED_SLOTS]
    return [(slot, slot_id(seed, slot), slot_value(seed, slot)) for slot in slots]


def break_script(breakage: str) -> str:
    """Bash that breaks the deployment in the way `breakage` names. Pure."""
    return {
        "program-moved": (
            f"mkdir -p {MOVED_LAUNCHER.rsplit('/', 1)[0]}\nmv {LAUNCHER} {MOVED_LAUNCHER}\n"
        ),
        "data-owner": f"chown -R root:root {DATA_DIR}\nchmod 0700 {DATA_DIR}\n",
        "port-held": "systemctl enable legacy-records.socket\n",
        "config-syntax": f"sed -i 's|^storage = |storage |' {CONFIG}\n",
        "user-missing": "userdel records\n",
    }[breakage]


SERVER_PATH = "/usr/local/lib/records/records_server.py"
"""Where the host's records service program is (`program` in its records.conf)."""


def variables(seed: bytes) -> dict[str, str]:
    return {"seeded_count": str(len(SEEDED_SLOTS))}


async def place(host: Host, seed: bytes) -> None:
    """Deploy, seed, enable, break; then boot the units as a machine would (the broken
    one fails). Raises `HostFileError` / `HostUnavailableError` from the host, or
    `ChallengeError` when the deployment script failed."""
    server = resources.files("opsarena.workloads.records").joinpath("server.py")
    await host.write_file(SERVER_PATH, server.read_bytes(), mode=0o644)
    for _, record_id, value in seeded_records(seed, host.territory):
        await host.write_file(f"{DATA_DIR}/{record_id}", value, mode=0o640)
    script = (
        "set -eu\n"
        "useradd --system --no-create-home --home-dir /nonexistent "
        "--shell /usr/sbin/nologin records\n"
        f"chown -R records:records {DATA_DIR.rsplit('/', 1)[0]}\n"
        f"chmod 0750 {DATA_DIR}\n"
        "systemctl daemon-reload\n"
        "systemctl enable records.service records-metrics.service\n"
        f"{break_script(breakage_of(seed))}"
        "systemctl daemon-reload\n"
        "systemctl start records-metrics.service\n"
        "systemctl start sockets.target\n"
        "systemctl start records.service || true\n"
    )
    result = await host.exec(script, timeout=60.0)
    if not result.ok:
        raise ChallengeError(
            f"incident-repair setup failed on {host.name}: "
            f"{result.stderr.decode(errors='replace').strip()[-300:]}"
        )


register_setup(SETUP_NAME, Setup(variables=variables, place=place))


@register_check("seeded-records")
async def check_seeded_records(host: Host, ctx: CheckContext) -> Verdict:
    """GET every seeded record (each must be byte for byte what the host arrived with),
    then PUT and GET a fresh record. The seeded records then join the ledger as
    acknowledged. Evidence: seeded (count), record, value, attempt."""

    async def run() -> dict[str, Any]:
        seed = workload_seed(ctx)
        seeded = seeded_records(seed, ctx.territory)
        for slot, record_id, value in seeded:
            target = f"/records/{record_id}"
            step = f"seeded record {slot.name}: GET {target}"
            response = await request(host, ctx, "GET", target, step=step)
            if response.status == 200 and response.body == value:
                continue
            raise _lost(
                "seeded_record_lost",
                Observation(
                    step=step,
                    elapsed_ms=response.elapsed_ms,
                    phase="receive",
                    status=response.status,
                    expected=f"status 200 with {body_summary(value)} (the host arrived with it)",
                    received=f"status {response.status} with {body_summary(response.body)}",
                    reproduce=curl_line("GET", ctx.challenge.port, target, save=True),
                ),
            )
        record = text_record(ctx, Slot(ctx.territory, ctx.milestone.id, ctx.attempt, "text"))
        await put_record(host, ctx, record, step=f"fresh record: PUT /records/{record.id}")
        await read_record(
            host, ctx, record.id, [record.value], step=f"fresh record: GET /records/{record.id}"
        )
        pending = pending_of(ctx)
        for slot, record_id, value in seeded:
            pending.write(record_id, value, replace(slot, territory=""), acknowledged=True)
        return {
            "seeded": len(seeded),
            "record": record.id,
            "value": record.value.decode(),
            "attempt": ctx.attempt,
        }

    return await _decide(run())


async def _decide(body: Coroutine[Any, Any, dict[str, Any]]) -> Verdict:
    try:
        return Verdict.passed(await body)
    except Decided as decided:
        return decided.verdict


def _lost(reason: str, observation: Observation) -> Decided:
    return Decided(Verdict.failed(reason, observation.render()))


async def _owned_by_exporter(host: Host, port: int, step: str) -> None:
    """Kernel facts read from the arena side: the socket listening on `port` is held by a
    process of `METRICS_UNIT` (not by some other program answering the same words).
    Raises `Decided`: `collateral_damage`, or the table's row for a host error."""
    started = time.monotonic()
    try:
        owners = await host.port_owners(port)
        members = await host.unit_members(METRICS_UNIT)
    except HostError as exc:
        elapsed = int((time.monotonic() - started) * 1000)
        raise Decided(
            error_verdict(
                exc, Observation(step=step, elapsed_ms=elapsed, error=describe_error(exc))
            )
        ) from exc
    problem = judge_port_ownership(port, METRICS_UNIT, owners, members, init=host.init_process)
    if problem is not None:
        elapsed = int((time.monotonic() - started) * 1000)
        raise _lost("collateral_damage", Observation(step=step, elapsed_ms=elapsed, error=problem))


@register_check("companions-running")
async def check_companions_running(host: Host, ctx: CheckContext) -> Verdict:
    """The metrics exporter the host arrived with answers GET /health `metrics ok` on its
    port (milestone param `port`, default 9100), polled for up to the milestone's
    `ready_budget_s` (it may still be starting after the reboot just before); then the
    kernel, read from the arena side, must show the listening socket held by a process
    of records-metrics.service (`judge_port_ownership`). Evidence: metrics_port, ready_ms."""
    port = ctx.milestone.param("port", METRICS_PORT)
    step = f"GET /health on the metrics exporter (port {port})"
    reproduce = shlex.join(["curl", "-sS", f"http://127.0.0.1:{port}/health"])
    probe_ctx = replace(ctx, challenge=ctx.challenge.model_copy(update={"port": port}))
    expected = f"status 200 with body {body_summary(METRICS_BODY)}"

    async def run() -> dict[str, Any]:
        started = time.monotonic()
        deadline = started + ctx.milestone.ready_budget_s
        while True:
            try:
                response = await request(host, probe_ctx, "GET", "/health", step=step)
            except Decided as decided:
                if decided.verdict.outcome == "referee_error":
                    raise
                last = Observation(
                    step=step,
                    elapsed_ms=int((time.monotonic() - started) * 1000),
                    expected=expected,
                    error=decided.verdict.failure_detail or "",
                    reproduce=reproduce,
                )
            else:
                if response.status == 200 and response.body.strip() == METRICS_BODY:
                    ready_ms = int((time.monotonic() - started) * 1000)
                    await _owned_by_exporter(host, port, step)
                    return {"metrics_port": port, "ready_ms": ready_ms, "attempt": ctx.attempt}
                last = Observation(
                    step=step,
                    elapsed_ms=response.elapsed_ms,
                    phase="receive",
                    status=response.status,
                    expected=expected,
                    received=f"status {response.status} with {body_summary(response.body)}",
                    reproduce=reproduce,
                )
            if time.monotonic() + POLL_S >= deadline:
                raise _lost("collateral_damage", last)
            await asyncio.sleep(POLL_S)

    return await _decide(run())
