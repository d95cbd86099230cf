"""Inspect's own portable conformance suite against the `opsarena` sandbox, on a real host.

The checks come from `inspect_ai.util._sandbox.self_check` unchanged; they share one
host (each check cleans up after itself), made and removed by the provider's own
sample init and cleanup. docs/INSPECT.md lists the result; there are no xfails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.self_check import *  # noqa: F403

from opsarena.integrations.inspect.sandbox import (
    OpsarenaSandboxConfig,
    OpsarenaSandboxEnvironment,
)
from tests.conftest import new_match_id
from tests.integrations.conftest import TEST_IMAGE, sweep

pytestmark = pytest.mark.hosts

XFAIL: dict[str, str] = {}
"""Checks this provider cannot pass, with the reason (docs/INSPECT.md). None today."""


@pytest.fixture(scope="module")
async def shared_sandbox() -> AsyncIterator[SandboxEnvironment]:
    prefix = f"inspect-{new_match_id()}-"
    config = OpsarenaSandboxConfig(image=TEST_IMAGE, match_prefix=prefix)
    await OpsarenaSandboxEnvironment.task_init("self_check", config)
    environments = await OpsarenaSandboxEnvironment.sample_init("self_check", config, {})
    try:
        yield environments["default"]
    finally:
        await OpsarenaSandboxEnvironment.sample_cleanup("self_check", config, environments, False)
        await OpsarenaSandboxEnvironment.task_cleanup("self_check", config, True)
        await sweep(prefix)


@pytest.fixture
async def sandbox_env(
    request: pytest.FixtureRequest, shared_sandbox: SandboxEnvironment
) -> SandboxEnvironment:
    reason = XFAIL.get(request.node.originalname)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    return shared_sandbox


def test_the_suite_is_all_here() -> None:
    """The suite we run is Inspect's whole suite: 44 checks in 0.3.285, none skipped."""
    from inspect_ai.util._sandbox import self_check

    assert len(self_check.__all__) >= 44
    assert set(self_check.__all__) <= set(globals())
