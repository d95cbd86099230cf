"""The pure parts of bounded disks and write caps (`hosts/disk.py`, the start hook's
cgroup lines); the kernel's side is tested on real hosts in tests/security/test_hosts_disk.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsarena.hosts.disk import WriteCaps, backing_mb, disk_for_quota
from opsarena.hosts.start_hook import cap_lines


def test_a_disk_made_for_a_quota_holds_a_sixteenth_more_and_at_least_a_little() -> None:
    assert disk_for_quota(64, 3000) == (72, 4000)
    assert disk_for_quota(2048, 100_000) == (2176, 106_250)
    # The file under it holds the data, its inode tables and the journal, and little more.
    assert 2176 + 16 + 25 < backing_mb(2176, 106_250) < 2176 * 1.05


def test_caps_are_written_as_each_cgroup_version_wants_them() -> None:
    assert cap_lines("blkio", "7:3", 4 << 20, 200) == {
        "blkio.throttle.write_bps_device": "7:3 4194304",
        "blkio.throttle.write_iops_device": "7:3 200",
    }
    assert cap_lines("blkio", "7:3", 0, 200) == {"blkio.throttle.write_iops_device": "7:3 200"}
    assert cap_lines("io", "7:3", 4 << 20, 0) == {"io.max": "7:3 wbps=4194304 wiops=max"}


def test_a_cap_is_refused_for_a_disk_path_podman_would_cut() -> None:
    caps = WriteCaps(1 << 20, 10)
    assert caps.annotation(Path("/var/lib/d/h/loop")) == "1048576 10 /var/lib/d/h/loop"
    with pytest.raises(ValueError, match="comma"):
        caps.annotation(Path("/var/lib/a,b/h/loop"))
    with pytest.raises(ValueError):
        WriteCaps(-1, 0)
    assert not WriteCaps(0, 0).any
