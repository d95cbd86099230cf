"""Red team, power-cut hosts: a host made with `HostSpec(power_cut=True)` (its root is
the arena's own FUSE → loop → ext4 → overlay stack, run with `podman run --rootfs`)
is as confined as any other host. Before, podman could not map such a root and the
host ran as the machine's uid 0: it moved processes into a neighbour's cgroup and
renamed the machine's cgroup directories in the `name=systemd` hierarchy podman mounts
read-write, spent the machine root's inotify budget, and left setuid-root files on the
machine's disk. Each attack is planted through `Host.exec`, as a competitor would.

- its root is not the machine's root: a uid/gid range of its own, distinct from every
  other host's, kept across a power cut; what it writes is owned by that range on the
  machine's disk, and no other local user can reach the disk at all;
- it cannot write outside its own cgroup subtree (the machine's cgroups, a neighbour's);
- its inotify instances are capped in its own user namespace, before and after a cut.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import os
import secrets
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsarena.hosts import Host, kernel, powerdisk
from opsarena.hosts.podman import PodmanHost
from tests.conftest import HostFactory
from tests.security.red_team import INOTIFY_HOG, sh

pytestmark = pytest.mark.hosts

HIERARCHY = Path("/sys/fs/cgroup/systemd")
HOST_CAP = 64
"""`start_hook.LIMITS`: the inotify instances a host's user namespace may hold."""
NOBODY = 65534


def id_map(pid: int, name: str) -> list[tuple[int, int, int]]:
    with open(f"/proc/{pid}/{name}") as mapping:
        return [(int(a), int(b), int(c)) for a, b, c in (line.split() for line in mapping)]


def init_pid(host: Host) -> int:
    init = host.init_process
    assert init is not None
    return init.pid


def disk_of(host: Host) -> powerdisk.PowerDisk:
    assert isinstance(host, PodmanHost) and host.disk is not None
    return host.disk


async def test_a_power_cut_hosts_root_is_not_the_machines_root(host_factory: HostFactory) -> None:
    cut, other_cut, plain = await asyncio.gather(
        host_factory("pc-a", power_cut=True, disk_mb=128),
        host_factory("pc-b", power_cut=True, disk_mb=128),
        host_factory("plain"),
    )
    ranges = {}
    for host in (cut, other_cut, plain):
        pid = init_pid(host)
        for name in ("uid_map", "gid_map"):
            ((inside, outside, size),) = id_map(pid, name)
            assert (inside, size) == (0, 65536) and outside != 0, (host.name, name)
        ranges[host.name] = id_map(pid, "uid_map")[0][1]
        # The arena's view: the host's init runs as that uid on the machine, not as 0.
        status = Path(f"/proc/{pid}/status").read_text()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1:] == [str(ranges[host.name])] * 4, uid_line
    # Three hosts, three disjoint ranges (podman's allocator, the power-cut ones reserved).
    starts = sorted(ranges.values())
    assert all(b - a >= 65536 for a, b in itertools.pairwise(starts)), ranges
    inside = (await sh(cut, "cat /proc/self/uid_map")).split()
    assert inside == ["0", str(ranges[cut.name]), "65536"], inside
    refused = await cut.exec("unshare -Ur true", timeout=10)
    assert refused.exit_code != 0 and b"Operation not permitted" in refused.stderr

    # A setuid-root program written in the host is the host's root's on the machine.
    await sh(cut, "cp /usr/bin/id /opt/suid-id && chmod 4755 /opt/suid-id && sync")
    as_nobody = await sh(
        cut, f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups /opt/suid-id"
    )
    assert "euid=0(root)" in as_nobody, as_nobody  # setuid works in the host, as it should
    disk = disk_of(cut)
    planted = disk.upper / "opt" / "suid-id"
    seen = os.lstat(planted)
    assert seen.st_mode & stat.S_ISUID
    assert (seen.st_uid, seen.st_gid) == (ranges[cut.name], id_map(init_pid(cut), "gid_map")[0][1])
    # ... and no other local user reaches the disk, nor the root it is mounted at.
    assert stat.S_IMODE(os.stat(disk.dir.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(disk.dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(disk.root_dir).st_mode) == 0o700
    assert os.stat(disk.root_dir).st_uid == ranges[cut.name]
    for path in (planted, disk.root / "opt" / "suid-id"):
        with pytest.raises(PermissionError):
            subprocess.run([str(path)], user=NOBODY, group=NOBODY, extra_groups=[], check=False)
    listing = subprocess.run(
        ["ls", str(disk.dir.parent), str(disk.root_dir)],
        user=NOBODY, group=NOBODY, extra_groups=[], check=False, capture_output=True,
    )  # fmt: skip
    assert listing.returncode != 0 and b"Permission denied" in listing.stderr

    # The range is the host's for good: a power cut boots it in the same one.
    before = ranges[cut.name]
    await cut.power_cut()
    assert id_map(init_pid(cut), "uid_map")[0][1] == before
    assert (await sh(cut, "stat -c %u /opt/suid-id")).strip() == "0"


@pytest.fixture
def machine_cgroup() -> Iterator[Path]:
    """A cgroup of the machine's (owned by its root) that no host may touch."""
    if not (HIERARCHY / "cgroup.procs").exists():
        pytest.skip("no named systemd hierarchy (cgroup v2: hosts have their own cgroupns)")
    made = HIERARCHY / f"opsarena-redteam-{secrets.token_hex(4)}"
    made.mkdir()
    try:
        yield made
    finally:
        for leftover in sorted(HIERARCHY.glob(f"{made.name}*"), reverse=True):
            for child in leftover.iterdir():
                if child.is_dir():
                    child.rmdir()
            leftover.rmdir()


async def test_a_power_cut_host_cannot_write_outside_its_own_cgroup_subtree(
    host_factory: HostFactory, machine_cgroup: Path
) -> None:
    cut, neighbour = await asyncio.gather(
        host_factory("cg-cut", power_cut=True, disk_mb=128), host_factory("cg-plain")
    )
    own = kernel.container_cgroup(init_pid(cut))
    theirs = kernel.container_cgroup(init_pid(neighbour))
    decoy = f"/sys/fs/cgroup/systemd/{machine_cgroup.name}"
    attacks = {
        "the hierarchy's root": "echo $$ > /sys/fs/cgroup/systemd/cgroup.procs",
        "its init into the neighbour": f"echo 1 > /sys/fs/cgroup/systemd{theirs}/cgroup.procs",
        "a shell into the neighbour": f"echo $$ > /sys/fs/cgroup/systemd{theirs}/cgroup.procs",
        "a cgroup in the neighbour": f"mkdir /sys/fs/cgroup/systemd{theirs}/intruder",
        "the neighbour renamed": f"mv /sys/fs/cgroup/systemd{theirs} "
        f"/sys/fs/cgroup/systemd{theirs}-moved",
        "a machine cgroup renamed": f"mv {decoy} {decoy}-moved",
        "a shell into a machine cgroup": f"echo $$ > {decoy}/cgroup.procs",
        "a cgroup in a machine cgroup": f"mkdir {decoy}/intruder",
        "its own cgroup renamed": f"mv /sys/fs/cgroup/systemd{own} /sys/fs/cgroup/systemd{own}-x",
    }
    succeeded = []
    for what, script in attacks.items():
        tried = await cut.exec(script, timeout=10)
        if tried.exit_code == 0:
            succeeded.append(what)
    assert succeeded == [], succeeded
    assert machine_cgroup.is_dir() and list(machine_cgroup.glob("intruder")) == []
    assert not list(machine_cgroup.parent.glob(f"{machine_cgroup.name}-moved"))
    assert Path(f"/sys/fs/cgroup/systemd{theirs}").is_dir()
    assert kernel.cgroup_members(theirs, init_pid(neighbour))  # the neighbour's own only
    assert kernel.container_cgroup(init_pid(cut)) == own
    # Its own subtree is its systemd's to manage (so the attacks above could succeed).
    await sh(
        cut,
        f"mkdir /sys/fs/cgroup/systemd{own}/probe && "
        f"echo $$ > /sys/fs/cgroup/systemd{own}/probe/cgroup.procs",
    )


async def test_a_power_cut_hosts_inotify_is_capped_like_any_hosts(
    host_factory: HostFactory,
) -> None:
    cut = await host_factory("hog-cut", power_cut=True, disk_mb=128)
    await cut.write_file("/opt/hog.py", INOTIFY_HOG.encode())
    await sh(cut, "sync")
    libc = ctypes.CDLL(None, use_errno=True)
    for boot in ("first boot", "after a power cut"):
        assert int(await sh(cut, "cat /proc/sys/user/max_inotify_instances")) == HOST_CAP, boot
        await sh(
            cut,
            "rm -f /run/hog; systemd-run --unit hog python3 /opt/hog.py; "
            "for i in $(seq 200); do [ -s /run/hog ] && exit 0; sleep 0.05; done; exit 1",
        )
        held = int(await sh(cut, "cat /run/hog"))
        assert 0 < held <= HOST_CAP, (boot, held)
        exhausted = await sh(
            cut,
            "python3 -c 'import ctypes, os; l = ctypes.CDLL(None, use_errno=True); "
            "print(l.inotify_init1(0), os.strerror(ctypes.get_errno()))'",
        )
        assert "Too many open files" in exhausted, (boot, exhausted)
        fd = libc.inotify_init1(0)
        assert fd >= 0, os.strerror(ctypes.get_errno())
        os.close(fd)
        if boot == "first boot":
            await cut.power_cut()
    neighbour = await host_factory("after-hog")
    assert await neighbour.wait_ready(30) == "running"
