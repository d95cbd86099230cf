"""Red team: a host's disk and its disk writes are bounded by the kernel, not by a watch.

A host's root used to lie in podman's storage on the machine's own filesystem, bounded
only by the controller's `du` every second: 90 000 empty files (under the inode quota)
made each count slow, and `dd` wrote 884 MiB into a host with a 64 MiB quota before the
freeze came. Every host now writes to an ext4 of its own of a fixed size
(`hosts/disk.py`), and its writes to it are capped in its cgroup, set from outside
before its init runs. Everything here is measured from the arena's side.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from opsarena.hosts import Host
from opsarena.hosts.disk import disk_for_quota, io_controller
from opsarena.hosts.podman import PodmanHost
from opsarena.hosts.powerdisk import PowerDisk
from opsarena.hosts.start_hook import cgroup_dir, device_number
from opsarena.match.controller import DEFAULT_INODE_QUOTA
from tests.conftest import HostFactory

pytestmark = pytest.mark.hosts

QUOTA_MB = 64
ATTACK = 884
"""MiB the attacker writes: what a host with a 64 MiB quota held before the fix."""
FS_SLACK_MB = 4
"""What the filesystem may hold beyond the data size it was made for (it rounds up)."""


def disk_of(host: Host) -> PowerDisk:
    assert isinstance(host, PodmanHost) and host.disk is not None, "every host has a disk"
    return host.disk


async def test_90000_files_then_884_mib_never_exceed_the_disk_made_for_the_quota(
    host_factory: HostFactory,
) -> None:
    disk_mb, inodes = disk_for_quota(QUOTA_MB, DEFAULT_INODE_QUOTA)
    host = await host_factory("filler", disk_mb=disk_mb, disk_inodes=inodes)
    made = await host.exec(
        "mkdir /var/lib/many && cd /var/lib/many && python3 -c "
        "'[open(str(i), \"x\").close() for i in range(90000)]' && ls -f | wc -l",
        timeout=300,
    )
    assert made.exit_code == 0 and int(made.stdout) == 90_002, made.stderr  # with . and ..
    filled = await host.exec(
        f"dd if=/dev/zero of=/var/lib/fill bs=1M count={ATTACK} status=none", timeout=300
    )
    assert filled.exit_code != 0 and b"No space left on device" in filled.stderr

    use = await host.disk_use()  # the arena's `du` of the host's writable layer
    disk = disk_of(host)
    fs = os.statvfs(disk.fs)  # and the kernel's own count of the host's filesystem
    fs_used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
    print(
        f"quota {QUOTA_MB} MiB, disk {disk_mb} MiB: du {use.bytes / 2**20:.1f} MiB and "
        f"{use.inodes} inodes; filesystem {fs_used / 2**20:.1f} MiB used of "
        f"{fs.f_blocks * fs.f_frsize / 2**20:.1f}"
    )
    assert use.inodes > 90_000
    assert use.bytes > QUOTA_MB * 2**20, "the quota watch still sees the host go over"
    assert use.bytes <= (disk_mb + FS_SLACK_MB) * 2**20 < ATTACK * 2**20 // 10
    assert os.stat(disk.backing).st_blocks * 512 <= os.stat(disk.backing).st_size
    # The disk is the host's alone: the machine's filesystem held none of it.
    assert fs.f_blocks * fs.f_frsize <= (disk_mb + FS_SLACK_MB) * 2**20 + (inodes * 256)


async def caps_in_cgroup(host: Host) -> tuple[str, dict[str, str]]:
    """(the host's disk device, the write caps its cgroup holds), read from outside."""
    disk = disk_of(host)
    device = device_number(disk.loop_file.read_text().strip())
    assert isinstance(host, PodmanHost)
    _controller, directory = cgroup_dir(await host._init_pid())
    found = {}
    for name in ("blkio.throttle.write_bps_device", "blkio.throttle.write_iops_device", "io.max"):
        path = Path(directory) / name
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith(f"{device} "):
                    found[name] = line
    return device, found


needs_io_controller = pytest.mark.skipif(
    io_controller() is None, reason="this machine's cgroups cannot cap disk writes"
)


@needs_io_controller
async def test_a_write_storm_is_capped_on_the_hosts_own_disk_and_the_host_cannot_lift_it(
    host_factory: HostFactory,
) -> None:
    host = await host_factory("storm", disk_write_mbps=4, disk_write_iops=200)
    device, caps = await caps_in_cgroup(host)
    if io_controller() == "blkio":
        assert caps == {
            "blkio.throttle.write_bps_device": f"{device} {4 * 2**20}",
            "blkio.throttle.write_iops_device": f"{device} 200",
        }
    else:
        assert f"wbps={4 * 2**20}" in caps["io.max"] and "wiops=200" in caps["io.max"]

    # The host's root cannot lift the cap (its cgroup files are the machine root's).
    lifted = await host.exec(
        "for f in /sys/fs/cgroup/blkio/blkio.throttle.write_bps_device /sys/fs/cgroup/io.max;"
        f" do [ -e $f ] && echo '{device} 0' > $f && echo LIFTED; done; true",
        timeout=30,
    )
    assert b"LIFTED" not in lifted.stdout
    assert (await caps_in_cgroup(host))[1] == caps

    # An O_DIRECT + fsync storm of 16 MiB at 4 MiB/s takes at least its share of seconds
    # (a lower bound: load only makes it slower).
    started = time.monotonic()
    storm = await host.exec(
        "dd if=/dev/zero of=/var/storm bs=1M count=16 oflag=direct conv=fsync status=none",
        timeout=120,
    )
    took = time.monotonic() - started
    print(f"16 MiB of O_DIRECT + fsync writes at a 4 MiB/s cap took {took:.1f}s")
    assert storm.exit_code == 0, storm.stderr
    assert took >= 3.0


@needs_io_controller
async def test_the_write_cap_follows_a_power_cut_disk_to_its_new_loop_device(
    host_factory: HostFactory,
) -> None:
    host = await host_factory("cut", power_cut=True, disk_write_mbps=8, disk_write_iops=0)
    before, caps = await caps_in_cgroup(host)
    assert list(caps.values()) in (
        [f"{before} {8 * 2**20}"],
        [f"{before} rbps=max wbps={8 * 2**20} riops=max wiops=max"],
    )
    await host.power_cut()
    after, caps = await caps_in_cgroup(host)
    print(f"loop device {before} before the cut, {after} after")
    assert len(caps) == 1 and str(8 * 2**20) in next(iter(caps.values()))
