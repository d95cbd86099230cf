"""The durability builders against the real faults, at the Host level.

Each builder deploys on a real power-cut-capable host; records are written and read
back over HTTP through `Host.connect` with the referee's own probe, never through a
command's output. What is asserted is what is certain; `bench/faults.py` gives rates.
"""

from __future__ import annotations

import asyncio

import pytest

from opsarena.agents.scripted import get_scripted
from opsarena.agents.scripted.deploy import service_target
from opsarena.challenges.catalog import builtin_root
from opsarena.errors import ServiceNotRestartedError
from opsarena.hosts import Host, HostDriver, HostSpec
from opsarena.referee.probe import ProbeError, http_request
from tests.conftest import TEST_IMAGE, new_match_id

pytestmark = pytest.mark.hosts

TARGET = service_target({})


async def deployed(driver: HostDriver, match_id: str, builder: str) -> Host:
    host = await driver.create(
        HostSpec(match_id=match_id, territory="a", image=TEST_IMAGE, power_cut=True, disk_mb=256)
    )
    builder_of = get_scripted(builder, builtin_root() / "crash-safe-records")
    result = await builder_of.deploy(host, TARGET, wait_seconds=20.0)
    assert result is not None and result.ok, result and result.stderr
    # What the builder installed is made durable, as an agent finishing its work would
    # (the test is about the service's own writes, not the installation's).
    assert (await host.exec("sync", timeout=30)).ok
    return host


async def put(host: Host, record_id: str, value: bytes) -> None:
    response = await http_request(host, TARGET.port, "PUT", f"/records/{record_id}", body=value)
    assert 200 <= response.status < 300, response


async def read_back(host: Host, records: dict[str, bytes]) -> dict[str, str]:
    """Each record's fate after a fault: `ok`, `missing` or `wrong`."""
    await wait_serving(host)
    fates = {}
    for record_id, value in records.items():
        response = await http_request(host, TARGET.port, "GET", f"/records/{record_id}")
        if response.status == 404:
            fates[record_id] = "missing"
        else:
            fates[record_id] = "ok" if (response.status, response.body) == (200, value) else "wrong"
    return fates


async def wait_serving(host: Host, seconds: float = 20.0) -> None:
    for _ in range(int(seconds / 0.1)):
        try:
            if (await http_request(host, TARGET.port, "GET", "/health")).status == 200:
                return
        except ProbeError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("the service did not answer after the fault")


POWER_CUT_ROUNDS = 5
"""Cuts the no-fsync service gets to show it loses unsynced records (see its test)."""


def batch(prefix: str, count: int = 10) -> dict[str, bytes]:
    return {f"{prefix}-{index}": f"{prefix} value {index}\n".encode() for index in range(count)}


async def put_all(host: Host, records: dict[str, bytes]) -> None:
    for record_id, value in records.items():
        await put(host, record_id, value)


@pytest.fixture
def driver(podman_driver: HostDriver) -> HostDriver:
    return podman_driver


async def test_reference_loses_nothing_to_a_crash_or_a_power_cut(driver: HostDriver) -> None:
    match_id = new_match_id("ref")
    try:
        host = await deployed(driver, match_id, "reference")
        before_crash = batch("crash")
        await put_all(host, before_crash)
        await host.crash_service(TARGET.unit)
        assert set((await read_back(host, before_crash)).values()) == {"ok"}

        before_cut = batch("cut")
        await put_all(host, before_cut)
        await host.power_cut()
        fates = await read_back(host, before_crash | before_cut)
        assert set(fates.values()) == {"ok"}, fates
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))


async def test_no_fsync_survives_a_crash_but_loses_records_to_a_power_cut(
    driver: HostDriver,
) -> None:
    match_id = new_match_id("nofs")
    try:
        host = await deployed(driver, match_id, "no-fsync")
        records = batch("r")
        await put_all(host, records)
        await host.crash_service(TARGET.unit)  # the page cache keeps plain writes
        assert set((await read_back(host, records)).values()) == {"ok"}

        # Written moments before the cut and never synced: gone, unless a machine-wide
        # sync(2) (another test's host) landed between the writes and the cut, as it may
        # on a real machine; so a fresh batch and a cut again, until one cut takes them all.
        seen = []
        for cut in range(POWER_CUT_ROUNDS):
            if cut:
                records = batch(f"cut{cut}")
                await put_all(host, records)
            await host.power_cut()
            fates = await read_back(host, records)
            seen.append(fates)
            if "ok" not in fates.values():
                break
        assert "ok" not in seen[-1].values(), seen
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))


async def test_ack_before_write_survives_a_restart_and_loses_records_to_a_crash(
    driver: HostDriver,
) -> None:
    match_id = new_match_id("ack")
    try:
        host = await deployed(driver, match_id, "ack-before-write")
        first = batch("restart")
        await put_all(host, first)
        await host.restart_service(TARGET.unit)  # SIGTERM: it stores what it holds
        assert set((await read_back(host, first)).values()) == {"ok"}

        second = batch("crash", 3)  # few, so the crash comes well within the 5 s delay
        await put_all(host, second)
        await host.crash_service(TARGET.unit)  # SIGKILL within the persist delay
        fates = await read_back(host, first | second)
        assert all(fates[record_id] == "ok" for record_id in first)
        assert all(fates[record_id] == "missing" for record_id in second), fates
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))


async def test_no_restart_is_not_restarted_after_a_crash(driver: HostDriver) -> None:
    match_id = new_match_id("norst")
    try:
        host = await deployed(driver, match_id, "no-restart")
        await put_all(host, batch("r", 2))
        with pytest.raises(ServiceNotRestartedError):
            await host.crash_service(TARGET.unit, timeout=3.0)
        with pytest.raises(ProbeError):
            await http_request(host, TARGET.port, "GET", "/health")
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))


async def test_fsync_no_dirsync_never_returns_a_wrong_record_after_a_power_cut(
    driver: HostDriver,
) -> None:
    """What the cut does to it depends on ext4's journal (a later fsync commits earlier
    renames): certain is only that a record is either its value or absent, and that the
    records renamed before the last fsync made their renames durable."""
    match_id = new_match_id("nodir")
    try:
        host = await deployed(driver, match_id, "fsync-no-dirsync")
        records = batch("r")
        await put_all(host, records)
        await host.power_cut()
        fates = await read_back(host, records)
        assert "wrong" not in fates.values(), fates
        ordered = list(records)
        # Every rename but the last was followed by another record's fsync.
        assert all(fates[record_id] == "ok" for record_id in ordered[:-1]), fates
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))
