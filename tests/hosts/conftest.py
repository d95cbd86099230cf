"""The conformance suite runs once per registered host driver."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

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


RuncFactory = Callable[[str, str], str]
"""`runc_container(root, match_id)` runs a runc container podman never knew, annotated as
`match_id`'s, in runc's state `root`; returns its id."""


@pytest.fixture
def runc_container(tmp_path: Path) -> Iterator[RuncFactory]:
    """Runc containers made behind podman's back (as a host podman forgot leaves), each
    killed and deleted at teardown whatever the test did."""
    made: list[tuple[str, str]] = []

    def make(root: str, match_id: str) -> str:
        layer = json.loads(subprocess.run(
            ["podman", "image", "inspect", "--format", "json", TEST_IMAGE],
            check=True, capture_output=True, text=True,
        ).stdout)[0]["GraphDriver"]["Data"]["UpperDir"]  # fmt: skip
        bundle = tmp_path / f"bundle{len(made)}"
        bundle.mkdir()
        spec = {
            "ociVersion": "1.0.2",
            "process": {"args": ["/bin/sleep", "1000"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "root": {"path": layer, "readonly": True},
            "annotations": {"opsarena.match": match_id},
            "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "network"}]},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        }
        (bundle / "config.json").write_text(json.dumps(spec))
        name = f"opsarena-orphan-{match_id}-{len(made)}"
        made.append((root, name))
        subprocess.run(
            ["runc", "--root", root, "run", "--detach", "--bundle", str(bundle), name],
            check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, timeout=30,
        )  # fmt: skip
        return name

    try:
        yield make
    finally:
        for root, name in made:
            with contextlib.suppress(subprocess.SubprocessError):
                subprocess.run(["runc", "--root", root, "delete", "--force", name],
                               check=False, capture_output=True, timeout=30)  # fmt: skip
