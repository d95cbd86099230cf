"""What the controller's disk watch decides from each measurement (no hosts)."""

from __future__ import annotations

from opsarena.hosts import DiskUse
from opsarena.match.disks import DISK_BLIND_S, DISK_PARTIAL_LIMIT, DiskWatch


def watch() -> DiskWatch:
    return DiskWatch(byte_quota=1000, inode_quota=10)


def test_bytes_or_inodes_over_their_quota_freeze() -> None:
    w = watch()
    assert w.measured("a", DiskUse(1000, 10)) is None
    over = w.measured("a", DiskUse(1001, 3))
    assert over is not None and over.reason == "bytes" and over.used_bytes == 1001
    inodes = w.measured("b", DiskUse(20, 11))
    assert inodes is not None and inodes.reason == "inodes"
    assert (inodes.used_inodes, inodes.inode_quota) == (11, 10)
    assert "11 inodes used, over the quota of 10" in inodes.detail


def test_a_failed_count_freezes_at_once_with_the_last_figures() -> None:
    w = watch()
    w.measured("a", DiskUse(500, 5))
    frozen = w.unmeasured("a", "counting the disk of h (-B1) took over 30s")
    assert frozen.reason == "unmeasured" and frozen.used_bytes == 500
    assert frozen.detail == (
        "the disk cannot be measured: counting the disk of h (-B1) took over 30s"
    )


def test_a_host_the_driver_cannot_look_at_is_frozen_after_the_blind_limit() -> None:
    w = watch()
    assert w.blind("a", "rebooting", 100.0) is None
    assert w.blind("a", "rebooting", 100.0 + DISK_BLIND_S - 1) is None
    w.measured("a", DiskUse(1, 1))  # seen again: the clock restarts
    assert w.blind("a", "podman", 200.0) is None
    frozen = w.blind("a", "podman", 200.0 + DISK_BLIND_S)
    assert frozen is not None and frozen.reason == "unmeasured" and "podman" in frozen.detail


def test_counts_that_stay_partial_freeze() -> None:
    w = watch()
    for _ in range(DISK_PARTIAL_LIMIT - 1):
        assert w.measured("a", DiskUse(1, 1, partial=True)) is None
    assert w.measured("a", DiskUse(1, 1)) is None  # one whole count resets it
    for _ in range(DISK_PARTIAL_LIMIT - 1):
        assert w.measured("a", DiskUse(1, 1, partial=True)) is None
    frozen = w.measured("a", DiskUse(1, 1, partial=True))
    assert frozen is not None and frozen.reason == "unmeasured" and "partial" in frozen.detail
