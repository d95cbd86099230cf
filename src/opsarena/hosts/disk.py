"""Every host's disk bounded by construction, and its write rate capped.

Disk size. A host's root is an overlay whose writable layer lies on an ext4 of its
own, on a loop device over a sparse file of a fixed size (`hosts/powerdisk.py` makes
it; a power-cut host's goes through the disk server, an ordinary host's straight to the
file). The ext4 holds at most `disk_mb` MiB of data and `inodes` inodes whatever the
host does and however slow a count of its tree is: `ENOSPC` stops it, not a watch. The
machine's own filesystem has no project quotas here and podman's `--storage-opt size`
needs XFS, so a filesystem per host is the bound that works (docs/DESIGN.md).

The match's quota watch (`du` every second) stays as a second opinion: the disk is made
a little larger than the quota (`disk_for_quota`), so a host that writes past its quota
is still seen doing it and frozen, and no host can hold more than the quota and that
slack, measured or not.

Write rate. Each host's cgroup gets a write-bandwidth and a write-IOPS cap on its own
loop device (cgroup v1 `blkio.throttle.*`, or v2 `io.max`), set by the arena's start
hook before the host's init runs at every start (a power cut attaches a new loop
device, so the cap is set again each time). The machine's I/O scheduler has no weights
here (mq-deadline, no BFQ), and in cgroup v1 the loop device's own I/O to the machine's
disk is not charged to the host: a cap on the host's device is what holds. It throttles
what the host submits itself: direct I/O, and the data an fsync writes. What the
machine's flusher threads write back later is charged to no host (cgroup v1 writeback);
that is bounded by the host's memory limit (dirty pages are charged to it) and by its
disk size. The event log and every other writer of the arena keep the machine's disk
bandwidth the hosts' caps leave (docs/PERFORMANCE.md for this machine's figures).
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

IO_ANNOTATION = "opsarena.disk-io"
"""A host's write caps for the start hook: `WBPS WIOPS FILE`, bytes and requests a
second and the file naming the disk's current loop device (`<disk>/loop`). No comma:
podman splits an annotation's value there."""

INODE_BYTES = 256
"""ext4's inode size (`mkfs.ext4 -I`): room for nanosecond and post-2038 timestamps."""


def disk_for_quota(quota_mb: int, inode_quota: int) -> tuple[int, int]:
    """(disk size in MiB, inodes) for a host whose watch freezes it past `quota_mb` MiB
    or `inode_quota` inodes: each quota plus a sixteenth of it (at least 8 MiB and 1 000
    inodes), so the watch still sees a host go over before the disk is full."""
    return quota_mb + max(8, quota_mb // 16), inode_quota + max(1000, inode_quota // 16)


def journal_mb(disk_mb: int) -> int:
    """The ext4 journal of a disk of `disk_mb` MiB: 4 MiB (ext4's least) below 1 GiB,
    else 16 MiB. Small, so making the disk writes little."""
    return 4 if disk_mb < 1024 else 16


def default_inodes(disk_mb: int) -> int:
    """Inodes of a disk made without a count: one per 8 KiB (twice ext4's default, so
    the 1 GiB default disk takes the match's default inode quota, 100 000)."""
    return disk_mb * 128


def backing_mb(disk_mb: int, inodes: int) -> int:
    """Size of the file under a disk that holds `disk_mb` MiB of data and `inodes`
    inodes: the data, the journal, the inode tables, and the bitmaps and group
    descriptors (under 1 %)."""
    tables = math.ceil(inodes * INODE_BYTES / 2**20)
    return disk_mb + journal_mb(disk_mb) + tables + math.ceil(disk_mb / 100) + 2


def mkfs_argv(backing: Path, disk_mb: int, inodes: int | None) -> list[str]:
    """`mkfs.ext4` of a host's disk on a new sparse `backing` file. Nothing is zeroed
    (the file reads as zeros already, so an empty journal replays nothing; the disk is
    mounted `noinit_itable`): making it writes only the metadata, about 1 MiB."""
    argv = ["mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", "-I", str(INODE_BYTES),
            "-J", f"size={journal_mb(disk_mb)}", "-O", "^resize_inode",
            "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"]  # fmt: skip
    if inodes is not None:
        argv += ["-N", str(inodes)]
    return [*argv, str(backing)]


@dataclass(frozen=True)
class WriteCaps:
    """A host's write caps on its disk: bytes and requests per second (0: none)."""

    bytes_per_s: int
    iops: int

    def __post_init__(self) -> None:
        if self.bytes_per_s < 0 or self.iops < 0:
            raise ValueError(f"write caps must not be negative: {self}")

    @property
    def any(self) -> bool:
        return bool(self.bytes_per_s or self.iops)

    def annotation(self, loop_file: Path) -> str:
        """`IO_ANNOTATION`'s value for a disk whose loop device is named in `loop_file`.
        Raises ValueError for a path podman would cut (a comma in it)."""
        if "," in str(loop_file) or "\n" in str(loop_file):
            raise ValueError(f"the disk directory {loop_file.parent} has a comma in its path")
        return f"{self.bytes_per_s} {self.iops} {loop_file}"


CGROUP_ROOT = Path("/sys/fs/cgroup")


def io_controller(root: Path = CGROUP_ROOT) -> str | None:
    """Which cgroup controller can cap a host's writes on this machine: `blkio` (v1,
    also on a hybrid), `io` (v2), or None."""
    if (root / "blkio" / "blkio.throttle.write_bps_device").exists():
        return "blkio"
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "io" in controllers.read_text().split():
        return "io"
    return None


def own_disks_possible() -> bool:
    """Whether this machine can give hosts disks of their own: root (loop devices and
    mounts), `losetup`, `mkfs.ext4` and the loop control device. Without them an
    ordinary host's root stays in podman's storage, bounded by the quota watch only."""
    return (
        os.geteuid() == 0
        and os.path.exists("/dev/loop-control")
        and all(shutil.which(tool) for tool in ("losetup", "mkfs.ext4"))
    )
