"""Probes against a real misbehaving server inside a real host: each raw failure, on the
wire, lands on its row of the failure table."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from opsarena.hosts import Host
from opsarena.referee.failures import classify_error
from opsarena.referee.probe import ProbeError, ProbeLimits, http_request
from tests.conftest import HostFactory

PORT = 8081
SERVER = Path(__file__).parent / "data" / "misbehaving_server.py"
LIMITS = ProbeLimits(
    connect_timeout_s=2.0, read_timeout_s=1.5, max_header_bytes=16 * 1024, max_body_bytes=64 * 1024
)


async def start_server(host: Host) -> None:
    await host.write_file("/opt/misbehaving_server.py", SERVER.read_bytes())
    command = ["systemd-run", "--unit=misbehaving", "/usr/bin/python3"]
    started = await host.exec([*command, "/opt/misbehaving_server.py", str(PORT)], timeout=30)
    assert started.ok, started.stderr
    for _ in range(100):
        try:
            await http_request(host, PORT, "GET", "/ok", limits=LIMITS)
            return
        except ProbeError:
            await asyncio.sleep(0.1)
    raise AssertionError("the misbehaving server did not start")


@pytest.mark.hosts
async def test_probes_classify_every_raw_failure(host_factory: HostFactory) -> None:
    host = await host_factory("probe")
    await start_server(host)

    ok = await http_request(host, PORT, "GET", "/ok", limits=LIMITS)
    assert (ok.status, ok.body) == (200, b"ready")
    bad = await http_request(host, PORT, "GET", "/status-500", limits=LIMITS)
    assert (bad.status, bad.body) == (500, b"boom")

    cases = {
        "/big-headers": ("receive", "headers_too_large"),
        "/big-declared-body": ("receive", "body_too_large"),
        "/big-chunked-body": ("receive", "body_too_large"),
        "/close-early": ("receive", "connection_closed"),
        "/close-now": ("receive", "connection_closed"),
        "/reset": ("receive", "connection_reset"),
        "/garbage": ("receive", "protocol_error"),
        "/slow": ("receive", "timeout"),
        "/drip": ("receive", "timeout"),
    }
    seen = {}
    for path in cases:
        with pytest.raises(ProbeError) as caught:
            await http_request(host, PORT, "GET", path, limits=LIMITS)
        seen[path] = (caught.value.phase, classify_error(caught.value).reason)
    assert seen == cases

    with pytest.raises(ProbeError) as refused:
        await http_request(host, PORT + 1, "GET", "/health", limits=LIMITS)
    assert refused.value.phase == "connect"
    assert classify_error(refused.value).reason == "connection_refused"


@pytest.mark.hosts
async def test_a_body_over_the_limit_stops_the_read(host_factory: HostFactory) -> None:
    host = await host_factory("probe")
    await start_server(host)
    with pytest.raises(ProbeError) as caught:
        await http_request(host, PORT, "GET", "/big-chunked-body", limits=LIMITS)
    cause = caught.value.cause
    # The server offers 16 MB; the probe stopped within one read of the 64 KiB limit.
    assert getattr(cause, "received", 0) <= LIMITS.max_body_bytes + 64 * 1024
