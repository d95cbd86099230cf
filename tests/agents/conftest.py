"""Fixtures of the agent tests: one host per module for tests that do not depend on the
host's state, and the LLM API double in both its flavours."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from opsarena.hosts import Host, HostSpec, get_driver
from tests.agents.openai_double import OpenAIDouble
from tests.conftest import TEST_IMAGE, new_match_id


@pytest.fixture(scope="module")
async def agents_host() -> AsyncIterator[Host]:
    driver = get_driver("podman")
    match_id = new_match_id("ag")
    try:
        yield await driver.create(HostSpec(match_id=match_id, territory="shared", image=TEST_IMAGE))
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))


@pytest.fixture
async def openai_double() -> AsyncIterator[OpenAIDouble]:
    double = OpenAIDouble()
    await double.start()
    try:
        yield double
    finally:
        await double.stop()


@pytest.fixture
async def plain_double() -> AsyncIterator[OpenAIDouble]:
    """The double in its api.openai.com flavour."""
    double = OpenAIDouble("openai")
    await double.start()
    try:
        yield double
    finally:
        await double.stop()
