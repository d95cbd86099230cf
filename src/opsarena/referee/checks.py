"""The referee's built-in checks: health, write-read, and durability across faults.

Registered as `health`, `write-read`, `restart-durability` and `reboot-durability`.
Each probes the service only through `http_request` (h11 over `Host.connect`) and
injects faults only through `ctx.inject_fault`. Every way an attempt can end is a
`Verdict` whose failure_reason is a row of `opsarena.referee.failures.REASONS`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

from opsarena.challenges.checks import CheckContext, FaultKind, Verdict, register_check
from opsarena.errors import HostError
from opsarena.hosts import Host
from opsarena.referee.failures import (
    REASONS,
    Observation,
    body_summary,
    classify_error,
    curl_line,
    describe_error,
)
from opsarena.referee.ownership import port_ownership_verdict
from opsarena.referee.probe import HttpResponse, ProbeError, ProbeLimits, http_request

HEALTH_PATH = "/health"
HEALTH_BODY = b"ready"
READY_POLL_S = 0.1
FAULT_TIMEOUT_S = {"restart": 30.0, "reboot": 90.0}
"""Bounds for the faults themselves (separate from the readiness budget after them)."""

_AFTER = {"restart": "after the restart", "reboot": "after the reboot"}


class Decided(Exception):
    """Raised inside a check to end it with `verdict` at once."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.failure_reason)
        self.verdict = verdict


def limits_of(ctx: CheckContext) -> ProbeLimits:
    m = ctx.milestone
    return ProbeLimits(
        connect_timeout_s=m.connect_timeout_s,
        read_timeout_s=m.read_timeout_s,
        max_header_bytes=m.max_header_bytes,
        max_body_bytes=m.max_body_bytes,
    )


def error_verdict(error: BaseException, observation: Observation) -> Verdict:
    """The verdict for a raw error: the failure table decides the reason and whose fault
    it is."""
    row = classify_error(error)
    detail = observation.render()
    if row.category == "referee_error":
        return Verdict.referee_error(row.reason, detail)
    return Verdict.failed(row.reason, detail)


async def request(
    host: Host,
    ctx: CheckContext,
    method: str,
    target: str,
    *,
    body: bytes = b"",
    step: str,
    limits: ProbeLimits | None = None,
) -> HttpResponse:
    """One probe; raises `Decided` with the table's verdict when no complete answer came."""
    port = ctx.challenge.port
    reproduce = curl_line(method, port, target, body=body if method == "PUT" else None)
    started = time.monotonic()
    try:
        return await http_request(
            host, port, method, target, body=body, limits=limits or limits_of(ctx)
        )
    except ProbeError as exc:
        observation = Observation(
            step=step,
            elapsed_ms=exc.elapsed_ms,
            phase=exc.phase,
            status=exc.status,
            error=describe_error(exc),
            reproduce=reproduce,
        )
        raise Decided(error_verdict(exc, observation)) from exc
    except HostError as exc:
        elapsed = int((time.monotonic() - started) * 1000)
        observation = Observation(
            step=step, elapsed_ms=elapsed, phase="connect", error=describe_error(exc)
        )
        raise Decided(error_verdict(exc, observation)) from exc


def _failed(reason: str, observation: Observation) -> Decided:
    assert REASONS[reason].category == "verification_failed"
    return Decided(Verdict.failed(reason, observation.render()))


def judge_health(response: HttpResponse, *, step: str, reproduce: str) -> Verdict | None:
    """None when `response` is a healthy answer (200, body `ready` give or take
    surrounding whitespace); else the failed verdict saying why. Pure."""
    if response.status != 200:
        return Verdict.failed(
            "bad_status",
            Observation(
                step=step,
                elapsed_ms=response.elapsed_ms,
                phase="receive",
                status=response.status,
                expected=f"status 200 with body {body_summary(HEALTH_BODY)}",
                received=f"status {response.status} with body {body_summary(response.body)}",
                reproduce=reproduce,
            ).render(),
        )
    if response.body.strip() != HEALTH_BODY:
        return Verdict.failed(
            "wrong_body",
            Observation(
                step=step,
                elapsed_ms=response.elapsed_ms,
                phase="receive",
                status=200,
                expected=f"body {body_summary(HEALTH_BODY)}",
                received=f"body {body_summary(response.body)}",
                reproduce=reproduce,
            ).render(),
        )
    return None


def judge_read(
    response: HttpResponse, expected: bytes, *, step: str, reproduce: str
) -> Verdict | None:
    """None when a GET of a record returned exactly `expected`; else the failed verdict
    (`record_missing` for 404, `record_corrupted` for other bytes, `bad_status`). Pure."""
    want = f"status 200 with {body_summary(expected)}"
    got = f"status {response.status} with {body_summary(response.body)}"
    reason = None
    if response.status == 404:
        reason = "record_missing"
    elif response.status != 200:
        reason = "bad_status"
    elif response.body != expected:
        reason = "record_corrupted"
    if reason is None:
        return None
    return Verdict.failed(
        reason,
        Observation(
            step=step,
            elapsed_ms=response.elapsed_ms,
            phase="receive",
            status=response.status,
            expected=want,
            received=got,
            reproduce=reproduce,
        ).render(),
    )


async def write_record(host: Host, ctx: CheckContext, *, when: str = "") -> int:
    """PUT this attempt's record; returns the request's ms. Raises `Decided`."""
    target = f"/records/{ctx.record_id}"
    value = ctx.record_value.encode()
    step = f"{when}PUT {target}"
    response = await request(host, ctx, "PUT", target, body=value, step=step)
    if not 200 <= response.status < 300:
        raise _failed(
            "bad_status",
            Observation(
                step=step,
                elapsed_ms=response.elapsed_ms,
                phase="receive",
                status=response.status,
                expected="a 2xx status",
                received=f"status {response.status} with {body_summary(response.body)}",
                reproduce=curl_line("PUT", ctx.challenge.port, target, body=value),
            ),
        )
    return response.elapsed_ms


async def read_record(host: Host, ctx: CheckContext, *, when: str = "") -> int:
    """GET this attempt's record and compare it byte for byte; returns the ms. Raises
    `Decided`."""
    target = f"/records/{ctx.record_id}"
    step = f"{when}GET {target}"
    response = await request(host, ctx, "GET", target, step=step)
    reproduce = curl_line("GET", ctx.challenge.port, target)
    verdict = judge_read(response, ctx.record_value.encode(), step=step, reproduce=reproduce)
    if verdict is not None:
        raise Decided(verdict)
    return response.elapsed_ms


async def wait_healthy(host: Host, ctx: CheckContext, fault: FaultKind) -> int:
    """Poll GET /health until it is healthy, within the milestone's `ready_budget_s`;
    returns the ms it took. Raises `Decided` with `not_ready_after_fault` (carrying the
    last probe's observation) when the budget runs out."""
    budget = ctx.milestone.ready_budget_s
    started = time.monotonic()
    deadline = started + budget
    reproduce = curl_line("GET", ctx.challenge.port, HEALTH_PATH)
    base = limits_of(ctx)
    last = "no probe finished"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        limits = ProbeLimits(
            connect_timeout_s=min(base.connect_timeout_s, remaining),
            read_timeout_s=min(base.read_timeout_s, remaining),
            max_header_bytes=base.max_header_bytes,
            max_body_bytes=base.max_body_bytes,
        )
        step = f"{_AFTER[fault]}, GET {HEALTH_PATH}"
        try:
            response = await request(host, ctx, "GET", HEALTH_PATH, step=step, limits=limits)
        except Decided as decided:
            if decided.verdict.outcome == "referee_error":
                raise
            last = f"{decided.verdict.failure_reason}: {decided.verdict.failure_detail}"
        else:
            verdict = judge_health(response, step=step, reproduce=reproduce)
            if verdict is None:
                return int((time.monotonic() - started) * 1000)
            last = f"{verdict.failure_reason}: {verdict.failure_detail}"
        await asyncio.sleep(min(READY_POLL_S, max(0.0, deadline - time.monotonic())))
    elapsed = int((time.monotonic() - started) * 1000)
    raise _failed(
        "not_ready_after_fault",
        Observation(
            step=f"{_AFTER[fault]}, waiting for GET {HEALTH_PATH} to answer 200 `ready`",
            elapsed_ms=elapsed,
            error=f"not ready within the {budget:g} s budget; last probe: {last}",
        ),
    )


async def inject(ctx: CheckContext, fault: FaultKind) -> int:
    """Inject `fault` through the referee; raises `Decided` with the table's verdict when
    it could not be done."""
    started = time.monotonic()
    try:
        return await ctx.inject_fault(fault)
    except (HostError, OSError, TimeoutError) as exc:
        what = (
            f"systemctl restart {ctx.challenge.unit}"
            if fault == "restart"
            else "reboot of the host"
        )
        elapsed = int((time.monotonic() - started) * 1000)
        raise Decided(
            error_verdict(
                exc, Observation(step=what, elapsed_ms=elapsed, error=describe_error(exc))
            )
        ) from exc


async def _decide(body: Coroutine[Any, Any, dict[str, Any]]) -> Verdict:
    try:
        evidence: dict[str, Any] = await body
    except Decided as decided:
        return decided.verdict
    return Verdict.passed(evidence)


@register_check("health")
async def check_health(host: Host, ctx: CheckContext) -> Verdict:
    """GET /health answers 200 `ready`. Evidence: `{"health": "ready", ...}`."""

    async def run() -> dict[str, Any]:
        step = f"GET {HEALTH_PATH}"
        response = await request(host, ctx, "GET", HEALTH_PATH, step=step)
        verdict = judge_health(
            response, step=step, reproduce=curl_line("GET", ctx.challenge.port, HEALTH_PATH)
        )
        if verdict is None:
            verdict = await port_ownership_verdict(
                host, ctx, step=f"owner of port {ctx.challenge.port}"
            )
        if verdict is not None:
            raise Decided(verdict)
        return {"health": "ready", "attempt": ctx.attempt, "health_ms": response.elapsed_ms}

    return await _decide(run())


@register_check("write-read")
async def check_write_read(host: Host, ctx: CheckContext) -> Verdict:
    """PUT a fresh record and GET it back byte for byte. Evidence: record, value."""

    async def run() -> dict[str, Any]:
        write_ms = await write_record(host, ctx)
        read_ms = await read_record(host, ctx)
        return {
            "record": ctx.record_id,
            "value": ctx.record_value,
            "attempt": ctx.attempt,
            "write_ms": write_ms,
            "read_ms": read_ms,
        }

    return await _decide(run())


async def _durability(host: Host, ctx: CheckContext, fault: FaultKind) -> Verdict:
    async def run() -> dict[str, Any]:
        await write_record(host, ctx, when=f"before the {fault}, ")
        await read_record(host, ctx, when=f"before the {fault}, ")
        fault_ms = await inject(ctx, fault)
        ready_ms = await wait_healthy(host, ctx, fault)
        read_ms = await read_record(host, ctx, when=f"{_AFTER[fault]}, ")
        step = f"{_AFTER[fault]}, owner of port {ctx.challenge.port}"
        if owned := await port_ownership_verdict(
            host, ctx, step=step, after_restart=fault == "restart"
        ):
            raise Decided(owned)
        return {
            "record": ctx.record_id,
            "value": ctx.record_value,
            fault: True,
            "attempt": ctx.attempt,
            "fault_ms": fault_ms,
            "ready_ms": ready_ms,
            "read_ms": read_ms,
        }

    return await _decide(run())


@register_check("restart-durability")
async def check_restart_durability(host: Host, ctx: CheckContext) -> Verdict:
    """Write and read a fresh record, restart the unit, wait for health within the
    budget, read the record back. Evidence: record, value, `"restart": true`."""
    return await _durability(host, ctx, "restart")


@register_check("reboot-durability")
async def check_reboot_durability(host: Host, ctx: CheckContext) -> Verdict:
    """As restart-durability, around a reboot of the host. Evidence: `"reboot": true`."""
    return await _durability(host, ctx, "reboot")
