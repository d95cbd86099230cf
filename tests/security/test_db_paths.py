"""Red team: a `--db` that is not a file the arena may own changes nothing on the machine.

`opsarena run --builder a=llm:x --db /tmp` once answered "cannot open the event log /tmp"
after chmodding `/tmp` to 0600 (every podman host on the machine then failed to start),
and a symlink planted as `X.db-shm` had any root-owned file chmodded the same way. Here
every shape of `--db` is planted in a scratch "machine" directory (a sticky 1777 `tmp` like
the real one, files of root and of another user, a read-only mount, an immutable
directory) and the real CLI is run against it: each is refused with exit 2 and one line
naming the path and what is wrong, and every file under the machine directory keeps its
mode, owner, links, target and contents.

`run` gets `--driver nosuch`: a path the arena wrongly accepted makes it stop at the
driver (exit 2 too, but with another message, and only after writing the log), never
start hosts.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from opsarena.store import SqliteEventStore

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
RUN = ["run", "--builder", "a=llm:x", "--driver", "nosuch"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants root's and other users' files")


def opsarena(*argv: str, db: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", *argv, "--db", str(db)],
        capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
        check=False, cwd=ROOT,
    )  # fmt: skip


def snapshot(top: Path) -> dict[str, tuple[object, ...]]:
    """Everything a chmod, chown, write, create or delete under `top` would change:
    per entry its type and mode, owner, links, device, and its contents (a regular file),
    its target (a symlink). Walks without following a symlink; reads no FIFO or device."""
    seen: dict[str, tuple[object, ...]] = {}
    for directory, dirs, files in os.walk(top, followlinks=False):
        for name in [".", *dirs, *files]:
            path = Path(directory) / name
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                extra: object = hashlib.sha256(path.read_bytes()).hexdigest()
            elif stat.S_ISLNK(info.st_mode):
                extra = os.readlink(path)
            else:
                extra = info.st_rdev
            key = str(path.relative_to(top))
            seen[key] = (info.st_mode, info.st_uid, info.st_gid, info.st_nlink, extra)
    return seen


def make_log(path: Path, mode: int = 0o644) -> None:
    """An opsarena event log of root's (one match), left with a loose mode."""
    with SqliteEventStore(path) as store:
        store.append_blocking("m1", "note", {"k": 1}, 0)
    os.chmod(path, mode)


def machine_file(path: Path, owner: int = 0) -> Path:
    """A file of the machine's (root's, 0644, like /etc/passwd) that must stay as it is."""
    path.write_text("machine: keep me 0644\n")
    os.chmod(path, 0o644)
    os.chown(path, owner, owner)
    return path


@dataclass
class Shape:
    db: Path
    wrong: str
    """A regex for what the one line says is wrong."""


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Path]:
    """A scratch machine: `tmp` (root's, 1777, as /tmp), `etc/passwd` (root's 0644)."""
    top = tmp_path / "machine"
    (top / "tmp").mkdir(parents=True)
    os.chmod(top / "tmp", 0o1777)
    (top / "etc").mkdir()
    machine_file(top / "etc" / "passwd")
    yield top


def directory(top: Path) -> Shape:
    return Shape(top / "tmp", r"is a directory")


def symlink_to_directory(top: Path) -> Shape:
    (top / "tmp" / "log.db").symlink_to(top / "tmp")
    return Shape(top / "tmp" / "log.db", r"is a symbolic link \(to .*tmp\)")


def symlink_to_machine_file(top: Path) -> Shape:
    (top / "tmp" / "log.db").symlink_to(top / "etc" / "passwd")
    return Shape(top / "tmp" / "log.db", r"is a symbolic link \(to .*passwd\)")


def dangling_symlink(top: Path) -> Shape:
    (top / "tmp" / "log.db").symlink_to(top / "etc" / "new.db")
    return Shape(top / "tmp" / "log.db", r"is a symbolic link")


def symlink_to_own_log(top: Path) -> Shape:
    make_log(top / "tmp" / "real.db", 0o600)
    (top / "tmp" / "log.db").symlink_to(top / "tmp" / "real.db")
    return Shape(top / "tmp" / "log.db", r"is a symbolic link")


def device(top: Path) -> Shape:
    os.mknod(top / "tmp" / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.chmod(top / "tmp" / "null", 0o666)
    return Shape(top / "tmp" / "null", r"is a character device, not a regular file")


def fifo(top: Path) -> Shape:
    os.mkfifo(top / "tmp" / "pipe")
    os.chmod(top / "tmp" / "pipe", 0o666)
    return Shape(top / "tmp" / "pipe", r"is a named pipe \(FIFO\), not a regular file")


def another_users_file(top: Path) -> Shape:
    machine_file(top / "tmp" / "theirs.db", owner=NOBODY)
    return Shape(top / "tmp" / "theirs.db", rf"belongs to uid {NOBODY}\b.*not to this user")


def another_users_log(top: Path) -> Shape:
    make_log(top / "tmp" / "theirs.db")
    os.chown(top / "tmp" / "theirs.db", NOBODY, NOBODY)
    return Shape(top / "tmp" / "theirs.db", rf"belongs to uid {NOBODY}\b")


def hard_link_to_machine_file(top: Path) -> Shape:
    os.link(top / "etc" / "passwd", top / "tmp" / "log.db")
    return Shape(top / "tmp" / "log.db", r"has 2 hard links")


def planted_companion(suffix: str, how: str) -> Callable[[Path], Shape]:
    """A loose log of ours, and beside it `log.db<suffix>` planted: a symlink to the
    machine's file, or a hard link of it."""

    def plant(top: Path) -> Shape:
        db = top / "tmp" / "log.db"
        make_log(db)
        companion = Path(f"{db}{suffix}")
        if how == "symlink":
            companion.symlink_to(top / "etc" / "passwd")
            wrong = rf"-{suffix[1:]} file .*log\.db{suffix} is a symbolic link \(to .*passwd\)"
        else:
            os.link(top / "etc" / "passwd", companion)
            wrong = rf"-{suffix[1:]} file .*log\.db{suffix} has 2 hard links"
        return Shape(db, wrong)

    plant.__name__ = f"{suffix[1:]}_{how}"
    return plant


def missing_directory(top: Path) -> Shape:
    return Shape(top / "tmp" / "nowhere" / "deeper" / "log.db", r"nowhere/deeper does not exist")


def file_as_directory(top: Path) -> Shape:
    return Shape(top / "etc" / "passwd" / "log.db", r"passwd is a regular file, not a directory")


def immutable_directory(top: Path) -> Shape:
    """A directory even root cannot write (`chattr +i`), holding a loose log of ours."""
    where = top / "frozen"
    where.mkdir()
    make_log(where / "log.db")
    if subprocess.run(["chattr", "+i", str(where)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    return Shape(where / "log.db", r"frozen is not writable by this user")


def socket_file(top: Path) -> Shape:
    return Shape(top / "tmp" / "sock", r"is a socket, not a regular file")


SHAPES = [
    directory, symlink_to_directory, symlink_to_machine_file, dangling_symlink,
    symlink_to_own_log, device, fifo, socket_file, another_users_file, another_users_log,
    hard_link_to_machine_file, planted_companion("-shm", "symlink"),
    planted_companion("-wal", "symlink"), planted_companion("-journal", "symlink"),
    planted_companion("-shm", "hardlink"), missing_directory, file_as_directory,
    immutable_directory,
]  # fmt: skip


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The CLI's environment: no `$OPSARENA_DB`, a data directory of the test's own."""
    base = {k: v for k, v in os.environ.items() if k != "OPSARENA_DB"}
    return {**base, "XDG_DATA_HOME": str(tmp_path / "data")}


@contextlib.contextmanager
def planted(shape: Callable[[Path], Shape], top: Path) -> Iterator[Shape]:
    """The shape planted under `top`; afterwards whatever it needs undone (a listening
    socket closed, an immutable flag cleared), whatever failed."""
    listener: socket.socket | None = None
    try:
        if shape is socket_file:
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(str(top / "tmp" / "sock"))
            os.chmod(top / "tmp" / "sock", 0o777)
        yield shape(top)
    finally:
        if listener is not None:
            listener.close()
        if (top / "frozen").exists():
            subprocess.run(["chattr", "-i", str(top / "frozen")], check=False)


def assert_refused(result: subprocess.CompletedProcess[str], shape: Shape) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("opsarena: error: ") and str(shape.db) in lines[0], lines[0]
    assert re.search(shape.wrong, lines[0]), lines[0]


WRITERS_ONLY = {immutable_directory}
"""Shapes only a writer refuses: a log of ours in a directory nobody may write is read."""


@pytest.mark.parametrize(
    ("shape", "argv"),
    [
        pytest.param(shape, argv, id=f"{shape.__name__}-{argv[0]}")
        for shape in SHAPES
        for argv in (RUN, ["events", "m1"])
        if argv is RUN or shape not in WRITERS_ONLY
    ],
)
def test_a_db_that_is_not_ours_to_open_is_refused_and_nothing_changes(
    shape: Callable[[Path], Shape], argv: list[str], machine: Path, env: dict[str, str]
) -> None:
    """`run` opens the log to write, `events` to read: both refuse, changing nothing."""
    with planted(shape, machine) as target:
        before = snapshot(machine)
        result = opsarena(*argv, db=target.db, env=env)
        after = snapshot(machine)
    assert_refused(result, target)
    assert after == before


@pytest.fixture
def read_only_mount(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs holding a loose log of ours, remounted read-only; unmounted afterwards."""
    where = tmp_path / "ro"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        make_log(where / "log.db")
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_db_on_a_read_only_file_system_is_refused_and_nothing_changes(
    read_only_mount: Path, env: dict[str, str]
) -> None:
    shape = Shape(read_only_mount / "log.db", r"ro is on a read-only file system")
    before = snapshot(read_only_mount)
    for argv in (RUN, ["ls"], ["db", "migrate"]):
        assert_refused(opsarena(*argv, db=shape.db, env=env), shape)
    assert snapshot(read_only_mount) == before


EVERY_COMMAND = [
    RUN, ["demo"], ["done", "m1", "a"], ["resume", "m1", "--driver", "nosuch"],
    ["show", "m1"], ["ls"], ["events", "m1"], ["verify", "m1"], ["serve", "--port", "0"],
    ["leaderboard"], ["db", "migrate"],
    ["tournament", "run", str(ROOT / "examples" / "tournament-scripted.toml"), "--driver",
     "nosuch"],
    ["tournament", "resume", "t1", "--driver", "nosuch"], ["tournament", "ls"],
    ["tournament", "show", "t1"], ["tournament", "report", "t1", "--html", "{tmp}/t1.html"],
]  # fmt: skip


@pytest.mark.parametrize("argv", EVERY_COMMAND, ids=lambda a: "-".join(a[:2]))
def test_every_command_taking_db_refuses_a_planted_shm_and_changes_nothing(
    argv: list[str], machine: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    """The sneakiest shape (a loose log of ours whose `-shm` is a symlink to a machine
    file: the old code chmodded the machine file) against every command taking --db."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with planted(planted_companion("-shm", "symlink"), machine) as target:
        before = snapshot(machine)
        result = opsarena(*argv, db=target.db, env={**env, "OPSARENA_DONE_TOKEN": "x"})
        after = snapshot(machine)
    assert_refused(result, target)
    assert after == before
    assert not (tmp_path / "t1.html").exists()


def test_db_copy_refuses_a_source_that_is_not_a_log_of_ours(
    machine: Path, env: dict[str, str]
) -> None:
    shape = symlink_to_machine_file(machine)
    before = snapshot(machine)
    result = subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", "db", "copy", str(shape.db), "postgresql://x/y"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert_refused(result, shape)
    assert snapshot(machine) == before


def test_a_good_db_still_works_and_only_its_own_files_change(
    machine: Path, env: dict[str, str]
) -> None:
    """The control: a new file in the sticky tmp is created 0600, the directory keeps
    its mode, the machine's files are untouched; a loose log of ours is tightened."""
    db = machine / "tmp" / "fresh.db"
    before = snapshot(machine)
    listed = opsarena("ls", db=db, env=env)
    assert listed.returncode == 0, listed.stderr
    after = snapshot(machine)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert {k: v for k, v in after.items() if k != "tmp/fresh.db"} == before
    loose = machine / "tmp" / "loose.db"
    make_log(loose)
    assert opsarena("ls", db=loose, env=env).returncode == 0
    assert stat.S_IMODE(loose.stat().st_mode) == 0o600
    with sqlite3.connect(loose) as conn:
        assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 1
