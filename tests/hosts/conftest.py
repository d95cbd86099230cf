"""The conformance suite runs once per registered host driver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from opsarena.hosts import Host, HostDriver, HostSpec, driver_names, get_driver
from tests.conftest import TEST_IMAGE, new_match_id


@pytest.fixture(scope="module", params=driver_names())
def driver(request: pytest.FixtureRequest) -> HostDriver:
    return get_driver(request.param)


@pytest.fixture(scope="module")
async def shared_host(driver: HostDriver) -> AsyncIterator[Host]:
    """One host for the tests that do not change its state (exec, files, connect)."""
    match_id = new_match_id("conf")
    try:
        yield await driver.create(HostSpec(match_id=match_id, territory="shared", image=TEST_IMAGE))
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))
