"""The SQLite event log's path: checked before anything is opened, changed only through
descriptors the arena opened without following a symlink.

A `--db` path (or `$OPSARENA_DB`) is whatever the user typed: a directory, a device, a
symlink someone planted. Before the store creates or changes anything, `check_db_path`
`lstat`s the path and its SQLite companions (`-wal`, `-shm`, `-journal`) and refuses, in
one line naming the path and what is wrong, anything but a regular file of this user with
one name (or no file yet, in an existing directory a writer can write to). The file is
then created with `O_CREAT|O_EXCL|O_NOFOLLOW` (`open_db_file`), and its mode, and its
companions', is only ever tightened through an `O_NOFOLLOW` descriptor whose `fstat`
showed a regular file of ours (`tighten`), once the store knows the file is an opsarena
event log: the arena never changes a path it did not create as a regular file. SQLite
opens the companions with `O_NOFOLLOW` itself, so one planted between the check and the
open makes the open fail; nothing is followed.

Only the default directory (`opsarena/` in the user data directory) is created, 0700.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from pathlib import Path

from opsarena.errors import NoEventLogError, StoreError

COMPANIONS = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside a database `X`: `X-wal`, `X-shm`, `X-journal`."""


def kind_of(mode: int) -> str:
    """What a file of `st_mode` `mode` is, as messages say it."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _owner(uid: int) -> str:
    with contextlib.suppress(KeyError):
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    return f"uid {uid}"


def _problem(info: os.stat_result, path: Path) -> str | None:
    """Why a file of `info` may not be an event log (or its companion); None when it may."""
    if stat.S_ISLNK(info.st_mode):
        try:
            target = f" (to {os.readlink(path)})"
        except OSError:
            target = ""
        return f"is a symbolic link{target}, which the arena never follows"
    if stat.S_ISDIR(info.st_mode):
        return f"is a directory, not a file (a file in it, e.g. {path / 'opsarena.db'}?)"
    if not stat.S_ISREG(info.st_mode):
        return f"is {kind_of(info.st_mode)}, not a regular file"
    if info.st_uid != os.geteuid():
        return (
            f"belongs to {_owner(info.st_uid)}, not to this user ({_owner(os.geteuid())}), "
            "and the arena opens only files of its own"
        )
    if info.st_nlink != 1:
        return f"has {info.st_nlink} hard links, and the arena opens only a file with one name"
    return None


def _refusal(path: Path, problem: str, suffix: str = "") -> StoreError:
    """The one line that refuses `path` (the log, or its companion `suffix`) for `problem`."""
    if suffix:
        return StoreError(
            f"the event log's {suffix} file {path} {problem}: remove it, or choose another --db"
        )
    return StoreError(f"the event log {path} {problem}: choose another --db")


def _check_directory(path: Path, *, write: bool) -> None:
    parent = path.parent
    try:
        info = os.stat(parent)
    except FileNotFoundError:
        if not write:
            raise NoEventLogError(
                f"no event log at {path}: its directory {parent} does not exist"
            ) from None
        raise StoreError(
            f"the event log {path} cannot be created: its directory {parent} does not exist "
            "(create it first, or choose another --db)"
        ) from None
    except OSError as exc:
        raise StoreError(
            f"the event log {path}: cannot use its directory {parent}: {exc.strerror}"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise StoreError(
            f"the event log {path}: {parent} is {kind_of(info.st_mode)}, not a directory: "
            "choose another --db"
        )
    effective = os.access in os.supports_effective_ids
    if write and not os.access(parent, os.W_OK, effective_ids=effective):
        read_only = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
        why = (
            "is on a read-only file system"
            if read_only
            else "is not writable by this user (its mode, or an immutable flag)"
        )
        raise StoreError(
            f"the event log {path} cannot be written: its directory {parent} {why} (SQLite "
            "keeps its -wal and -shm files beside the log): choose another --db"
        )


def check_db_path(path: Path, *, write: bool) -> bool:
    """Check, changing nothing, that `path` may be opened as an SQLite event log (for
    writing, with `write`); return whether the file exists. Raises `StoreError` (one line:
    the path and what is wrong) for a symlink, a directory, a device, a FIFO, a socket, a
    file of another user or with several names, at the path or at one of its `COMPANIONS`;
    for a directory that is missing or, with `write`, not writable. A reader gets
    `NoEventLogError` when there is no file."""
    _check_directory(path, write=write)
    try:
        info: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise StoreError(f"cannot use the event log {path}: {exc.strerror}") from None
    if info is None and not write:
        raise NoEventLogError(
            f"no event log at {path}: run a match first (opsarena demo) or pass --db"
        )
    if info is not None and (problem := _problem(info, path)) is not None:
        raise _refusal(path, problem)
    for suffix in COMPANIONS:
        companion = Path(f"{path}{suffix}")
        try:
            found = os.lstat(companion)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StoreError(f"cannot use the event log's {companion}: {exc.strerror}") from None
        if (problem := _problem(found, companion)) is not None:
            raise _refusal(companion, problem, suffix)
    return info is not None


def _open_checked(path: Path, suffix: str = "") -> int:
    """An `O_PATH|O_NOFOLLOW` descriptor of `path`, after `fstat` shows a regular file of
    ours with one name (a swap since `check_db_path` is refused).

    `O_PATH` because closing any other descriptor of a file drops every POSIX lock this
    process holds on it: SQLite's locks of another connection to the same log (its `-shm`
    lock going would let another process reset the shared memory under it). Closing an
    `O_PATH` descriptor drops none."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StoreError(f"cannot open {path}: {exc.strerror}") from None
    problem = _problem(os.fstat(fd), path)
    if problem is not None:
        os.close(fd)
        raise _refusal(path, problem, suffix)
    return fd


def _restrict(fd: int, path: Path) -> None:
    """Make the file `_open_checked` opened at `fd` 0600 (`fchmod` cannot take an `O_PATH`
    descriptor; its `/proc/self/fd` name is the very inode, never a symlink)."""
    try:
        os.chmod(f"/proc/self/fd/{fd}", 0o600)
    except OSError as exc:
        raise StoreError(f"cannot make {path} readable by its owner only: {exc}") from None


def open_db_file(path: Path) -> tuple[int, bool]:
    """Create `path` 0600 (`O_CREAT|O_EXCL|O_NOFOLLOW`) when it is missing, for a writer
    that `check_db_path` let through; return an `O_PATH` descriptor of the file (see
    `_open_checked`) and whether this call created it. Raises `StoreError`."""
    created = True
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        created = False
    except OSError as exc:
        raise StoreError(f"cannot create the event log {path}: {exc.strerror}") from None
    else:
        try:
            os.fchmod(fd, 0o600)  # whatever the umask took away, the owner reads and writes
        finally:
            os.close(fd)  # a new file: no connection of this process holds a lock on it
    return _open_checked(path), created


def tighten(fd: int, path: Path) -> None:
    """Take group and other access away from the event log at `fd` (from `open_db_file`)
    and from its companions that exist, each through an `O_PATH|O_NOFOLLOW` descriptor.
    Only for a file the store has found to be an opsarena event log. Raises `StoreError`
    for a companion that is not a regular file of ours with one name."""
    if os.fstat(fd).st_mode & 0o077:
        _restrict(fd, path)
    for suffix in COMPANIONS:
        companion = Path(f"{path}{suffix}")
        if not os.path.lexists(companion):
            continue
        companion_fd = _open_checked(companion, suffix)
        try:
            if os.fstat(companion_fd).st_mode & 0o077:
                _restrict(companion_fd, companion)
        finally:
            os.close(companion_fd)


def ensure_private_directory(directory: Path) -> None:
    """Create `directory` 0700 (with its parents) when missing; take group and other
    access away from it when it is ours, through a descriptor (a symlink there, the
    user's own choice, is left as it is). For the default directory only. Raises
    `StoreError`."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the event log's directory {directory}: {exc}") from None
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # a symlink (or not a directory): check_db_path says what is wrong
    try:
        info = os.fstat(fd)
        if info.st_uid == os.geteuid() and info.st_mode & 0o077:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
