"""zero-downtime-deploy: its releases (seed variants), the steady load and the deploy checks.

The setup places two releases of a records service on every host (`/opt/releases/<v>`,
versions derived from the match seed). `zdd-release-up` requires /health and /version
of the first release. `zdd-deploy-under-load` keeps a steady open-loop load of PUTs and
GETs on the service (probes over `Host.connect`, nothing the host prints) while it runs
the competitor's deploy command to each release its milestone names, and requires zero
failed requests, the target version from `/version` afterwards, and (after the last
deploy) every acknowledged record in the ledger. The deploy command runs inside the
host as the competitor's own program; only its exit status is used (a competitor can
only hurt itself by lying about it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsarena.errors import HostError
from opsarena.hosts import Host
from opsarena.ledger import Slot
from opsarena.referee.checks import Decided, error_verdict, health_verdict, limits_of, request
from opsarena.referee.contract import CheckContext, Setup, Verdict, register_check, register_setup
from opsarena.referee.failures import Observation, body_summary, curl_line, describe_error
from opsarena.referee.nemesis import Fault, FaultRun
from opsarena.referee.probe import ProbeError, http_request
from opsarena.workloads.records.checks import ledger_of, pending_of, reread_ledger, workload_seed
from opsarena.workloads.records.workload import slot_id, slot_value

RELEASES_DIR = "/opt/releases"
DEPLOY_COMMAND = "/usr/local/bin/deploy-release"
SERVER_FILE = "server.py"
LOAD_RATE_PER_S = 50.0
WARMUP_S = 0.5
COOLDOWN_S = 0.5
DEPLOY_TIMEOUT_S = 30.0
_RELEASE_SOURCE = Path(__file__).with_name("release_server.py")


def _derive(seed: bytes, label: str) -> bytes:
    return hmac.new(seed, f"zero-downtime-deploy:{label}".encode(), hashlib.sha256).digest()


def versions(seed: bytes) -> tuple[str, str]:
    """The two releases' versions for `seed`: v1 older than v2 (both `MAJOR.MINOR.PATCH`,
    and different for different seeds). Pure."""
    raw = _derive(seed, "versions")
    major = 1 + raw[0] % 8
    minor = raw[1] % 20
    first = f"{major}.{minor}.{raw[2] % 10}"
    second = f"{major}.{minor + 1 + raw[3] % 3}.0"
    return first, second


def variables(seed: bytes) -> dict[str, str]:
    v1, v2 = versions(seed)
    return {
        "v1": v1,
        "v2": v2,
        "releases_dir": RELEASES_DIR,
        "deploy_command": DEPLOY_COMMAND,
    }


async def place(host: Host, seed: bytes) -> None:
    source = _RELEASE_SOURCE.read_bytes()
    for version in versions(seed):
        await host.write_file(f"{RELEASES_DIR}/{version}/{SERVER_FILE}", source, mode=0o755)
        await host.write_file(f"{RELEASES_DIR}/{version}/VERSION", f"{version}\n".encode())


register_setup("zero-downtime-deploy", Setup(variables=variables, place=place))


def release_of(seed: bytes, role: str) -> str:
    """The version a milestone's role (`v1`, `v2`) names for `seed`."""
    v1, v2 = versions(seed)
    if role == "v1":
        return v1
    if role == "v2":
        return v2
    raise ValueError(f"no release role {role!r} (v1 or v2)")


def percentile(values: list[int], q: float) -> int | None:
    """The `q`-th percentile (nearest rank) of `values`; None when empty. Pure."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class LoadReport:
    """What the steady load saw around one deploy."""

    sent: int = 0
    failed: int = 0
    lost: int = 0
    latencies_ms: list[int] = field(default_factory=list)
    first_failure: str | None = None
    first_lost: str | None = None
    versions_seen: set[str] = field(default_factory=set)

    def fail(self, detail: str) -> None:
        self.failed += 1
        if self.first_failure is None:
            self.first_failure = detail

    def lose(self, detail: str) -> None:
        self.lost += 1
        if self.first_lost is None:
            self.first_lost = detail

    def summary(self) -> str:
        p99 = percentile(self.latencies_ms, 99)
        return (
            f"{self.sent} requests, {self.failed} failed, {self.lost} records read back "
            f"wrong, p99 {p99 if p99 is not None else '-'} ms"
        )


def judge_load(report: LoadReport, what: str) -> tuple[str, str] | None:
    """None when the load around `what` saw no failed request and no record read back
    wrong; else (failure_reason, detail). Records read back wrong (missing) come first:
    losing data is worse than refusing a request. Pure."""
    if report.lost:
        return "record_missing", f"{what}: {report.summary()}; first: {report.first_lost}"
    if report.failed:
        return "requests_failed", f"{what}: {report.summary()}; first: {report.first_failure}"
    return None


def judge_version(body: bytes, status: int, expected: str) -> str | None:
    """None when GET /version answered 200 with `expected` (surrounding whitespace
    ignored); else what it answered. Pure."""
    if status == 200 and body.strip() == expected.encode():
        return None
    return f"status {status} with {body_summary(body)}"


class _Deploy(Fault):
    """Not a registered fault: names the time after the deploys in the ledger re-read."""

    name = "deploy"
    host_method = "exec"
    timeout_s = DEPLOY_TIMEOUT_S
    after = "after the deploys"

    async def inject(self, host: Host, unit: str) -> int:
        raise NotImplementedError("the deploy is run by its check, not by the nemesis")

    async def confirm(self, host: Host, unit: str, before: int, injected: int) -> FaultRun:
        raise NotImplementedError("the deploy is run by its check, not by the nemesis")


DEPLOYS = _Deploy()


async def check_version(host: Host, ctx: CheckContext, expected: str, *, step: str) -> None:
    """GET /version must answer `expected`; raises `Decided` (wrong_version) else."""
    response = await request(host, ctx, "GET", "/version", step=step)
    received = judge_version(response.body, response.status, expected)
    if received is not None:
        raise Decided(
            Verdict.failed(
                "wrong_version",
                Observation(
                    step=step,
                    elapsed_ms=response.elapsed_ms,
                    phase="receive",
                    status=response.status,
                    expected=f"status 200 with the version {expected!r}",
                    received=received,
                    reproduce=curl_line("GET", ctx.challenge.port, "/version"),
                ).render(),
            )
        )


@register_check("zdd-release-up")
async def check_release_up(host: Host, ctx: CheckContext) -> Verdict:
    """GET /health answers `ready` and GET /version the release the milestone's
    `release` param names (default v1)."""
    try:
        _, verdict = await health_verdict(host, ctx)
        if verdict is not None:
            return verdict
        expected = release_of(ctx.seed or workload_seed(ctx), ctx.milestone.param("release", "v1"))
        await check_version(host, ctx, expected, step="GET /version")
    except Decided as decided:
        return decided.verdict
    return Verdict.passed({"health": "ready", "version": expected, "attempt": ctx.attempt})


class Load:
    """An open-loop load at `rate` requests/s: a PUT of a fresh record, a GET of a record
    this load had acknowledged, a GET /version, in turn. Every PUT goes into the ledger
    (acknowledged on 2xx, indeterminate when it left and got no answer)."""

    def __init__(self, host: Host, ctx: CheckContext, rate: float, tag: str) -> None:
        self.host, self.ctx, self.rate, self.tag = host, ctx, rate, tag
        self.seed = workload_seed(ctx)
        self.report = LoadReport()
        self.acked: list[tuple[str, bytes]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._count = 0

    async def run(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            task = asyncio.create_task(self._one(self._count))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            self._count += 1
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._stop.wait()

    async def stop(self) -> None:
        self._stop.set()
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    async def _one(self, index: int) -> None:
        kind = index % 3
        if kind == 1 and not self.acked:
            kind = 0
        if kind == 0:
            slot = Slot(self.ctx.territory, self.ctx.milestone.id, max(self.ctx.attempt, 0),
                        f"load-{self.tag}-{index}")  # fmt: skip
            await self._put(slot_id(self.seed, slot), slot_value(self.seed, slot), slot)
        elif kind == 1:
            record_id, value = self.acked[(index // 3) % len(self.acked)]
            await self._get(record_id, value)
        else:
            await self._version()

    async def _send(self, method: str, target: str, body: bytes = b"") -> Any:
        self.report.sent += 1
        try:
            response = await http_request(
                self.host, self.ctx.challenge.port, method, target, body=body,
                limits=limits_of(self.ctx),
            )  # fmt: skip
        except ProbeError as exc:
            observation = Observation(
                step=f"{method} {target}", elapsed_ms=exc.elapsed_ms, phase=exc.phase,
                status=exc.status, error=describe_error(exc),
            )  # fmt: skip
            self.report.fail(observation.render())
            return exc
        self.report.latencies_ms.append(response.elapsed_ms)
        return response

    async def _put(self, record_id: str, value: bytes, slot: Slot) -> None:
        target = f"/records/{record_id}"
        answer = await self._send("PUT", target, value)
        pending = pending_of(self.ctx)
        if isinstance(answer, ProbeError):
            if answer.phase != "connect":
                pending.write(record_id, value, slot, acknowledged=False)
            return
        if 200 <= answer.status < 300:
            pending.write(record_id, value, slot, acknowledged=True)
            self.acked.append((record_id, value))
        else:
            self.report.fail(f"PUT {target} answered status {answer.status}, not 2xx")

    async def _get(self, record_id: str, value: bytes) -> None:
        target = f"/records/{record_id}"
        answer = await self._send("GET", target)
        if isinstance(answer, ProbeError):
            return
        if answer.status == 200 and answer.body == value:
            pending_of(self.ctx).count("ok", record_id)
            return
        if answer.status in (200, 404):
            pending_of(self.ctx).count("lost" if answer.status == 404 else "corrupted", record_id)
            self.report.lose(
                f"GET {target} of a record acknowledged earlier answered status "
                f"{answer.status} with {body_summary(answer.body)}; expected status 200 with "
                f"{body_summary(value)}"
            )
            return
        self.report.fail(f"GET {target} answered status {answer.status}, not 200")

    async def _version(self) -> None:
        answer = await self._send("GET", "/version")
        if isinstance(answer, ProbeError):
            return
        if answer.status != 200:
            self.report.fail(f"GET /version answered status {answer.status}, not 200")
            return
        self.report.versions_seen.add(answer.body.strip().decode(errors="replace"))


async def deploy_under_load(
    host: Host, ctx: CheckContext, version: str, index: int, total: int
) -> dict[str, Any]:
    """Load, run `deploy-release VERSION` under it, keep loading a moment, stop the load,
    then require GET /version to answer VERSION. Returns this deploy's evidence. Raises
    `Decided`."""
    rate = float(ctx.milestone.param("rate_per_s", LOAD_RATE_PER_S))
    warmup = float(ctx.milestone.param("warmup_s", WARMUP_S))
    cooldown = float(ctx.milestone.param("cooldown_s", COOLDOWN_S))
    timeout = float(ctx.milestone.param("deploy_timeout_s", DEPLOY_TIMEOUT_S))
    what = f"deploy {index}/{total} ({DEPLOY_COMMAND} {version}) under {rate:g} requests/s"
    load = Load(host, ctx, rate, f"{index}")
    runner = asyncio.create_task(load.run())
    failure: Decided | None = None
    started = time.monotonic()
    try:
        await asyncio.sleep(warmup)
        started = time.monotonic()
        try:
            result = await host.exec([DEPLOY_COMMAND, version], timeout=timeout)
        except HostError as exc:
            elapsed = int((time.monotonic() - started) * 1000)
            failure = Decided(error_verdict(exc, Observation(
                step=what, elapsed_ms=elapsed, error=describe_error(exc))))  # fmt: skip
        else:
            if result.timed_out or result.exit_code != 0:
                ended = "ran over its" if result.timed_out else f"exited {result.exit_code} in its"
                failure = Decided(Verdict.failed("deploy_failed", (
                    f"{what}: the deploy command {ended} {timeout:g} s budget (its output is "
                    f"not evidence; run it yourself: {DEPLOY_COMMAND} {version})")))  # fmt: skip
        deploy_ms = int((time.monotonic() - started) * 1000)
        await asyncio.sleep(cooldown)
    finally:
        await load.stop()
        await runner
    if failure is not None:
        raise failure
    judged = judge_load(load.report, what)
    if judged is not None:
        raise Decided(Verdict.failed(*judged))
    await check_version(host, ctx, version, step=f"after {what}, GET /version")
    p99 = percentile(load.report.latencies_ms, 99)
    return {
        "version": version,
        "deploy_ms": deploy_ms,
        "requests": load.report.sent,
        "failed_requests": load.report.failed,
        "p99_ms": p99,
        "versions_seen": sorted(load.report.versions_seen),
    }


@register_check("zdd-deploy-under-load")
async def check_deploy_under_load(host: Host, ctx: CheckContext) -> Verdict:
    """Deploy to each release the milestone's `sequence` param names (roles `v1`, `v2`)
    under a steady load; then re-read the whole ledger. Evidence: one entry per deploy
    (requests, failed_requests, p99_ms, deploy_ms), the re-read counts."""
    seed = ctx.seed or workload_seed(ctx)
    roles = list(ctx.milestone.param("sequence", ["v2"]))
    try:
        deploys = []
        for index, role in enumerate(roles, start=1):
            version = release_of(seed, str(role))
            deploys.append(await deploy_under_load(host, ctx, version, index, len(roles)))
        reread = await reread_ledger(host, ctx, DEPLOYS, set())
    except Decided as decided:
        return decided.verdict
    return Verdict.passed(
        {
            "deploys": deploys,
            "failed_requests": sum(d["failed_requests"] for d in deploys),
            "p99_ms": max((d["p99_ms"] or 0) for d in deploys),
            "ledger_records": len(ledger_of(ctx).entries),
            "attempt": ctx.attempt,
            **reread,
        }
    )
