"""Listing runc's containers while others come and go (`hosts/runc.py`): runc 1.1's own
`list` fails whole when a container's state directory vanishes mid-listing, which under
a busy test run made the runtime sweep see no containers at all."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsarena.hosts.runc import runc_containers
from tests.conftest import new_match_id
from tests.hosts.conftest import RuncFactory

pytestmark = pytest.mark.hosts

LISTINGS = 40


@pytest.fixture
def churn(tmp_path: Path) -> Iterator[Path]:
    """A private runc state root where entries appear and vanish without pause, as
    containers deleted by other tests do in /run/runc; the churn stops at teardown."""
    root = tmp_path / "runc"
    root.mkdir()
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            for i in range(8):
                os.mkdir(root / f"gone{i}")
            for i in range(8):
                os.rmdir(root / f"gone{i}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield root
    finally:
        stop.set()
        thread.join()


async def test_every_listing_names_the_container_that_lives_while_others_vanish(
    churn: Path, runc_container: RuncFactory
) -> None:
    match_id = new_match_id("runc")
    kept = await asyncio.to_thread(runc_container, str(churn), match_id)

    for _ in range(LISTINGS):
        rows = await runc_containers("runc", str(churn), timeout=30)
        assert [row["id"] for row in rows] == [kept]
        assert rows[0]["annotations"] == {"opsarena.match": match_id}


async def test_a_root_runc_never_used_lists_nothing(tmp_path: Path) -> None:
    assert await runc_containers("runc", str(tmp_path / "none"), timeout=30) == []
