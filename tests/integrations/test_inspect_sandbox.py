"""The `opsarena` sandbox beyond Inspect's self_check, on real hosts: whole-tree kill on
timeout, output limits, connection, unavailability, and `inspect sandbox cleanup`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
from inspect_ai.util import OutputLimitExceededError
from inspect_ai.util._sandbox.environment import SandboxUnavailableError
from inspect_ai.util._sandbox.limits import override_max_exec_output_size

from opsarena.hosts import get_driver
from opsarena.integrations.inspect.sandbox import (
    OpsarenaSandboxConfig,
    OpsarenaSandboxEnvironment,
)
from tests.conftest import new_match_id
from tests.integrations.conftest import TEST_IMAGE, sweep

pytestmark = pytest.mark.hosts


async def make_sandbox(prefix: str) -> OpsarenaSandboxEnvironment:
    config = OpsarenaSandboxConfig(image=TEST_IMAGE, match_prefix=prefix)
    environments = await OpsarenaSandboxEnvironment.sample_init("test", config, {})
    environment = environments["default"]
    assert isinstance(environment, OpsarenaSandboxEnvironment)
    return environment


@pytest.fixture(scope="module")
async def sandbox() -> AsyncIterator[OpsarenaSandboxEnvironment]:
    """One host for the checks that leave it as they found it."""
    prefix = f"inspect-{new_match_id()}-"
    environment = await make_sandbox(prefix)
    try:
        yield environment
    finally:
        await OpsarenaSandboxEnvironment.sample_cleanup(
            "test", environment.config, {"default": environment}, False
        )
        await sweep(prefix)


async def test_timeout_kills_processes_that_left_the_process_group(
    sandbox: OpsarenaSandboxEnvironment,
) -> None:
    marker = "escaped_daemon_marker"
    with pytest.raises(TimeoutError):
        await sandbox.exec(
            ["sh", "-c", f"setsid sh -c 'sleep 300 # {marker}' & sleep 300"], timeout=2
        )
    left = await sandbox.exec(["sh", "-c", f"ps -eo args | grep {marker} | grep -v grep"])
    assert left.stdout.strip() == ""
    # Without a timeout, a daemon the agent starts stays up (it may be its service).
    await sandbox.exec(["sh", "-c", f"setsid sh -c 'sleep 300 # {marker}' >/dev/null 2>&1 &"])
    kept = await sandbox.exec(["sh", "-c", f"ps -eo args | grep {marker} | grep -v grep"])
    assert marker in kept.stdout
    await sandbox.exec(["pkill", "-f", marker])


async def test_users_by_name_or_uid(sandbox: OpsarenaSandboxEnvironment) -> None:
    for user in ("nobody", "65534"):
        result = await sandbox.exec(["sh", "-c", "id -un; echo $PATH"], user=user)
        assert result.stdout.splitlines()[0] == "nobody", result
        # The command's PATH is the sandbox's, not the provider's pinned one.
        assert "/usr/local/bin" in result.stdout.splitlines()[1]
    assert (await sandbox.exec(["id", "-u"], user="0")).stdout == "0\n"
    missing = await sandbox.exec(["id"], user="4242")
    assert not missing.success and "4242" in missing.stderr


async def test_output_over_the_limit_raises(sandbox: OpsarenaSandboxEnvironment) -> None:
    with override_max_exec_output_size(1024), pytest.raises(OutputLimitExceededError) as error:
        await sandbox.exec(["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x"])
    assert "limit of 1 KiB was exceeded" in str(error.value)
    assert error.value.truncated_output is not None
    assert error.value.truncated_output.startswith("x" * 1024)


async def test_connection_names_the_host(sandbox: OpsarenaSandboxEnvironment) -> None:
    connection = await sandbox.connection()
    assert connection.type == "opsarena"
    assert connection.command == f"opsarena hosts shell {sandbox.host.name}"
    assert connection.container == sandbox.host.name
    as_bob = await sandbox.connection(user="bob")
    assert as_bob.command == f"opsarena hosts shell {sandbox.host.name} --user bob"
    with pytest.raises(ValueError, match="is not a user name"):
        await sandbox.connection(user="-bob")


def test_inspect_sandbox_cleanup_removes_only_what_it_is_asked_to(match_prefix: str) -> None:
    async def two_hosts() -> tuple[OpsarenaSandboxEnvironment, OpsarenaSandboxEnvironment]:
        first, second = await asyncio.gather(make_sandbox(match_prefix), make_sandbox(match_prefix))
        return first, second

    gone, kept = asyncio.run(two_hosts())
    done = subprocess.run(
        [sys.executable, "-m", "inspect_ai", "sandbox", "cleanup", "opsarena",
         gone.host.match_id],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"removed {gone.host.name}" in done.stdout

    async def left() -> list[str]:
        infos = await get_driver("podman").list()
        return [i.name for i in infos if i.match_id.startswith(match_prefix)]

    assert asyncio.run(left()) == [kept.host.name]

    async def use_removed() -> None:
        with pytest.raises(SandboxUnavailableError):
            await gone.exec(["true"])
        with pytest.raises(ConnectionError):
            await gone.connection()

    asyncio.run(use_removed())
