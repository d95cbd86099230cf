"""The disk-loss fault, from outside the host: a directory's contents gone, every process dead.

A host's data disk fails and is replaced by an empty one: nothing the host's processes
held in memory survives, and everything below one directory is gone, while the rest of
its disk is kept. Done from the arena's side of the kernel while the host is frozen
(no process of it can run, fork or write meanwhile): the directory is resolved from the
host's root one component at a time without following a symlink, emptied without
following anything or entering another mount (`kernel.empty_directory`), and every
process of the host's PID namespace gets SIGKILL before the thaw, so none runs a single
instruction after the files went. The driver then boots the host again.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from opsarena.errors import PathMissingError
from opsarena.hosts import crash, kernel


def check_path(path: str) -> list[str]:
    """The components of absolute `path`; raises `PathMissingError` for a relative path,
    `/`, or one with `.`/`..` components or an empty one."""
    parts = path.split("/")
    if not path.startswith("/") or path == "/" or any(p in ("", ".", "..") for p in parts[1:]):
        raise PathMissingError(f"{path!r} is not an absolute path to a directory below /")
    return parts[1:]


def open_in_host(init_pid: int, path: str) -> int:
    """A descriptor of directory `path` in the host of `init_pid`, reached from its root
    one component at a time with O_NOFOLLOW (a symlink anywhere on the way is refused).
    Raises `PathMissingError` when it is not there or not a directory."""
    parts = check_path(path)
    fd = os.open(f"/proc/{init_pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(parts):
            flags = os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
            flags |= os.O_RDONLY if index == len(parts) - 1 else os.O_PATH
            try:
                child = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                where = "/" + "/".join(parts[: index + 1])
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    raise PathMissingError(
                        f"{where} in the host is not a directory (a symlink or missing): "
                        f"the directory {path} the challenge names must exist as a plain "
                        "directory"
                    ) from exc
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


@dataclass(frozen=True)
class Loss:
    """What the loss did: entries deleted, processes killed, the instant of the kills in
    the unit of `Proc.start`."""

    removed: int
    killed: int
    instant: int


def lose(init_pid: int, path: str) -> Loss:
    """Blocking: freeze the host of `init_pid`, empty `path` in it, SIGKILL every process
    of its PID namespace, thaw. Raises `PathMissingError` when `path` is not a plain
    directory there or holds a mount point (nothing is killed then); `OSError` when an
    entry cannot be removed."""
    freezer = crash.host_freezer(init_pid)
    directory = open_in_host(init_pid, path)
    try:
        with crash.frozen(freezer):
            foreign = kernel.mount_below(directory)
            if foreign is not None:
                raise PathMissingError(
                    f"{path} in the host holds a mount point ({path}/{foreign}): the data "
                    "directory must be a plain directory of the host's disk"
                )
            everyone = kernel.host_processes(init_pid)
            instant = kernel.now_ticks()
            killed = sum(kernel.signal_process(proc) for proc in everyone)
            removed = kernel.empty_directory(".", dir_fd=directory)
    finally:
        os.close(directory)
    return Loss(removed=removed, killed=killed, instant=instant)
