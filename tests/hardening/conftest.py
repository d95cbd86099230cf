"""Fixtures for the hardening suite: hosts shared by a whole module, removed at its end.

Booting a host costs about a second and the suite needs a handful, so cases that only
read a host's state share one (`shared_hosts`); cases that damage a host (fork bomb,
memory hog, disk fill) get their own territory in the same module's match.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from opsarena.hosts import Host, HostSpec, get_driver
from tests.conftest import TEST_IMAGE, new_match_id

SharedHosts = Callable[..., Awaitable[Host]]


@pytest.fixture(scope="module")
async def shared_hosts() -> AsyncIterator[SharedHosts]:
    """`await shared_hosts("territory", **spec)` boots that territory's host once per
    module and returns the same host to every later call; all are removed at the end."""
    driver = get_driver("podman")
    match_id = new_match_id("hard")
    made: dict[str, Host] = {}
    lock = asyncio.Lock()

    async def get(territory: str, **spec: object) -> Host:
        async with lock:
            if territory not in made:
                made[territory] = await driver.create(
                    HostSpec(match_id=match_id, territory=territory, image=TEST_IMAGE, **spec)  # type: ignore[arg-type]
                )
            return made[territory]

    try:
        yield get
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))
