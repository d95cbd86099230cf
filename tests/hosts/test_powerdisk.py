"""The power-cut disk on its own (no container): what a cut keeps and what it loses.

Real FUSE server, real loop device, real ext4 and overlay; files written with plain
system calls from this process, read back after the power came back.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from opsarena.hosts import powerdisk

pytestmark = [
    pytest.mark.hosts,
    pytest.mark.skipif(
        os.geteuid() != 0 or not os.path.exists("/dev/fuse"), reason="needs root and /dev/fuse"
    ),
]


@pytest.fixture
async def disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[powerdisk.PowerDisk]:
    monkeypatch.setenv("OPSARENA_DISK_ROOT", str(tmp_path / "disks"))
    lower = tmp_path / "lower"
    lower.mkdir()
    (lower / "from-image").write_bytes(b"image layer\n")
    made = powerdisk.PowerDisk.of("unit")
    await powerdisk.create(made, size_mb=64, lowerdirs=[str(lower)])
    try:
        yield made
    finally:
        await powerdisk.destroy(made)
    assert not made.dir.exists()


def write(path: Path, data: bytes, *, fsync: bool) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def cut_and_restore(disk: powerdisk.PowerDisk) -> None:
    await powerdisk.control(disk, "cut")
    await powerdisk.power_cycle(disk)


async def test_durable_writes_survive_and_later_unsynced_ones_are_lost(
    disk: powerdisk.PowerDisk,
) -> None:
    root = disk.root
    write(root / "durable", b"synced\n", fsync=True)
    fsync_dir(root)
    write(root / "unsynced", b"never synced\n", fsync=False)
    (root / "dir").mkdir()
    write(root / "dir" / "nested", b"also never synced\n", fsync=False)

    await cut_and_restore(disk)

    assert (root / "durable").read_bytes() == b"synced\n"
    assert (root / "from-image").read_bytes() == b"image layer\n"
    assert not (root / "unsynced").exists()
    assert not (root / "dir").exists()


async def test_written_to_the_device_but_not_flushed_is_still_lost(
    disk: powerdisk.PowerDisk,
) -> None:
    """The write cache is the disk's, not only the kernel's: data the kernel has handed
    to the device (sync_file_range without a flush) is lost at the cut too. Written on
    the ext4 itself: overlayfs does not pass sync_file_range down."""
    root = disk.fs
    write(root / "base", b"x", fsync=True)
    fsync_dir(root)
    fd = os.open(root / "base", os.O_WRONLY)
    try:
        os.pwrite(fd, b"y" * 65536, 0)
        flags = 1 | 2 | 4  # SYNC_FILE_RANGE_WAIT_BEFORE | WRITE | WAIT_AFTER
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sync_file_range.argtypes = [
            ctypes.c_int,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_uint,
        ]
        assert libc.sync_file_range(fd, 0, 0, flags) == 0, os.strerror(ctypes.get_errno())
    finally:
        os.close(fd)
    stats = await powerdisk.control(disk, "stats")
    assert '"cached_blocks": 0' not in stats  # it reached the device's cache

    await cut_and_restore(disk)

    assert (root / "base").read_bytes() == b"x"


async def test_sync_makes_everything_durable_and_writes_after_the_cut_vanish(
    disk: powerdisk.PowerDisk,
) -> None:
    root = disk.root
    for index in range(20):
        write(root / f"r{index}", f"record {index}\n".encode(), fsync=False)
    os.sync()
    await powerdisk.control(disk, "cut")
    # Power is off: even an fsync is acknowledged and discarded, as by a dead disk.
    write(root / "after-cut", b"lost\n", fsync=True)
    fsync_dir(root)
    await powerdisk.power_cycle(disk)

    assert sorted(p.name for p in root.iterdir() if p.name.startswith("r")) == sorted(
        f"r{index}" for index in range(20)
    )
    assert (root / "r7").read_bytes() == b"record 7\n"
    assert not (root / "after-cut").exists()


async def test_rename_without_directory_fsync_may_be_lost_but_data_fsync_is_kept(
    disk: powerdisk.PowerDisk,
) -> None:
    """The fsync-no-dirsync pattern: the renamed file's data was synced, the rename was
    not. After the cut the data is somewhere (temp name or final name), never corrupt."""
    root = disk.root
    write(root / "tmp", b"payload\n", fsync=True)
    fsync_dir(root)  # the temp file's creation is durable
    os.rename(root / "tmp", root / "final")

    await cut_and_restore(disk)

    names = sorted(p.name for p in root.iterdir() if p.name in ("tmp", "final"))
    assert len(names) == 1
    assert (root / names[0]).read_bytes() == b"payload\n"


async def test_a_handle_opened_before_the_cut_never_writes_again(
    disk: powerdisk.PowerDisk,
) -> None:
    """A kernel may hold the old filesystem (and its loop device) for a while after the
    cut; whatever it writes through its old handle must never reach the disk, even
    after the power came back."""
    old = os.open(disk.served, os.O_RDWR)
    try:
        offset = os.fstat(old).st_size - 4096  # the last block: free on a fresh ext4
        before = os.pread(old, 4096, offset)
        await powerdisk.control(disk, "cut")
        await powerdisk.power_cycle(disk)
        os.pwrite(old, b"z" * 4096, offset)
        os.fsync(old)
        new = os.open(disk.served, os.O_RDONLY)
        try:
            assert os.pread(new, 4096, offset) == before
        finally:
            os.close(new)
    finally:
        os.close(old)
    assert (disk.root / "from-image").read_bytes() == b"image layer\n"
