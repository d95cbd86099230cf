"""Counting disks through the kept helper (`hosts/diskcount.py`): the totals `du` gives,
a count past its timeout killed, and a helper that died replaced on the next count."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from opsarena.hosts import diskcount


def du(path: Path, *flags: str) -> int:
    out = subprocess.run(["du", "-sx", *flags, "--", str(path)], capture_output=True, text=True)
    return int(out.stdout.split()[0])


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for i in range(20):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / "f").write_bytes(os.urandom(5000 * i))
    return tmp_path


async def test_the_totals_are_those_of_du(tree: Path) -> None:
    counted = await diskcount.count(str(tree), 30)
    assert counted.code == 0 and counted.err == ""
    totals = [int(line.split()[0]) for line in counted.out.splitlines()]
    assert totals == [du(tree, "-B1"), du(tree, "--inodes")]


async def test_a_missing_directory_is_du_s_error(tmp_path: Path) -> None:
    counted = await diskcount.count(str(tmp_path / "none"), 30)
    assert counted.code == 1 and "No such file or directory" in counted.err


async def test_a_count_past_its_timeout_is_killed(tree: Path) -> None:
    # No `du` is done the moment it starts: a timeout of 0 is always past.
    counted = await diskcount.count(str(tree), 0.0)
    assert counted.code is None


async def test_a_helper_that_died_is_replaced(tree: Path) -> None:
    await diskcount.count(str(tree), 30)
    helper = diskcount._helper
    assert helper is not None
    helper.process.kill()
    helper.process.wait()
    counted = await diskcount.count(str(tree), 30)
    assert counted.code == 0
    assert diskcount._helper is not helper
