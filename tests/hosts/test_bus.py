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
from typing import Any

import pytest

from opsarena.errors import HostBootError, HostUnavailableError
from opsarena.hosts import systemd_bus
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


async def test_unit_questions_share_one_connection_until_systemd_drops_it(
    host_factory: HostFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = await host_factory("kept")
    connects: list[int] = []
    real = systemd_bus._run_connector

    def counted(init_pid: int, *args: Any, **kwargs: Any) -> None:
        connects.append(init_pid)
        real(init_pid, *args, **kwargs)

    monkeypatch.setattr(systemd_bus, "_run_connector", counted)
    first = await host.unit_members("systemd-journald.service")
    for _ in range(5):
        assert await host.unit_members("systemd-journald.service") == first
    assert len(connects) == 1 and first
    # systemd re-executing closes every bus connection: the next question connects again.
    reexec = await host.exec("systemctl daemon-reexec", timeout=60)
    assert reexec.exit_code == 0, reexec.stderr
    assert await host.unit_members("systemd-journald.service") == first
    assert len(connects) == 2
    # A reboot is another init: a connection to it, never the old one's.
    await host.reboot(timeout=60)
    after = await host.unit_members("systemd-journald.service")
    assert after and after != first
    assert len(connects) >= 3 and connects[-1] != connects[0]
