"""Making and removing hosts: clear errors, nothing left running, only our hosts touched."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsarena.errors import HostBootError, HostError, HostNotFoundError, ImageMissingError
from opsarena.hosts import HostDriver, HostSpec
from tests.conftest import TEST_IMAGE, new_match_id, podman_names

pytestmark = pytest.mark.hosts

pytest_plugins = ["pytester"]


@pytest.fixture
def unbootable_image() -> Iterator[str]:
    """An image with no /sbin/init: podman can create it but it never boots."""
    name = f"localhost/opsarena-test-unbootable:{new_match_id('i')}"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("etc/hostname")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"none\n"))
    subprocess.run(
        ["podman", "import", "-", name], input=buffer.getvalue(), check=True, capture_output=True
    )
    try:
        yield name
    finally:
        subprocess.run(["podman", "rmi", "--force", name], check=False, capture_output=True)


async def test_missing_image_is_a_clear_error_and_leaves_nothing(podman_driver: HostDriver) -> None:
    match_id = new_match_id()
    with pytest.raises(ImageMissingError, match="opsarena image build"):
        await podman_driver.create(
            HostSpec(match_id=match_id, territory="a", image="localhost/no-such-image:x")
        )
    assert podman_names(match_id) == []


async def test_host_that_cannot_boot_is_removed(
    podman_driver: HostDriver, unbootable_image: str
) -> None:
    match_id = new_match_id()
    with pytest.raises(HostBootError, match="did not start"):
        await podman_driver.create(
            HostSpec(match_id=match_id, territory="a", image=unbootable_image)
        )
    assert podman_names(match_id) == []


async def test_duplicate_and_unknown_hosts_are_clear_errors(
    podman_driver: HostDriver, match_id: str
) -> None:
    try:
        await podman_driver.create(HostSpec(match_id=match_id, territory="a", image=TEST_IMAGE))
        with pytest.raises(HostError, match="exists already"):
            await podman_driver.create(HostSpec(match_id=match_id, territory="a", image=TEST_IMAGE))
        assert [info.territory for info in await podman_driver.list(match_id=match_id)] == ["a"]
    finally:
        assert await podman_driver.cleanup(match_id=match_id) == [f"opsarena-{match_id}-a"]
    with pytest.raises(HostNotFoundError):
        await podman_driver.get(f"opsarena-{match_id}-a")
    with pytest.raises(HostNotFoundError):
        await podman_driver.remove(f"opsarena-{match_id}-a")


async def test_cleanup_touches_only_what_opsarena_labelled(
    podman_driver: HostDriver, match_id: str
) -> None:
    stranger = f"stranger-{match_id}"
    subprocess.run(
        ["podman", "create", "--name", stranger, TEST_IMAGE, "true"],
        check=True,
        capture_output=True,
    )
    other = new_match_id()
    try:
        await asyncio.gather(
            *(
                podman_driver.create(HostSpec(match_id=match_id, territory=t, image=TEST_IMAGE))
                for t in ("a", "b")
            )
        )
        await podman_driver.create(HostSpec(match_id=other, territory="a", image=TEST_IMAGE))
        removed = await podman_driver.cleanup(match_id=match_id)
        assert sorted(removed) == [f"opsarena-{match_id}-a", f"opsarena-{match_id}-b"]
        assert podman_names(match_id) == []
        assert podman_names(other) == [f"opsarena-{other}-a"]
        with pytest.raises(HostNotFoundError, match="not an opsarena host"):
            await podman_driver.get(stranger)
        await podman_driver.cleanup(match_id=other)
        exists = subprocess.run(["podman", "container", "exists", stranger], check=False)
        assert exists.returncode == 0, "cleanup removed a container opsarena did not make"
    finally:
        subprocess.run(["podman", "rm", "--force", stranger], check=False, capture_output=True)
        for made in (match_id, other):
            await asyncio.shield(podman_driver.cleanup(match_id=made))


def test_hosts_of_a_test_that_failed_midway_are_removed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    conftest = Path(__file__).parent.parent / "conftest.py"
    # The copied conftest imports `tests.leaks` (its end-of-session leak check).
    root = str(Path(__file__).parent.parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest(conftest.read_text())
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = session\n"
        "asyncio_default_test_loop_scope = session\nmarkers =\n    hosts: real hosts\n"
    )
    pytester.makepyfile(
        test_inner=textwrap.dedent(
            """
            from pathlib import Path

            async def test_fails_midway(host_factory, match_id):
                Path("match_id").write_text(match_id)
                host = await host_factory("midway")
                assert (await host.exec("true", timeout=10)).exit_code == 0
                raise RuntimeError("the test broke after making its host")
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    match_id = (pytester.path / "match_id").read_text()
    assert podman_names(match_id) == []
