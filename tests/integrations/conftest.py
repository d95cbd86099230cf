"""Fixtures for the Inspect integration: hosts made by the `opsarena` sandbox provider.

Every host the provider makes in a test has a match id starting with that test's own
`inspect-t<hex>-` prefix, and whatever a test leaves is swept by that prefix.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from opsarena.hosts import get_driver
from tests.conftest import TEST_IMAGE, new_match_id


async def sweep(prefix: str) -> None:
    """Remove every host whose match id starts with `prefix`."""
    driver = get_driver("podman")
    infos = [i for i in await driver.list() if i.match_id.startswith(prefix)]
    await asyncio.gather(*(driver.remove(i.name) for i in infos))


@pytest.fixture
async def match_prefix() -> AsyncIterator[str]:
    prefix = f"inspect-{new_match_id()}-"
    try:
        yield prefix
    finally:
        await asyncio.shield(sweep(prefix))


__all__ = ["TEST_IMAGE", "sweep"]
