"""hardened-service: its pure judges of kernel facts (its calibration is in its
calibration.toml, run by tests/challenges/calibration.py)."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path
from types import ModuleType

import pytest

from opsarena.challenges import builtin_challenge

SEED = b"hardened-calibration-seed"


def checks() -> ModuleType:
    return sys.modules[builtin_challenge("hardened-service").checks_module]


def test_the_socket_table_and_uid_map_are_read_as_the_kernel_writes_them() -> None:
    m = checks()
    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode\n"
        "   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999 "
        "0 4242 1 0000000000000000 100 0 0 10 0\n"
        "   1: 0100007F:1F90 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000   999 "
        "0 4343 1 0000000000000000 20 4 30 10 -1\n"
    )
    assert m.parse_tcp_table(table) == [(8080, 4242)]  # the established row is not a listener
    assert m.host_uid(100999, "         0     100000      65536\n") == 999
    assert m.host_uid(5, "         0     100000      65536\n") == -1
    assert m.host_uid(999, "         0          0 4294967295\n") == 999


STATUS = """Name:\tpython3
Umask:\t0022
State:\tS (sleeping)
Uid:\t{uids}
Gid:\t{gids}
Groups:\t{groups}
NoNewPrivs:\t{nnp}
CapInh:\t0000000000000000
CapPrm:\t{prm}
CapEff:\t{eff}
CapBnd:\t000001ffffffffff
CapAmb:\t{amb}
"""
UID_MAP = "         0     100000      65536\n"


def creds(
    uids: str = "999 999 999 999",
    gids: str = "999 999 999 999",
    *,
    groups: str = "",
    nnp: int = 1,
    prm: str = "0" * 16,
    eff: str = "0" * 16,
    amb: str = "0" * 16,
) -> object:
    """Credentials parsed from a status text written as the kernel writes it (ids as the
    host sees them; the machine's are 100000 higher)."""

    def machine(ids: str) -> str:
        return "\t".join(str(100000 + int(i)) for i in ids.split())

    status = STATUS.format(
        uids=machine(uids), gids=machine(gids), groups=machine(groups) if groups else "",
        nnp=nnp, prm=prm, eff=eff, amb=amb,
    )  # fmt: skip
    return checks().parse_credentials(status, UID_MAP, UID_MAP)


def test_credentials_are_read_as_the_kernel_writes_them() -> None:
    c = creds("999 998 0 997", "10 11 12 13", groups="20 21", prm="0000000000000080")
    assert (c.uids, c.gids, c.groups) == ((999, 998, 0, 997), (10, 11, 12, 13), (20, 21))
    assert c.uid == 998 and c.cap_prm == 1 << 7 and c.no_new_privs
    assert c.all_gids == frozenset({10, 11, 12, 13, 20, 21})
    assert checks().parse_credentials(
        STATUS.format(uids="5 5 5 5", gids="5 5 5 5", groups="", nnp=0, prm="0", eff="0", amb="0"),
        UID_MAP, UID_MAP,
    ).uids == (-1, -1, -1, -1)  # fmt: skip


def test_every_way_back_to_root_is_found() -> None:
    """Red team (service-user): a server that binds as root, then setresuid(999, 999, 0)
    has effective uid 999, and used to pass. Any id 0, a capability kept in the permitted
    or ambient set, and no_new_privs off (a set-user-ID-root program) each fail."""
    m = checks()
    assert m.root_ways(creds()) == []
    assert m.root_ways(creds(amb="0000000000000400", prm="0000000000000400")) == []  # bind <1024
    for kind, uids in [("real", "0 999 999 999"), ("saved", "999 999 0 999"),
                       ("filesystem", "999 999 999 0")]:  # fmt: skip
        assert m.root_ways(creds(uids)) == [f"{kind} uid 0"], kind
    assert m.root_ways(creds(gids="999 999 0 999")) == ["saved gid 0"]
    assert m.root_ways(creds(prm="0000000000000080")) == ["holds CAP_SETUID"]
    assert m.root_ways(creds(amb="0000000000200000")) == ["holds CAP_SYS_ADMIN"]
    assert "no_new_privs off" in m.root_ways(creds(nnp=0))[0]
    # The attack as the kernel shows it: effective ids dropped, saved ids and the
    # permitted set kept (the kernel clears only the effective set).
    dropped = creds("999 999 0 999", "999 999 0 999", prm="000001ffffffffff")
    ways = m.root_ways(dropped)
    assert ways == [
        "saved uid 0", "saved gid 0",
        "holds CAP_SETUID, CAP_SETGID, CAP_SYS_ADMIN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN "
        "and 34 more",
    ]  # fmt: skip


def test_a_directory_swapped_after_it_was_listed_is_not_entered(tmp_path: Path) -> None:
    """The write-sandbox walk opens each directory below its parent's descriptor and
    checks it is the one it listed: a symlink or another directory in its place (a host
    swapping them with renameat2) is refused, and something gone is only gone."""
    m = checks()
    root, machine = tmp_path / "host", tmp_path / "machine"
    (root / "d").mkdir(parents=True)
    machine.mkdir()
    parent = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        listed = os.stat("d", dir_fd=parent, follow_symlinks=False)
        (root / "d").rename(root / "elsewhere")
        (root / "d").symlink_to(machine)
        assert m._open_listed(parent, "d", listed) == m._SWAPPED
        (root / "d").unlink()
        (root / "d").mkdir()
        assert m._open_listed(parent, "d", listed) == m._SWAPPED
        (root / "d").rmdir()
        assert m._open_listed(parent, "d", listed) == m._GONE
        (root / "elsewhere").rename(root / "d")
        fd = m._open_listed(parent, "d", listed)
        assert fd >= 0
        os.close(fd)
    finally:
        os.close(parent)


def acl(*entries: tuple[int, int, int]) -> bytes:
    """A `system.posix_acl_access` value, as setfacl(1) stores it."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


ANY = 0xFFFFFFFF


def test_an_acl_decides_instead_of_the_mode_bits_as_the_kernel_does() -> None:
    m = checks()
    svc, other, staff = 999, 1000, 50
    # root:root 0755 by its mode; user 999 granted rwx by name, the mask allowing rw only.
    named = m.parse_acl(acl((1, 7, ANY), (2, 7, svc), (4, 5, ANY), (0x10, 6, ANY), (0x20, 5, ANY)))
    assert m.acl_permitted(named, 0, 0, svc, frozenset({svc}), 0o2)
    assert not m.acl_permitted(named, 0, 0, svc, frozenset({svc}), 0o1)  # masked out
    assert not m.acl_permitted(named, 0, 0, other, frozenset({other}), 0o2)
    # A named group: any matching group entry that grants it; the others' entry then never.
    grouped = m.parse_acl(
        acl((1, 7, ANY), (4, 5, ANY), (8, 7, staff), (0x10, 7, ANY), (0x20, 7, ANY))
    )
    assert m.acl_permitted(grouped, 0, 0, other, frozenset({staff}), 0o2)
    assert not m.acl_permitted(grouped, 0, 0, other, frozenset({0}), 0o2)  # group, not other
    assert m.acl_permitted(grouped, 0, 0, other, frozenset({other}), 0o2)  # others' rwx
    with pytest.raises(ValueError, match="version-2"):
        m.parse_acl(b"\x01\x00\x00\x00")


def test_the_walk_reads_acls_through_the_directory_it_opened(tmp_path: Path) -> None:
    """A directory 0755 root's with an ACL entry for the service's user is writable by it;
    without the entry it is not. Read the way the check reads a host (no path followed)."""
    m = checks()
    svc = 12345
    root = tmp_path / "host"
    (root / "usr/local/lib/app").mkdir(parents=True)
    (root / "var/lib/app").mkdir(parents=True)
    for d in (root, root / "usr", root / "usr/local", root / "usr/local/lib"):
        d.chmod(0o755)
    app = root / "usr/local/lib/app"
    app.chmod(0o755)

    def walk() -> list[str]:
        return m._walk_writable(
            str(root), frozenset(), frozenset(), "/var/lib/app", frozenset({svc}),
            frozenset({svc}), lambda uid, gid: (0 if uid == os.getuid() else uid,
                                                0 if gid == os.getgid() else gid),
        )  # fmt: skip

    assert walk() == []
    os.setxattr(app, m.ACL_XATTR, acl((1, 7, ANY), (2, 7, svc), (4, 5, ANY), (0x10, 7, ANY),
                                      (0x20, 5, ANY)))  # fmt: skip
    assert walk() == ["/usr/local/lib/app (drwxrwxr-x+ 0:0)"]
    # Hostile: a symlink in the host to a file of the machine's whose ACL grants the user.
    outside = tmp_path / "machine-file"
    outside.write_text("the arena's")
    os.setxattr(outside, m.ACL_XATTR, acl((1, 6, ANY), (2, 6, svc), (4, 4, ANY),
                                          (0x10, 6, ANY), (0x20, 4, ANY)))  # fmt: skip
    (root / "usr/local/lib/decoy").symlink_to(outside)
    parent = os.open(root / "usr/local/lib", os.O_RDONLY | os.O_DIRECTORY)
    try:  # the link's own ACL (none), never its target's
        assert m._access_acl(parent, "decoy", lambda uid, gid: (uid, gid)) is None
    finally:
        os.close(parent)
    assert walk() == ["/usr/local/lib/app (drwxrwxr-x+ 0:0)"]


def holder(pid: int, c: object, comm: str = "python3") -> object:
    return checks().Holder(pid, comm, c)


def test_the_judges() -> None:
    m = checks()
    assert m.judge_user((holder(10, creds()),), 8080) is None
    assert m.judge_user((holder(10, creds("0 0 0 0")),), 8080)[0] == "service_runs_as_root"
    attack = m.judge_user((holder(10, creds("999 999 0 999")),), 8080)
    assert attack[0] == "service_runs_as_root" and "saved uid 0" in attack[1]
    # Every holder counts, not only the first.
    two = (holder(10, creds()), holder(11, creds(prm="0000000000000080")))
    assert m.judge_user(two, 8080)[0] == "service_runs_as_root"
    assert "pid 11" in m.judge_user(two, 8080)[1]
    nobody = creds("65534 65534 65534 65534")
    assert m.judge_user((holder(10, nobody),), 8080)[0] == "service_user_not_dedicated"
    mixed = (holder(1, creds("998 998 998 998"), "a"), holder(2, creds(), "b"))
    assert m.judge_user(mixed, 8080)[0] == "service_user_not_dedicated"
    assert m.judge_user((holder(1, creds("999 998 999 999")),), 8080)[0] == (
        "service_user_not_dedicated"
    )
    assert m.judge_user((), 8080)[0] == "service_not_running"
    only = [m.Listener(8080, 1, (holder(10, creds()),))]
    assert m.judge_others(only, {8080}) is None
    planted = [*only, m.Listener(9123, 2, (holder(11, creds("0 0 0 0")),))]
    assert "port 9123 held by pid 11 python3 uid 0" in m.judge_others(planted, {8080})
    mountinfo = (
        "22 1 0:40 / / rw,relatime shared:1 - overlay overlay rw,lowerdir=/x\n"
        "23 22 0:41 / /proc rw,nosuid - proc proc rw\n"
        "24 22 0:42 / /tmp rw,nosuid - tmpfs tmpfs rw\n"
        "27 22 0:40 /etc/hosts /etc/hosts rw - ext4 /dev/sda rw\n"
    )
    assert m.memory_mounts(mountinfo) == ["/proc", "/tmp"]
    assert m.memory_mount_ids(mountinfo) == frozenset({23, 24})
    gids = frozenset({999})
    assert m.writable_by(0o755, 999, 999, 999, gids)  # its own
    assert not m.writable_by(0o555, 999, 0, 999, gids)  # its own, but read-only
    assert m.writable_by(0o1777, 0, 0, 999, gids)  # world-writable (/var/tmp)
    assert not m.writable_by(0o775, 0, 0, 999, gids)
    assert m.writable_by(0o775, 0, 999, 999, gids)  # its group's
    assert not m.writable_by(0o757, 0, 999, 999, gids)  # group class decides, not other
    assert not m.permitted(0o700, 0, 0, 999, gids, 1)  # a root-only directory: not reached
    assert m.permitted(0o755, 0, 0, 999, gids, 1)
    # Any of its uids counts: a saved uid it can switch back to owns the file.
    assert m.writable_by_any(0o644, 998, 0, frozenset({999, 998}), gids)
    assert not m.writable_by_any(0o644, 997, 0, frozenset({999, 998}), gids)
    assert not m.searchable_by_any(0o700, 0, 0, frozenset({999}), gids)
    assert m.write_capabilities("0000000000000000") == []
    assert m.write_capabilities("0000000000000002") == ["CAP_DAC_OVERRIDE"]
    assert "CAP_SYS_ADMIN" in m.write_capabilities("000001ffffffffff")
    assert 9000 <= m.planted_port(SEED) < 9900
