"""hardened-service's checks and setup: who listens, as whom, and what it may write,
all read from the kernel on the arena side.

The setup plants a listener before the agents start: `legacy-admin.service`, enabled,
a small program listening on a port derived from the seed. The checks read kernel facts
of the host from outside it, never a program's output: the host's TCP socket table
(`/proc/<init>/net/tcp{,6}` of the host's init, i.e. its network namespace), which of
the host's processes hold each listening socket (their fds), their credentials
(`/proc/<pid>/status`: real, effective, saved and filesystem uids and gids, translated
through the host's id maps, the permitted and ambient capabilities, no_new_privs), and
which files of the host's disk their ids could write (a walk of `/proc/<init>/root` by
directory file descriptors, each opened `O_NOFOLLOW|O_DIRECTORY` below its parent and
checked to be what was listed: nothing followed, no file opened or read, memory
filesystems skipped by mount id, capabilities that pass permissions counted as writing
anything).
systemd's ProtectSystem= cannot work on these hosts (no mount namespaces to give),
so the sandbox is judged by permissions, as the kernel would enforce them. The host's
init pid comes from the host-trust interface (`Host.init_process`, refreshed by
`Host.port_owners`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

import opsarena.workloads.records.checks  # noqa: F401  (registers the records checks used below)
from opsarena.errors import HostError, HostFactsTooLargeError
from opsarena.hosts import Host
from opsarena.hosts.kernel import SCAN_LIMIT
from opsarena.referee.contract import (
    CheckContext,
    Setup,
    Verdict,
    get_check,
    register_check,
    register_setup,
)
from opsarena.referee.failures import Observation
from opsarena.text import host_name, host_text

PLANTED_UNIT = "legacy-admin.service"
DATA_DIR = "/var/lib/builder-app"
NOBODY = 65534
LISTEN = "0A"
API_FILESYSTEMS = frozenset(
    {"proc", "sysfs", "devtmpfs", "devpts", "mqueue", "cgroup", "cgroup2", "tmpfs",
     "hugetlbfs", "bpf", "tracefs", "debugfs", "securityfs", "pstore", "binfmt_misc",
     "fusectl", "configfs", "ramfs", "nsfs"}
)  # fmt: skip
"""Memory or kernel-API filesystems: writable ones are not the disk."""


def planted_port(seed: bytes) -> int:
    digest = hmac.new(seed, b"opsarena-hardened:planted-port", hashlib.sha256).digest()
    return 9000 + int.from_bytes(digest[:2], "big") % 900


PLANTED_PROGRAM = b"""import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", int(sys.argv[1])))
s.listen(8)
while True:
    c, _ = s.accept()
    c.sendall(b"legacy admin console\\n")
    c.close()
"""


def planted_unit(port: int) -> bytes:
    return (
        "[Unit]\nDescription=legacy admin console (left by a previous admin)\n\n"
        "[Service]\nExecStart=/usr/bin/python3 /usr/local/lib/legacy-admin/console.py "
        f"{port}\nRestart=always\n\n[Install]\nWantedBy=multi-user.target\n"
    ).encode()


def variables(seed: bytes) -> dict[str, str]:
    return {"data_dir": DATA_DIR}


async def place(host: Host, seed: bytes) -> None:
    """Plant the listener (before the agents start, inside the host's confinement)."""
    await host.write_file("/usr/local/lib/legacy-admin/console.py", PLANTED_PROGRAM)
    await host.write_file(f"/etc/systemd/system/{PLANTED_UNIT}", planted_unit(planted_port(seed)))
    result = await host.exec(f"systemctl enable --now {PLANTED_UNIT}", timeout=30.0)
    if not result.ok:
        raise HostError(f"planting {PLANTED_UNIT} failed: {result.stderr.decode()[-200:]}")


register_setup("hardened-service", Setup(variables=variables, place=place))


def parse_tcp_table(text: str) -> list[tuple[int, int]]:
    """(port, inode) of every LISTEN row of a /proc/net/tcp{,6} table. Pure."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        found.append((int(fields[1].rsplit(":", 1)[1], 16), int(fields[9])))
    return found


def host_uid(uid: int, uid_map: str) -> int:
    """`uid` (as this machine sees it) as the host sees it, through its uid_map. Pure."""
    for line in uid_map.splitlines():
        parts = line.split()
        if len(parts) == 3:
            inside, outside, count = (int(p) for p in parts)
            if outside <= uid < outside + count:
                return inside + uid - outside
    return -1


CAPABILITY_NAMES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
    "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
)  # fmt: skip
"""Capability names by bit (linux/capability.h)."""

WRITE_CAPABILITIES = {
    0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 3: "CAP_FOWNER", 6: "CAP_SETGID", 7: "CAP_SETUID",
    21: "CAP_SYS_ADMIN",
}  # fmt: skip
"""Capabilities that let a process write past file permissions (SETUID and SETGID: by
becoming root, or any group, first)."""

ROOT_FIRST = (
    "CAP_SETUID", "CAP_SETGID", "CAP_SYS_ADMIN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_CHOWN"
)  # fmt: skip
"""The capabilities a failure detail names first."""

HARMLESS_CAPABILITIES = frozenset({10})
"""CAP_NET_BIND_SERVICE: the one capability a dedicated service may keep (a port below
1024); any other in its permitted or ambient set lets it act as root in some way."""


def memory_mounts(mountinfo: str) -> list[str]:
    """Mount points of memory or kernel-API filesystems (not the disk). Pure."""
    return [point for _id, point in _memory_mount_rows(mountinfo)]


def memory_mount_ids(mountinfo: str) -> frozenset[int]:
    """Mount ids (mountinfo's first field, the same in every namespace's view) of memory
    or kernel-API filesystems. Pure."""
    return frozenset(mount_id for mount_id, _point in _memory_mount_rows(mountinfo))


def _memory_mount_rows(mountinfo: str) -> list[tuple[int, str]]:
    rows = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and tail and tail[0] in API_FILESYSTEMS:
            rows.append((int(fields[0]), fields[4].replace("\\040", " ")))
    return rows


def permitted(
    mode: int, owner: int, group: int, uid: int, gids: frozenset[int], bit: int = 0o2
) -> bool:
    """Whether permission bits `mode` of a file owned by `owner`:`group` give `uid` (with
    groups `gids`) the permission `bit` (0o2 write, 0o1 search) (POSIX: the first
    matching class decides). Pure."""
    if owner == uid:
        return bool(mode & (bit << 6))
    if group in gids:
        return bool(mode & (bit << 3))
    return bool(mode & bit)


def writable_by(mode: int, owner: int, group: int, uid: int, gids: frozenset[int]) -> bool:
    """Whether `uid` may write a file of these permissions. Pure."""
    return permitted(mode, owner, group, uid, gids, 0o2)


def write_capabilities(cap_hex: str) -> list[str]:
    """The capabilities of `WRITE_CAPABILITIES` set in a capability mask (hex, as
    /proc/PID/status shows CapPrm). Pure."""
    mask = int(cap_hex, 16)
    return [name for bit, name in WRITE_CAPABILITIES.items() if mask >> bit & 1]


def capability_names(mask: int) -> list[str]:
    """The names of the capabilities set in `mask`. Pure."""
    return [
        CAPABILITY_NAMES[bit] if bit < len(CAPABILITY_NAMES) else f"capability {bit}"
        for bit in range(mask.bit_length())
        if mask >> bit & 1
    ]


def writable_by_any(
    mode: int, owner: int, group: int, uids: frozenset[int], gids: frozenset[int]
) -> bool:
    """Whether a process that may act as any of `uids` (its real, effective, saved and
    filesystem uids: setresuid(2) moves between them) with groups `gids` may write a file
    of these permissions. Pure."""
    return any(writable_by(mode, owner, group, uid, gids) for uid in uids)


def searchable_by_any(
    mode: int, owner: int, group: int, uids: frozenset[int], gids: frozenset[int]
) -> bool:
    """As `writable_by_any`, for search permission on a directory. Pure."""
    return any(permitted(mode, owner, group, uid, gids, 0o1) for uid in uids)


ACL_XATTR = "system.posix_acl_access"
ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER = (
    0x01, 0x02, 0x04, 0x08, 0x10, 0x20
)  # fmt: skip


@dataclass(frozen=True)
class AclEntry:
    tag: int
    perm: int
    """rwx as three bits (4 read, 2 write, 1 search)."""
    id: int
    """The user or group of an `ACL_USER` / `ACL_GROUP` entry (as the reader's namespace
    sees it); meaningless for the others."""


def parse_acl(value: bytes) -> list[AclEntry]:
    """A `system.posix_acl_access` value (struct posix_acl_xattr_header, version 2, then
    8-byte entries). `ValueError` for anything else. Pure."""
    if len(value) < 4 or (len(value) - 4) % 8 or int.from_bytes(value[:4], "little") != 2:
        raise ValueError(f"not a version-2 POSIX ACL ({len(value)} bytes)")
    entries = []
    for at in range(4, len(value), 8):
        tag = int.from_bytes(value[at : at + 2], "little")
        perm = int.from_bytes(value[at + 2 : at + 4], "little")
        entries.append(AclEntry(tag, perm & 7, int.from_bytes(value[at + 4 : at + 8], "little")))
    return entries


def acl_permitted(
    entries: list[AclEntry], owner: int, group: int, uid: int, gids: frozenset[int], bit: int
) -> bool:
    """Whether an access ACL gives `uid` (groups `gids`) permission `bit` (2 write, 1
    search), as the kernel decides (posix_acl_permission): the owner's entry; else a
    named user's, within the mask; else, when any group entry matches, whether one of
    them grants it, within the mask; else the others'. Entry ids already in the same
    namespace as `uid` and `gids`. Pure."""
    mask = next((e.perm for e in entries if e.tag == ACL_MASK), 7)
    if owner == uid:
        return any(e.tag == ACL_USER_OBJ and e.perm & bit for e in entries)
    for e in entries:
        if e.tag == ACL_USER and e.id == uid:
            return bool(e.perm & mask & bit)
    groups = [
        e for e in entries
        if (e.tag == ACL_GROUP_OBJ and group in gids) or (e.tag == ACL_GROUP and e.id in gids)
    ]  # fmt: skip
    if groups:
        return any(e.perm & mask & bit for e in groups)
    return any(e.tag == ACL_OTHER and e.perm & bit for e in entries)


def _access_acl(
    parent: int, name: str, to_host: Callable[[int, int], tuple[int, int]]
) -> list[AclEntry] | None:
    """Blocking: the access ACL of entry `name` of the open directory `parent` (looked up
    through that very descriptor, never a path of the host, and never following a
    symlink), its ids turned into the host's; None when it has none (or it is gone)."""
    try:
        value = os.getxattr(f"/proc/self/fd/{parent}/{name}", ACL_XATTR, follow_symlinks=False)
    except OSError:  # ENODATA: none; ENOENT: gone; EOPNOTSUPP: no ACLs on this filesystem
        return None
    named = []
    for e in parse_acl(value):
        if e.tag == ACL_USER:
            e = AclEntry(e.tag, e.perm, to_host(e.id, 0)[0])
        elif e.tag == ACL_GROUP:
            e = AclEntry(e.tag, e.perm, to_host(0, e.id)[1])
        named.append(e)
    return named


@dataclass(frozen=True)
class Credentials:
    """A process's credentials as the kernel keeps them (/proc/PID/status), ids as the
    host sees them (through its uid and gid maps; -1 for an id it does not map)."""

    uids: tuple[int, int, int, int]
    """Real, effective, saved set-user-ID, filesystem."""
    gids: tuple[int, int, int, int]
    groups: tuple[int, ...]
    """Supplementary groups."""
    cap_prm: int
    cap_eff: int
    cap_amb: int
    cap_bnd: int
    no_new_privs: bool

    @property
    def uid(self) -> int:
        """The effective uid."""
        return self.uids[1]

    @property
    def all_gids(self) -> frozenset[int]:
        return frozenset((*self.gids, *self.groups))

    def describe(self) -> str:
        return f"uids {'/'.join(map(str, self.uids))} gids {'/'.join(map(str, self.gids))}"


ID_KINDS = ("real", "effective", "saved", "filesystem")


def parse_credentials(status: str, uid_map: str, gid_map: str) -> Credentials:
    """The credentials in a /proc/PID/status text, ids translated into the host's view
    through its `uid_map` and `gid_map`. Raises `ValueError` for a status without them.
    Pure."""
    field = {
        key: value.split()
        for key, _, value in (line.partition(":") for line in status.splitlines())
    }

    def ids(name: str, id_map: str) -> tuple[int, int, int, int]:
        values = [host_uid(int(v), id_map) for v in field[name]]
        if len(values) != 4:
            raise ValueError(f"{name}: {field[name]!r} is not four ids")
        return values[0], values[1], values[2], values[3]

    def mask(name: str) -> int:
        return int(field.get(name, ["0"])[0], 16)

    try:
        return Credentials(
            uids=ids("Uid", uid_map),
            gids=ids("Gid", gid_map),
            groups=tuple(host_uid(int(g), gid_map) for g in field.get("Groups", [])),
            cap_prm=mask("CapPrm"),
            cap_eff=mask("CapEff"),
            cap_amb=mask("CapAmb"),
            cap_bnd=mask("CapBnd"),
            no_new_privs=field.get("NoNewPrivs", ["0"])[0] == "1",
        )
    except KeyError as exc:
        raise ValueError(f"no {exc} line in the process's status") from None


def root_ways(creds: Credentials) -> list[str]:
    """How a process with `creds` is root, or can make itself root again; empty when it
    cannot. Pure.

    Any of its real, effective, saved or filesystem uids or gids 0 (setresuid(2) and
    setresgid(2) move back to any of them; the filesystem ids are what file access
    checks); a capability other than CAP_NET_BIND_SERVICE in its permitted or ambient
    set (the effective set is raised from the permitted one at will; CAP_SETUID alone is
    root); no_new_privs off (a set-user-ID-root or file-capability program then makes
    it root again, whatever the bounding set says: the bounding set limits the
    capabilities such a program gives, not the uid 0 it gives)."""
    ways = [
        f"{kind} {what} 0"
        for what, values in (("uid", creds.uids), ("gid", creds.gids))
        for kind, value in zip(ID_KINDS, values, strict=True)
        if value == 0
    ]
    held = (creds.cap_prm | creds.cap_eff | creds.cap_amb) & ~sum(
        1 << bit for bit in HARMLESS_CAPABILITIES
    )
    if held:
        names = capability_names(held)
        names.sort(key=lambda n: ROOT_FIRST.index(n) if n in ROOT_FIRST else len(ROOT_FIRST))
        more = f" and {len(names) - 6} more" if len(names) > 6 else ""
        ways.append(f"holds {', '.join(names[:6])}{more}")
    if not creds.no_new_privs:
        ways.append(
            "no_new_privs off (a set-user-ID-root program makes it root again: NoNewPrivileges=yes)"
        )
    return ways


@dataclass(frozen=True)
class Holder:
    """A process of the host holding a listening socket."""

    pid: int
    """As this machine numbers it."""
    comm: str
    creds: Credentials

    @property
    def uid(self) -> int:
        return self.creds.uid

    def describe(self) -> str:
        return f"pid {self.pid} {self.comm} uid {self.uid}"


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket of the host and the host's processes holding it."""

    port: int
    inode: int
    owners: tuple[Holder, ...]


MAX_DEPTH = 200
"""Directories deeper than this are not examined; each is reported instead (an honest
host has none, and the walk holds one descriptor per level)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""How the walk opens a directory below its parent's descriptor: a symlink (ELOOP) or
anything but a directory (ENOTDIR, before any open of a device or FIFO) is refused."""


@dataclass
class _Dir:
    fd: int
    path: str
    dev: int
    names: list[str]


def _on_mount(parent: int, name: str, listed: os.stat_result, mounts: frozenset[int]) -> bool:
    """Whether `name` below `parent`, still the object `listed`, lies on one of `mounts`
    (opened `O_PATH|O_NOFOLLOW`: nothing is opened for reading, nothing followed)."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return False
    try:
        return os.path.samestat(os.fstat(fd), listed) and _mount_id(fd) in mounts
    finally:
        os.close(fd)


def _mount_id(fd: int) -> int | None:
    """The id of the mount `fd` (a descriptor of this process) lies on."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
            for line in info:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _walk_writable(
    root: str,
    skip: frozenset[int],
    skip_paths: frozenset[str],
    data_dir: str,
    uids: frozenset[int],
    gids: frozenset[int],
    to_host: Callable[[int, int], tuple[int, int]] = lambda uid, gid: (uid, gid),
    limit: int = 20,
) -> list[str]:
    """Blocking: paths of the host's tree under `root` (its init's /proc/PID/root) on
    disk, outside `data_dir`, that a process acting as any of `uids` with groups `gids`
    may reach (search permission on every directory above) and write. `to_host` turns a
    file's owner and group (as this machine sees them) into the ids `uids` and `gids`
    are in. Mounts whose id is in `skip` (memory filesystems) are neither reported nor
    entered: checked by mount id where the device changes or the path is one of
    `skip_paths` (their mount points as the host's mountinfo names them, for files bound
    from a memory filesystem), never skipped on the path alone.

    The walk never resolves a path: each directory is opened below its parent's
    descriptor with `O_NOFOLLOW|O_DIRECTORY` and must be the very directory that was
    listed (same device and inode), so a host that swaps a directory for a symlink
    (renameat2 RENAME_EXCHANGE) never leads it out of the host's tree; such a swap is
    reported ("changed while the referee read it"), as is a directory too deep to walk.
    Entries are only lstat'ed, relative to their directory, and their POSIX access ACL
    read through the directory's descriptor (an ACL decides instead of the mode bits, as
    in the kernel): no file is opened or read."""
    found: list[str] = []
    data = data_dir.rstrip("/")
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the host's root
    stack: list[_Dir] = []
    try:
        stack.append(_Dir(top, "", os.fstat(top).st_dev, []))
        try:
            stack[0].names = os.listdir(top)
        except OSError:
            return found
        while stack and len(found) < limit:
            here = stack[-1]
            if not here.names:
                os.close(stack.pop().fd)
                continue
            name = here.names.pop()
            path = f"{here.path}/{name}"
            if path == data or path.startswith(data + "/"):
                continue
            try:
                st = os.stat(name, dir_fd=here.fd, follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            kind = stat.S_IFMT(st.st_mode)
            if kind == stat.S_IFLNK:
                continue
            crossing = kind == stat.S_IFDIR and st.st_dev != here.dev
            if (crossing or path in skip_paths) and _on_mount(here.fd, name, st, skip):
                continue  # a memory filesystem (or a file bound from one): not the disk
            owner, group = to_host(st.st_uid, st.st_gid)
            try:
                acl = _access_acl(here.fd, name, to_host)
            except ValueError as exc:  # an ACL the kernel would not have stored
                found.append(f"{host_name(path)} (its ACL cannot be read: {exc})")
                continue
            if acl is None:
                writable = writable_by_any(st.st_mode, owner, group, uids, gids)
                searchable = searchable_by_any(st.st_mode, owner, group, uids, gids)
            else:
                writable = any(acl_permitted(acl, owner, group, u, gids, 0o2) for u in uids)
                searchable = any(acl_permitted(acl, owner, group, u, gids, 0o1) for u in uids)
            if writable:
                shown = "+" if acl is not None else ""  # as ls -l marks an ACL
                found.append(
                    f"{host_name(path)} ({stat.filemode(st.st_mode)}{shown} {owner}:{group})"
                )
            if kind != stat.S_IFDIR or not searchable:
                continue
            if len(stack) > MAX_DEPTH:
                found.append(
                    f"{host_name(path)} (deeper than {MAX_DEPTH} directories: not examined)"
                )
                continue
            child = _open_listed(here.fd, name, st)
            if child == _GONE:
                continue
            if child == _SWAPPED:
                found.append(f"{host_name(path)} (changed while the referee read it)")
                continue
            try:
                names = os.listdir(child)
            except OSError:
                os.close(child)
                continue
            stack.append(_Dir(child, path, st.st_dev, names))
    finally:
        for frame in stack:
            os.close(frame.fd)
    return found


_GONE = -1
_SWAPPED = -2


def _open_listed(parent: int, name: str, listed: os.stat_result) -> int:
    """A descriptor of directory `name` below `parent`, when it is still the directory
    `listed` (lstat'ed a moment ago); `_GONE` when nothing has that name any more,
    `_SWAPPED` when something else has it now (a symlink, another directory, a file)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return _GONE
    except OSError:
        return _SWAPPED  # ELOOP: a symlink now; ENOTDIR: no directory now
    if os.path.samestat(os.fstat(fd), listed):
        return fd
    os.close(fd)
    return _SWAPPED


def _read(path: str) -> str:
    """A /proc file of the host as text: a byte that is not UTF-8 (a process named by
    its competitor) shows as `\\xff`, never raises, never reaches the log unescaped."""
    with open(path, "rb") as file:
        return host_text(file.read())


def _read_names(path: str) -> str:
    """A /proc file naming the host's files (mountinfo), decoded as `os.listdir` decodes
    names (`surrogateescape`), so its paths compare equal to the walk's."""
    with open(path, "rb") as file:
        return os.fsdecode(file.read())


def _listeners_of(init_pid: int) -> list[Listener]:
    """Blocking: the host's listening sockets and their holders, from this machine's
    /proc (kernel facts; nothing of the host's runs)."""
    sockets: dict[int, int] = {}
    for table in ("tcp", "tcp6"):
        text = _read(f"/proc/{init_pid}/net/{table}")
        if text.count("\n") > SCAN_LIMIT:
            raise HostFactsTooLargeError(
                f"the host has more than {SCAN_LIMIT} TCP sockets: the referee does not "
                "read a socket table that large"
            )
        for port, inode in parse_tcp_table(text):
            sockets[inode] = port
    netns = os.readlink(f"/proc/{init_pid}/ns/net")
    uid_map = _read(f"/proc/{init_pid}/uid_map")
    gid_map = _read(f"/proc/{init_pid}/gid_map")
    holders: dict[int, list[Holder]] = {inode: [] for inode in sockets}
    wanted = {f"socket:[{inode}]": inode for inode in sockets}
    seen = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.readlink(f"/proc/{pid}/ns/net") != netns:
                continue
            fds = os.listdir(f"/proc/{pid}/fd")
            seen += len(fds)
            if seen > SCAN_LIMIT:
                raise HostFactsTooLargeError(
                    f"the host's processes hold more than {SCAN_LIMIT} open files: the "
                    "referee does not read that many"
                )
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds}
            status = _read(f"/proc/{pid}/status")
        except OSError:
            continue  # gone meanwhile
        held = [wanted[link] for link in links if link in wanted]
        if not held:
            continue
        names = [ln.split(None, 1)[1] for ln in status.splitlines() if ln.startswith("Name:")]
        creds = parse_credentials(status, uid_map, gid_map)
        holder = Holder(pid, names[0] if names else "?", creds)
        for inode in held:
            holders[inode].append(holder)
    ordered = sorted(sockets, key=lambda i: sockets[i])
    return [Listener(sockets[i], i, tuple(holders[i])) for i in ordered]


async def host_init_pid(host: Host, port: int) -> int:
    """The host's init as this machine numbers it (the host-trust interface: asking for
    `port_owners` refreshes the driver's view of the host's init, after a reboot too)."""
    await host.port_owners(port)
    init = host.init_process
    if init is None:
        raise HostError("the driver shows no init process for this host")
    return init.pid


async def listeners(host: Host, port: int = 8080) -> list[Listener]:
    init_pid = await host_init_pid(host, port)
    return await asyncio.to_thread(_listeners_of, init_pid)


def _fail(reason: str, step: str, detail: str, reproduce: str) -> Verdict:
    return Verdict.failed(
        reason, Observation(step=step, elapsed_ms=0, error=detail, reproduce=reproduce).render()
    )


def judge_user(owners: tuple[Holder, ...], port: int) -> tuple[str, str] | None:
    """None when every process holding `port` runs as one dedicated non-root user and
    none can make itself root again (`root_ways`); else (reason, why). Pure."""
    if not owners:
        return "service_not_running", f"no process of the host holds the socket on {port}"
    rooted = [(o, ways) for o in owners if (ways := root_ways(o.creds))]
    if rooted:
        return "service_runs_as_root", f"the listener on {port} is or can become root: " + (
            "; ".join(f"{o.describe()} ({o.creds.describe()}): {', '.join(w)}" for o, w in rooted)
        )
    uids = {uid for o in owners for uid in o.creds.uids}
    if NOBODY in uids or -1 in uids or len(uids) != 1:
        described = ", ".join(f"{o.describe()} ({o.creds.describe()})" for o in owners)
        return "service_user_not_dedicated", f"not one dedicated user: {described}"
    return None


def judge_others(found: list[Listener], allowed: set[int]) -> str | None:
    """None when nothing but `allowed` ports listens; else which do. Pure."""
    others = [x for x in found if x.port not in allowed]
    if not others:
        return None
    return "; ".join(
        f"port {x.port} held by " + (", ".join(o.describe() for o in x.owners) or "no process")
        for x in others
    )


async def _facts(host: Host, ctx: CheckContext) -> tuple[list[Listener], Verdict | None]:
    try:
        return await listeners(host, ctx.challenge.port), None
    except HostFactsTooLargeError as exc:  # the host made its own facts unreadable
        return [], Verdict.failed("port_not_owned_by_unit", f"kernel facts refused: {exc}")
    except (OSError, HostError, AttributeError) as exc:
        return [], Verdict.referee_error("host_unavailable", f"kernel facts unreadable: {exc}")


async def user_verdict(host: Host, ctx: CheckContext) -> Verdict:
    found, error = await _facts(host, ctx)
    if error:
        return error
    port = ctx.challenge.port
    owners = tuple(o for x in found if x.port == port for o in x.owners)
    problem = judge_user(owners, port)
    if problem:
        return _fail(
            problem[0],
            f"owner of the socket listening on {port}",
            problem[1],
            f"ss -ltnp 'sport = :{port}'; grep -E "
            "'^(Uid|Gid|CapPrm|CapAmb|NoNewPrivs):' /proc/PID/status",
        )
    return Verdict.passed({"uid": owners[0].uid, "pids": [o.pid for o in owners]})


async def others_verdict(host: Host, ctx: CheckContext) -> Verdict:
    found, error = await _facts(host, ctx)
    if error:
        return error
    problem = judge_others(found, set(ctx.challenge.all_ports))
    if problem:
        return _fail("unexpected_listener", "the host's listening TCP sockets", problem, "ss -ltnp")
    return Verdict.passed({"listening": sorted({x.port for x in found})})


def id_mapper(uid_map: str, gid_map: str) -> Callable[[int, int], tuple[int, int]]:
    """(uid, gid) as this machine sees them -> as the host sees them. Pure."""
    return lambda uid, gid: (host_uid(uid, uid_map), host_uid(gid, gid_map))


def _sandbox_facts(init_pid: int, creds: Credentials) -> list[str]:
    """Blocking: what a process of the host with `creds` may write on disk outside the
    data directory, from its credentials and the host's files' permissions."""
    held = write_capabilities(f"{creds.cap_prm | creds.cap_eff | creds.cap_amb:x}")
    if held:
        return [f"it holds {', '.join(held)}: it may write anything"]
    if 0 in creds.uids:
        return [f"it can act as root ({creds.describe()}): it may write anything"]
    mountinfo = _read_names(f"/proc/{init_pid}/mountinfo")
    skip, skip_paths = memory_mount_ids(mountinfo), frozenset(memory_mounts(mountinfo))
    to_host = id_mapper(_read(f"/proc/{init_pid}/uid_map"), _read(f"/proc/{init_pid}/gid_map"))
    # Ids compared as the host sees them, on both sides (its credentials and its files).
    return _walk_writable(
        f"/proc/{init_pid}/root", skip, skip_paths, DATA_DIR, frozenset(creds.uids),
        creds.all_gids, to_host,
    )  # fmt: skip


async def sandbox_verdict(host: Host, ctx: CheckContext) -> Verdict:
    found, error = await _facts(host, ctx)
    if error:
        return error
    owners = [o for x in found if x.port == ctx.challenge.port for o in x.owners]
    if not owners:
        return _fail(
            "service_not_running",
            "what the service may write",
            f"no process holds port {ctx.challenge.port}",
            "ss -ltnp",
        )
    # Every holder counts; holders with the same credentials are walked for once.
    alike: dict[Credentials, list[Holder]] = {}
    for owner in owners:
        alike.setdefault(owner.creds, []).append(owner)
    problems: list[str] = []
    try:
        init_pid = await host_init_pid(host, ctx.challenge.port)
        for creds, holders in alike.items():
            who = ", ".join(f"pid {o.pid} {o.comm}" for o in holders)
            problems += [
                f"{who}: {m}" for m in await asyncio.to_thread(_sandbox_facts, init_pid, creds)
            ]
    except (OSError, HostError, KeyError, ValueError) as exc:
        return Verdict.referee_error("host_unavailable", f"what the service may write: {exc}")
    if problems:
        return _fail(
            "writable_outside_data",
            "what the service may write (permissions, disk)",
            "writable outside " + DATA_DIR + ": " + "; ".join(problems[:5]),
            "find / -xdev -writable -not -path '/proc/*' (as the service's user)",
        )
    return Verdict.passed({"writable": DATA_DIR})


@register_check("service-user")
async def service_user(host: Host, ctx: CheckContext) -> Verdict:
    """Whoever holds the service's listening socket runs as one dedicated non-root user."""
    return await user_verdict(host, ctx)


@register_check("only-listener")
async def only_listener(host: Host, ctx: CheckContext) -> Verdict:
    """No TCP socket of the host listens on any port but the challenge's."""
    return await others_verdict(host, ctx)


@register_check("write-sandbox")
async def write_sandbox(host: Host, ctx: CheckContext) -> Verdict:
    """The service's processes can write nothing on disk outside the data directory:
    their own mount table shows every other disk filesystem read-only."""
    return await sandbox_verdict(host, ctx)


@register_check("hardened-reboot")
async def hardened_reboot(host: Host, ctx: CheckContext) -> Verdict:
    """Reboot durability (the built-in check), then the user, the listeners and the
    sandbox once more: the planted listener must stay gone."""
    verdict = await get_check("fault-durability")(host, ctx)
    for after in (user_verdict, others_verdict, sandbox_verdict):
        if verdict.outcome != "passed":
            return verdict
        nxt = await after(host, ctx)
        verdict = nxt if nxt.outcome != "passed" else verdict
    return verdict
