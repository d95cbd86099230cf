"""Idmapped mounts: a read-only view of a directory tree whose owners are shifted into a
host's uid and gid range.

A power-cut host's root is an overlay the driver mounts itself (`hosts/powerdisk.py`)
and runs with `podman run --rootfs`, which podman 4.3 cannot map into a user namespace.
So the driver gives the overlay idmapped lower layers instead: each image layer is
cloned (`open_tree(2)` with `OPEN_TREE_CLONE`), the clone is marked idmapped to a user
namespace whose map is the host's range and read-only (`mount_setattr(2)` with
`MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY`), and attached under the disk's directory
(`move_mount(2)`). Files the image's layer owns as uid 0 show as the host's root uid
through the clone; the overlay's upper layer is plain (not idmapped), so whatever the
host writes lands on the machine's disk owned by the host's own uids, never by uid 0.
Overlayfs itself cannot be idmapped on this kernel (EINVAL); layers can (Linux 5.19+).

A user namespace is named by a file descriptor only while some process lives in it:
`unshare --user sleep` (util-linux, the machine's own program) provides one for the
moment it takes to write its maps and open its `ns/user`, then is killed. The clone
keeps a reference to the namespace, so it outlives the process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
"""The same number on every architecture (syscalls added since Linux 5.1 share one table)."""
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = 0o2000000
MOVE_MOUNT_F_EMPTY_PATH = 0x00000004
MOUNT_ATTR_RDONLY = 0x00000001
MOUNT_ATTR_NODEV = 0x00000004
MOUNT_ATTR_IDMAP = 0x00100000
NAMESPACE_WAIT_S = 5.0


@dataclass(frozen=True)
class IdRange:
    """A host's ids on the machine: its uid 0 is machine uid `uid`, its gid 0 machine
    gid `gid`, each for `size` ids."""

    uid: int
    gid: int
    size: int

    def __post_init__(self) -> None:
        if self.uid <= 0 or self.gid <= 0 or self.size <= 0:
            raise ValueError(f"{self} is not a range of its own (machine root or empty)")

    def text(self) -> str:
        """The form kept in a disk's `idmap` file: `UID GID SIZE`."""
        return f"{self.uid} {self.gid} {self.size}"

    @classmethod
    def parse(cls, text: str) -> IdRange:
        uid, gid, size = (int(part) for part in text.split())
        return cls(uid, gid, size)

    def podman_flags(self) -> list[str]:
        """`podman run` flags that put a container in exactly this range."""
        return [
            "--uidmap", f"0:{self.uid}:{self.size}",
            "--gidmap", f"0:{self.gid}:{self.size}",
        ]  # fmt: skip


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)


def _syscall(name: str, number: int, *args: object) -> int:
    result = int(_libc.syscall(number, *args))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")
    return result


def _namespace_fd(ids: IdRange) -> int:
    """An open `ns/user` of a new user namespace mapping 0.. to `ids`."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise OSError("unshare (util-linux) is not installed")
    child = subprocess.Popen(
        [unshare, "--user", "--", "sleep", "30"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        own = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + NAMESPACE_WAIT_S
        while True:
            with contextlib.suppress(FileNotFoundError):
                if os.readlink(f"/proc/{child.pid}/ns/user") != own:
                    break
            if child.poll() is not None or time.monotonic() > deadline:
                error = child.stderr.read().decode(errors="replace") if child.stderr else ""
                raise OSError(f"unshare --user did not make a namespace: {error.strip()}")
            time.sleep(0.0005)
        for name, base in (("uid_map", ids.uid), ("gid_map", ids.gid)):
            with open(f"/proc/{child.pid}/{name}", "w") as mapping:
                mapping.write(f"0 {base} {ids.size}\n")
        return os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        child.kill()
        child.wait()
        if child.stderr is not None:
            child.stderr.close()


def mount_shifted(source: Path, target: Path, ids: IdRange) -> None:
    """Attach at `target` a read-only clone of the mount at `source` (not recursive)
    through which every owner appears shifted into `ids`. Blocking; raises `OSError`
    (EINVAL: the filesystem at `source` cannot be idmapped)."""
    namespace = _namespace_fd(ids)
    try:
        tree = _syscall(
            "open_tree", SYS_OPEN_TREE, AT_FDCWD, os.fsencode(source),
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC,
        )  # fmt: skip
        try:
            attr = _MountAttr(
                MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV, 0, 0, namespace
            )
            _syscall(
                "mount_setattr", SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH,
                ctypes.byref(attr), ctypes.sizeof(attr),
            )  # fmt: skip
            _syscall(
                "move_mount", SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, os.fsencode(target),
                MOVE_MOUNT_F_EMPTY_PATH,
            )  # fmt: skip
        finally:
            os.close(tree)
    finally:
        os.close(namespace)
