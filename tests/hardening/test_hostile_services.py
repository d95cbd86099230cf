"""Hostile services inside a real host: the referee bounds its time and memory, never
crashes, gives each case its failure_reason, and keeps its cadence for a neighbour.

Bounds here are ceilings with slack (a probe must never wait past its configured
timeouts), not speed measurements; the figures are in docs/RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import AsyncIterator

import pytest

from opsarena.challenges import Challenge, builtin_challenge
from opsarena.hosts import Host
from opsarena.referee.failures import REASONS, classify_error
from opsarena.referee.probe import ProbeError, ProbeLimits, http_request
from opsarena.referee.referee import Referee
from tests.conftest import SharedHosts
from tests.hardening.hostile import (
    CASES,
    HEALTHY_PORT,
    MEMORY_CASES,
    PORTS,
    SEED,
    AttemptClock,
    on_port,
    percentile,
    run_check,
    start_hostile_server,
)

SLACK_S = 1.5
"""Allowed beyond a probe's configured connect + read timeouts (scheduling, teardown)."""
MEMORY_SLACK = 1024 * 1024
"""Allowed beyond the probe's configured size limits, in bytes of traced allocations."""

pytestmark = pytest.mark.hosts


@pytest.fixture(scope="module")
def challenge() -> Challenge:
    return builtin_challenge("durable-records")


@pytest.fixture(scope="module")
async def hostile_host(shared_hosts: SharedHosts, challenge: Challenge) -> AsyncIterator[Host]:
    host = await shared_hosts("hostile")
    await start_hostile_server(host, {**PORTS, "healthy": HEALTHY_PORT})
    # The challenge's own port never answers: the hostile territory of the cadence test.
    await start_hostile_server(host, {"never-answers": challenge.port}, unit="hostile-main")
    yield host


def probe_bound(challenge: Challenge, milestone: str) -> float:
    m = challenge.milestone(milestone)
    return m.connect_timeout_s + m.read_timeout_s + SLACK_S


@pytest.mark.parametrize("case", list(CASES))
async def test_each_hostile_service_gets_its_reason_within_the_timeouts(
    hostile_host: Host, challenge: Challenge, case: str
) -> None:
    started = time.monotonic()
    verdict = await run_check(hostile_host, on_port(challenge, PORTS[case]), "service-up")
    elapsed = time.monotonic() - started
    assert verdict.outcome == "failed", verdict
    assert verdict.failure_reason == CASES[case], verdict.failure_detail
    assert verdict.failure_category == REASONS[CASES[case]].category == "verification_failed"
    assert verdict.failure_detail and "\n" not in verdict.failure_detail
    assert elapsed < probe_bound(challenge, "service-up"), (case, elapsed)


async def test_a_redirect_is_a_bad_status_and_is_not_followed(
    hostile_host: Host, challenge: Challenge
) -> None:
    verdict = await run_check(
        hostile_host, on_port(challenge, PORTS["redirect-loop"]), "write-read"
    )
    assert verdict.failure_reason == "bad_status"
    assert "status 302" in (verdict.failure_detail or "")


async def test_every_hostile_service_at_once_on_the_write_read_check(
    hostile_host: Host, challenge: Challenge
) -> None:
    """All cases concurrently, through the PUT of write-read: still each its reason,
    still within one probe's bound (they do not queue behind each other)."""
    started = time.monotonic()
    verdicts = await asyncio.gather(
        *(
            run_check(hostile_host, on_port(challenge, port), "write-read")
            for port in PORTS.values()
        )
    )
    elapsed = time.monotonic() - started
    reasons = {case: v.failure_reason for case, v in zip(PORTS, verdicts, strict=True)}
    assert reasons == {case: reason for case, reason in CASES.items()}
    assert elapsed < probe_bound(challenge, "write-read")


@pytest.mark.parametrize("case", MEMORY_CASES)
async def test_memory_per_probe_is_bounded(
    hostile_host: Host, challenge: Challenge, case: str
) -> None:
    limits = limits_of_milestone(challenge, "service-up")
    tracemalloc.start()
    try:
        with pytest.raises(ProbeError) as caught:
            await http_request(hostile_host, PORTS[case], "GET", "/health", limits=limits)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert classify_error(caught.value).reason == CASES[case]
    assert peak < limits.max_body_bytes + limits.max_header_bytes + MEMORY_SLACK, peak


def limits_of_milestone(challenge: Challenge, milestone: str) -> ProbeLimits:
    m = challenge.milestone(milestone)
    return ProbeLimits(
        connect_timeout_s=m.connect_timeout_s,
        read_timeout_s=m.read_timeout_s,
        max_header_bytes=m.max_header_bytes,
        max_body_bytes=m.max_body_bytes,
    )


async def test_the_referee_keeps_its_cadence_for_a_neighbour_of_a_hostile_service(
    hostile_host: Host, shared_hosts: SharedHosts, challenge: Challenge
) -> None:
    """A full referee: one territory never answers (every attempt waits out the read
    timeout), the neighbour answers at once (and keeps failing write-read, so it is
    attempted at every cadence). The neighbour's attempts stay one cadence apart."""
    neighbour = await shared_hosts("neighbour")
    await start_hostile_server(neighbour, {"healthy": challenge.port}, unit="builder-app")
    clock = AttemptClock()
    referee = Referee(challenge, seed=SEED, emit=clock.emit, clock=lambda: 0)
    referee.add_territory("hostile", hostile_host)
    referee.add_territory("neighbour", neighbour)
    judging = asyncio.create_task(referee.run())
    # Until the neighbour's attempts give ten intervals and the hostile one was judged.
    deadline = time.monotonic() + 120
    while len(clock.started.get("neighbour", [])) < 11 or not any(
        r["territory"] == "hostile" for r in clock.results
    ):
        assert time.monotonic() < deadline and not judging.done(), clock.started
        await asyncio.sleep(0.1)
    judging.cancel()
    await asyncio.gather(judging, return_exceptions=True)

    hostile_results = [r for r in clock.results if r["territory"] == "hostile"]
    assert hostile_results and {r["failure_reason"] for r in hostile_results} == {"timeout"}
    neighbour_results = [r for r in clock.results if r["territory"] == "neighbour"]
    assert {r["failure_reason"] for r in neighbour_results[1:]} == {"record_corrupted"}
    # From the second write-read attempt on, attempts follow the cadence.
    intervals = clock.intervals("neighbour")[2:]
    assert len(intervals) >= 8, clock.started
    assert percentile(intervals, 99) < challenge.cadence_s + 0.5, intervals
