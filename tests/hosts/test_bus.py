"""The arena's line to a host's systemd (`hosts/systemd_bus.py`) when that systemd does
not answer: a one-line host error the callers retry on, never a bare socket timeout.

Seen at 32 territories under load: a host's systemd, busy booting, did not answer the
authentication in time; the raw `TimeoutError` escaped `wait_ready` and ended the whole
match in provisioning."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

from opsarena.errors import HostBootError, HostUnavailableError
from opsarena.hosts.podman import PodmanHost
from tests.conftest import HostFactory

pytestmark = pytest.mark.hosts


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process `pid` stopped (SIGSTOP) for the block, continued whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_a_systemd_that_does_not_answer_is_unavailable_and_not_ready(
    host_factory: HostFactory,
) -> None:
    host = await host_factory("mute")
    assert isinstance(host, PodmanHost)
    init = await host._init_pid()
    with stopped(init):
        with pytest.raises(HostUnavailableError, match=r"did not authenticate within 0\.5s"):
            await host._bus("asking", 0.5)
        with pytest.raises(HostBootError, match="not ready within 1s"):
            await host.wait_ready(1.0)
    assert await host.wait_ready(30.0) in ("running", "degraded")  # answers again
