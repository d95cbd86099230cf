"""The engine's check machinery, shared by every workload and challenge, and the `health`
check.

`request` is one probe (h11 over `Host.connect`) whose failure ends the check with the
failure table's verdict (`Decided`); `health_verdict` is the one judgement of GET
/health; `wait_healthy` waits for it after a fault within the milestone's budget;
`inject` performs a fault through the referee (`ctx.inject_fault`); `decide` turns a
check's body into its `Verdict`. Every way an attempt can end is a `Verdict` whose
failure_reason is a row of `opsarena.referee.failures.REASONS`. Workload-specific checks
(the records workload's write-read and durability checks) live in their workload
(`opsarena.workloads.records.checks`).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, TypeVar

from opsarena.errors import HostError
from opsarena.hosts import Host
from opsarena.referee.contract import CheckContext, Verdict, register_check
from opsarena.referee.failures import (
    REASONS,
    Observation,
    body_summary,
    classify_error,
    curl_line,
    describe_error,
)
from opsarena.referee.nemesis import Fault
from opsarena.referee.ownership import port_ownership_verdict
from opsarena.referee.probe import HttpResponse, ProbeError, ProbeLimits, http_request

HEALTH_PATH = "/health"
HEALTH_BODY = b"ready"
READY_POLL_S = 0.1

T = TypeVar("T")


class Decided(Exception):
    """Raised inside a check to end it with `verdict` at once. `sent` is true when the
    request had (at least partly) left before it failed: a PUT's outcome is then
    unknown (indeterminate)."""

    def __init__(self, verdict: Verdict, *, sent: bool = False) -> None:
        super().__init__(verdict.failure_reason)
        self.verdict = verdict
        self.sent = sent


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
    if method == "PUT":
        step = f"{step} ({len(body)} bytes sha256:{hashlib.sha256(body).hexdigest()[:12]})"
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
        raise Decided(error_verdict(exc, observation), sent=exc.phase != "connect") from exc
    except HostError as exc:
        elapsed = int((time.monotonic() - started) * 1000)
        observation = Observation(
            step=step, elapsed_ms=elapsed, phase="connect", error=describe_error(exc)
        )
        raise Decided(error_verdict(exc, observation)) from exc


def failure(reason: str, observation: Observation) -> Decided:
    """`Decided` with the competitor's failure `reason` (a verification_failed row)."""
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


async def health_verdict(
    host: Host,
    ctx: CheckContext,
    *,
    step: str = f"GET {HEALTH_PATH}",
    limits: ProbeLimits | None = None,
) -> tuple[HttpResponse, Verdict | None]:
    """One GET /health, judged (`judge_health`): the response, and None when it is
    healthy or else the failed verdict. Raises `Decided` when no complete answer came.
    The one health judgement of every check (`health`, `wait_healthy`, a challenge's
    own)."""
    response = await request(host, ctx, "GET", HEALTH_PATH, step=step, limits=limits)
    reproduce = curl_line("GET", ctx.challenge.port, HEALTH_PATH)
    return response, judge_health(response, step=step, reproduce=reproduce)


async def in_order(steps: Sequence[Awaitable[T]]) -> list[T]:
    """Run `steps` at once; when some raise `Decided`, re-raise the first in order (so
    the reported failure does not depend on timing)."""
    results = await asyncio.gather(*steps, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [r for r in results if not isinstance(r, BaseException)]


async def wait_healthy(host: Host, ctx: CheckContext, fault: Fault) -> int:
    """Poll GET /health until it is healthy, within the milestone's `ready_budget_s`;
    returns the ms it took. Raises `Decided` with `not_ready_after_fault` (carrying the
    last probe's observation) when the budget runs out."""
    budget = ctx.milestone.ready_budget_s
    started = time.monotonic()
    deadline = started + budget
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
        try:
            _, verdict = await health_verdict(
                host, ctx, step=f"{fault.after}, GET {HEALTH_PATH}", limits=limits
            )
        except Decided as decided:
            if decided.verdict.outcome == "referee_error":
                raise
            last = f"{decided.verdict.failure_reason}: {decided.verdict.failure_detail}"
        else:
            if verdict is None:
                return int((time.monotonic() - started) * 1000)
            last = f"{verdict.failure_reason}: {verdict.failure_detail}"
        await asyncio.sleep(min(READY_POLL_S, max(0.0, deadline - time.monotonic())))
    elapsed = int((time.monotonic() - started) * 1000)
    raise failure(
        "not_ready_after_fault",
        Observation(
            step=f"{fault.after}, waiting for GET {HEALTH_PATH} to answer 200 `ready`",
            elapsed_ms=elapsed,
            error=f"not ready within the {budget:g} s budget; last probe: {last}",
        ),
    )


async def inject(host: Host, ctx: CheckContext, fault: Fault) -> int:
    """Inject `fault` through the referee; raises `Decided` with the table's verdict when
    it could not be done."""
    started = time.monotonic()
    try:
        return await ctx.inject_fault(fault.name)
    except (HostError, OSError, TimeoutError) as exc:
        what = fault.describe(host, ctx.challenge.unit)
        elapsed = int((time.monotonic() - started) * 1000)
        raise Decided(
            error_verdict(
                exc, Observation(step=what, elapsed_ms=elapsed, error=describe_error(exc))
            )
        ) from exc


async def decide(body: Coroutine[Any, Any, dict[str, Any]]) -> Verdict:
    """`body`'s evidence as a passed verdict, or the verdict it was `Decided` with."""
    try:
        evidence: dict[str, Any] = await body
    except Decided as decided:
        return decided.verdict
    return Verdict.passed(evidence)


@register_check("health")
async def check_health(host: Host, ctx: CheckContext) -> Verdict:
    """GET /health answers 200 `ready`. Evidence: `{"health": "ready", ...}`."""

    async def run() -> dict[str, Any]:
        response, verdict = await health_verdict(host, ctx)
        if verdict is None:
            verdict = await port_ownership_verdict(
                host, ctx, step=f"owner of port {ctx.challenge.port}"
            )
        if verdict is not None:
            raise Decided(verdict)
        return {"health": "ready", "attempt": ctx.attempt, "health_ms": response.elapsed_ms}

    return await decide(run())
