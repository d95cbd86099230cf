"""The arena's line to a host's systemd (`hosts/systemd_bus.py`) when that systemd does
not answer: a one-line host error the callers retry on, never a bare socket timeout.

Seen at 32 territories under load: a host's systemd, busy booting, did not answer the
authentication in time; the raw `TimeoutError` escaped `wait_ready` and ended the whole
match in provisioning."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import struct
from collections.abc import Iterator

import pytest

from opsarena.errors import HostBootError, HostUnavailableError
from opsarena.hosts.podman import PodmanHost
from tests.conftest import HostFactory

pytestmark = pytest.mark.hosts

PEERCRED = struct.Struct("3i")  # pid, uid, gid


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


def bus_connections(init_pid: int) -> set[int]:
    """The sockets of this process connected to the systemd running as `init_pid` (peer
    by SO_PEERCRED), by inode: the arena's bus connections to that host, as the kernel
    holds them."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError, ValueError):
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            with socket.socket(fileno=os.dup(fd)) as sock:
                if sock.family != socket.AF_UNIX:
                    continue
                creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
                if PEERCRED.unpack(creds)[0] == init_pid:
                    found.add(os.fstat(fd).st_ino)
    return found


async def test_unit_questions_share_one_connection_until_systemd_drops_it(
    host_factory: HostFactory,
) -> None:
    host = await host_factory("kept")
    assert isinstance(host, PodmanHost)
    init = await host._init_pid()
    first = await host.unit_members("systemd-journald.service")
    kept = bus_connections(init)
    assert len(kept) == 1 and first
    for _ in range(5):
        assert await host.unit_members("systemd-journald.service") == first
    assert bus_connections(init) == kept
    # systemd re-executing closes every bus connection: the next question connects again.
    reexec = await host.exec("systemctl daemon-reexec", timeout=60)
    assert reexec.exit_code == 0, reexec.stderr
    assert await host.unit_members("systemd-journald.service") == first
    again = bus_connections(init)
    assert len(again) == 1 and again != kept
    # A reboot is another init: a connection to it, none left to the old one.
    await host.reboot(timeout=60)
    after = await host.unit_members("systemd-journald.service")
    assert after and after != first
    rebooted = await host._init_pid()
    assert rebooted != init and bus_connections(init) == set()
    assert len(bus_connections(rebooted)) == 1
