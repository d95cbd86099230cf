"""A host that stops by itself is the competitor's doing: `HostDownError`, `host_down`.

Before, a host whose init was OOM-killed (filling /tmp past its memory limit) or that
powered itself off was reported `host_unavailable`, a referee_error that blamed the
arena. The driver now tells them apart from podman failures and from its own reboots.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from opsarena.errors import HostDownError
from opsarena.hosts import Host
from opsarena.referee.failures import classify_error
from tests.conftest import HostFactory

pytestmark = pytest.mark.hosts


async def stopped(host: Host, within_s: float = 60) -> HostDownError:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            _reader, writer = await host.connect(22, timeout=2)
            writer.close()
        except HostDownError as exc:
            return exc
        except (ConnectionRefusedError, TimeoutError):
            pass
        await asyncio.sleep(0.5)
    raise AssertionError(f"{host.name} did not stop within {within_s}s")


async def test_a_host_that_powers_itself_off_is_down_by_its_own_doing(
    host_factory: HostFactory,
) -> None:
    host = await host_factory("quitter")
    await host.exec("systemctl poweroff --no-block", timeout=10)
    error = await stopped(host)
    assert "stopped by itself" in str(error) and "exit" in str(error)
    assert classify_error(error).reason == "host_down"
    assert classify_error(error).category == "verification_failed"
    with pytest.raises(HostDownError):
        await host.exec(["true"], timeout=10)


async def test_a_host_whose_init_runs_out_of_memory_is_down_by_its_own_doing(
    host_factory: HostFactory,
) -> None:
    host = await host_factory("hog", memory_mb=128)
    # /tmp is tmpfs charged to the host's memory: filling it leaves nothing for init.
    await host.exec("head -c 1G /dev/zero > /tmp/fill", timeout=60)
    try:
        error = await stopped(host, within_s=20)
    except AssertionError:
        pytest.skip("the host's OOM killer chose the writer, not init: the host is still up")
    assert "stopped by itself" in str(error)
    assert classify_error(error).reason == "host_down"


async def test_the_arenas_own_reboot_is_never_host_down(host_factory: HostFactory) -> None:
    host = await host_factory("rebooted")
    reboot = asyncio.create_task(host.reboot(hard=True))
    seen: list[BaseException] = []
    while not reboot.done():
        try:
            await host.exec(["true"], timeout=5)
        except Exception as exc:  # the host is briefly down while it reboots
            seen.append(exc)
        await asyncio.sleep(0.02)
    await reboot
    assert not any(isinstance(exc, HostDownError) for exc in seen), seen
