"""A real, throw-away PostgreSQL server for tests: Debian's binaries, a cluster in a temp dir.

The server runs as an unprivileged user (PostgreSQL refuses to run as root, and CI is
root): the `postgres` account Debian's package creates, else `nobody`. It listens on a
unix socket in its own directory only (`listen_addresses=''`): no TCP port at all.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

START_TIMEOUT_S = 60


def _binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def postgres_available() -> bool:
    return _binaries() is not None


def _run_as(user: str | None, argv: list[str]) -> None:
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[-1] if argv else ''}: {done.stderr.strip() or done.stdout}")


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a fresh cluster; yield its libpq URL (unix socket); stop and delete it."""
    bindir = _binaries()
    if bindir is None:
        raise RuntimeError("PostgreSQL server binaries missing: apt-get install postgresql")
    user: str | None = None
    if os.geteuid() == 0:
        user = "postgres" if _has_user("postgres") else "nobody"
    base = Path(tempfile.mkdtemp(prefix="opsarena-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    if user is not None:
        entry = pwd.getpwnam(user)
        for path in (base, sock):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    os.chmod(base, 0o700)
    db_user = user or pwd.getpwuid(os.geteuid()).pw_name
    try:
        _run_as(user, [str(bindir / "initdb"), "-D", str(data), "-U", db_user,
                       "--auth=trust", "--no-sync", "-E", "UTF8"])  # fmt: skip
        options = f"-c listen_addresses='' -k {sock} -c fsync=on -c max_connections=200"
        log = str(base / "log")
        _run_as(user, [str(bindir / "pg_ctl"), "-D", str(data), "-o", options,
                       "-w", "-t", str(START_TIMEOUT_S), "-l", log, "start"])  # fmt: skip
        try:
            yield f"postgresql:///postgres?host={sock}&user={db_user}"
        finally:
            _run_as(user, [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"])
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def postgres_for_tests() -> Iterator[str]:
    """`postgres_server` for a fixture: skipped without the server binaries, except in CI
    (where they are installed, so their absence is a failure)."""
    if not postgres_available():
        if os.environ.get("CI"):
            pytest.fail("CI needs PostgreSQL's server binaries: ./bootstrap test installs them")
        pytest.skip("PostgreSQL server binaries missing (apt-get install postgresql)")
    with postgres_server() as url:
        yield url


def new_database(url: str) -> str:
    """A new empty database on the server at `url`; returns its URL."""
    import psycopg

    name = f"t{secrets.token_hex(6)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.replace("///postgres?", f"///{name}?", 1)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
