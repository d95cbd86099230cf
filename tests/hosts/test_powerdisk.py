"""The power-cut disk on its own (no container): what a cut keeps and what it loses.

Real FUSE server, real loop device, real ext4 and overlay; files written with plain
system calls from this process, read back after the power came back.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from opsarena.errors import HostBootError
from opsarena.hosts import powerdisk
from opsarena.hosts.idmap import IdRange

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


async def test_a_shifted_disk_shows_the_image_as_the_hosts_and_keeps_the_machines_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a host's id range, the image's layers are seen through read-only idmapped
    clones (uid 0 shows as the range's first uid), the root the host sees belongs to the
    host's root, the clones survive a power cut, and destroying the disk leaves the image
    untouched. Directories on the machine are closed: 0700, the root's own 0711 above a
    0700 directory of the host's root (the runtime reaches it as that uid)."""
    ids = IdRange(uid=1_500_000_000, gid=1_500_100_000, size=65536)
    base = Path(tempfile.mkdtemp(prefix="opsarena-shifted-", dir="/tmp"))
    base.chmod(0o755)  # the host's root must be able to search down to its root
    monkeypatch.setenv("OPSARENA_DISK_ROOT", str(base / "disks"))
    lower = base / "layer"
    lower.mkdir()
    (lower / "from-image").write_bytes(b"image layer\n")
    (lower / "users").write_bytes(b"owned by 1000\n")
    os.chown(lower / "users", 1000, 1000)
    disk = powerdisk.PowerDisk.of("shifted")
    try:
        await powerdisk.create(disk, size_mb=64, lowerdirs=[str(lower)], ids=ids)
        seen = os.stat(disk.root / "from-image")
        assert (seen.st_uid, seen.st_gid) == (ids.uid, ids.gid)
        assert os.stat(disk.root / "users").st_uid == ids.uid + 1000
        top = os.stat(disk.root)
        assert (top.st_uid, top.st_gid) == (ids.uid, ids.gid)
        with pytest.raises(OSError, match="Read-only"):
            (disk.lower_dir / "0" / "planted").write_bytes(b"x")
        modes = {
            path: stat.S_IMODE(os.stat(path).st_mode)
            for path in (disk.dir.parent, disk.dir, disk.fs, disk.root_dir, disk.root_dir.parent)
        }
        assert modes == {
            disk.dir.parent: 0o700, disk.dir: 0o700, disk.fs: 0o700,
            disk.root_dir: 0o700, disk.root_dir.parent: 0o711,
        }  # fmt: skip
        assert os.stat(disk.root_dir).st_uid == ids.uid

        write(disk.root / "synced", b"kept\n", fsync=True)
        fsync_dir(disk.root)
        await cut_and_restore(disk)
        assert (disk.root / "synced").read_bytes() == b"kept\n"
        assert os.stat(disk.root / "from-image").st_uid == ids.uid
    finally:
        await powerdisk.destroy(disk)
        assert not disk.dir.exists() and not disk.root_dir.exists()
        assert (lower / "from-image").read_bytes() == b"image layer\n"
        assert os.stat(lower / "from-image").st_uid == 0
        shutil.rmtree(base)


async def test_a_shifted_disk_refuses_a_root_the_host_could_not_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest's temporary directories are 0700: a host's root below them would fail
    to start in the runtime with a bare "permission denied"; the disk says why first."""
    tmp_path.chmod(0o700)
    monkeypatch.setenv("OPSARENA_DISK_ROOT", str(tmp_path / "disks"))
    disk = powerdisk.PowerDisk.of("unreachable")
    ids = IdRange(uid=1_500_000_000, gid=1_500_000_000, size=65536)
    with pytest.raises(HostBootError, match="closed to other users"):
        await powerdisk.create(disk, size_mb=64, lowerdirs=[str(tmp_path)], ids=ids)
    assert not disk.dir.exists() and not disk.root_dir.exists()


async def test_a_fixed_disk_holds_its_size_and_inodes_and_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ordinary host's disk (issue 23): no server, the loop device on the file itself;
    it holds the data and inodes it was made for (the filesystem rounds up a little)
    and refuses more with ENOSPC."""
    monkeypatch.setenv("OPSARENA_DISK_ROOT", str(tmp_path / "disks"))
    lower = tmp_path / "lower"
    lower.mkdir()
    made = powerdisk.PowerDisk.of("fixed")
    try:
        await powerdisk.create(made, size_mb=64, lowerdirs=[str(lower)], power=False, inodes=5000)
        assert not made.power and not made.fuse_dir.exists()
        assert not (made.dir / "server.pid").exists()
        fs = os.statvfs(made.fs)
        free_mb = fs.f_bavail * fs.f_frsize / 2**20
        assert 64 <= free_mb <= 64 + 4, free_mb
        assert 5000 <= fs.f_files <= 5000 + 512
        written = 0
        with pytest.raises(OSError) as full, open(made.root / "big", "wb", buffering=0) as big:
            while written < 80 * 2**20:
                written += big.write(b"x" * 2**20)
            os.fsync(big.fileno())
        assert full.value.errno == errno.ENOSPC and 64 * 2**20 <= written <= 68 * 2**20
        (made.root / "big").unlink()
        names = iter(range(10_000))
        with pytest.raises(OSError) as no_inodes:
            for name in names:
                (made.root / str(name)).touch()
        assert no_inodes.value.errno == errno.ENOSPC
        assert 5000 - 16 <= next(names) <= 5000 + 512
    finally:
        await powerdisk.destroy(made)
    assert not made.dir.exists() and not made.root_dir.exists()
