"""Shared fixtures: real hosts on the podman driver, each test with its own match id.

Every host a test makes is labelled with a match id unique to that test, and the
match's hosts are removed when the test ends, whether it passed or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from opsarena.hosts import DEFAULT_IMAGE, Host, HostDriver, HostSpec, get_driver
from tests import leaks

HostFactory = Callable[..., Awaitable[Host]]

TEST_IMAGE = os.environ.get("OPSARENA_TEST_IMAGE", DEFAULT_IMAGE)


def _image_present() -> bool:
    if shutil.which("podman") is None:
        return False
    probe = subprocess.run(["podman", "image", "exists", TEST_IMAGE], check=False)
    return probe.returncode == 0


SLOW_FILES = (
    "tests/tournament/test_end_to_end.py",
    "tests/match/test_controller.py",
    "tests/tournament/test_every_challenge.py",
    "tests/tournament/test_ray_cluster.py",
    "tests/match/test_resume.py",
    "tests/agents/test_matches.py",
    "tests/tournament/test_page.py",
    "tests/challenges/test_calibration_0.py",
    "tests/challenges/test_calibration_1.py",
    "tests/challenges/test_calibration_2.py",
    "tests/challenges/test_calibration_3.py",
    "tests/tournament/test_signals.py",
    "tests/referee/test_settle.py",
    "tests/security/test_db_paths.py",
    "tests/security/test_log_flood.py",
    "tests/security/test_referee_unpredictable.py",
)
"""The files that take longest (junit figures of a CI run), first: with `--dist loadfile`
each file is one unit of work, so starting the long ones first keeps the last worker
from running one alone at the end (longest processing time first)."""


def _slow_rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return SLOW_FILES.index(path) if path in SLOW_FILES else len(SLOW_FILES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest files first (`SLOW_FILES`, a stable sort: the rest keep their order).
    Tests marked `hosts` need podman and the image; in CI their absence is an error."""
    items.sort(key=_slow_rank)
    if _image_present():
        return
    if os.environ.get("CI"):
        raise pytest.UsageError(f"CI needs podman and the image {TEST_IMAGE}: run ./bootstrap test")
    skip = pytest.mark.skip(reason=f"podman or image {TEST_IMAGE} missing (./bootstrap test)")
    for item in items:
        if "hosts" in item.keywords:
            item.add_marker(skip)


def podman_names(match_id: str) -> list[str]:
    """Names of every container podman has labelled with `match_id`, running or not."""
    label = f"label=opsarena.match={match_id}"
    out = subprocess.run(
        ["podman", "ps", "--all", "--filter", label, "--format", "{{.Names}}"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return out.stdout.split()


def new_match_id(prefix: str = "t") -> str:
    """A match id no other test uses (hosts are named after it). Recorded: what is left
    of it when the session ends fails the run (`no_leaks`)."""
    match_id = f"{prefix}{secrets.token_hex(4)}"
    leaks.MATCH_IDS.add(match_id)
    return match_id


@pytest.fixture(scope="session", autouse=True)
def no_leaks() -> Iterator[None]:
    """At the end of the session (each xdist worker's own): hosts, id reservations,
    runtime containers, power-cut disks, disk servers or agent cgroups left of the match
    ids this session's tests made fail the run loudly, naming them; they are removed
    first, so the machine is clean for the next run either way."""
    yield
    if shutil.which("podman") is None:
        return
    left = leaks.leftovers(leaks.MATCH_IDS)
    if left:
        leaks.remove(left)
        lines = "\n".join(f"  {match_id}: {', '.join(things)}" for match_id, things in left.items())
        pytest.fail(f"tests left these behind (removed now; fix the test's cleanup):\n{lines}")


class ArenaRuns:
    """The `opsarena` processes (match runs, tournaments, servers) a test starts, with the
    event logs they write; `arena_runs` ends them and what they made at teardown."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.popens: list[subprocess.Popen[Any]] = []
        self.dbs: list[Path] = []

    def start(self, db: Path | None, argv: list[str], **popen: Any) -> subprocess.Popen[Any]:
        """`subprocess.Popen(argv, **popen)` in a session of its own, whose matches (read
        from the SQLite log `db`, if any) are cleaned up at teardown."""
        popen.setdefault("start_new_session", True)
        process = subprocess.Popen(argv, **popen)
        self.popens.append(process)
        self.adopt(process.pid, db)
        return process

    def adopt(self, pid: int, db: Path | None) -> None:
        """Also end `pid` (started elsewhere, e.g. by asyncio, in a session of its own)
        and clean up the matches in `db` at teardown."""
        self.pids.append(pid)
        if db is not None:
            self.dbs.append(db)

    def match_ids(self) -> set[str]:
        found: set[str] = set()
        for db in self.dbs:
            if not db.exists():
                continue
            with contextlib.suppress(sqlite3.Error), contextlib.closing(sqlite3.connect(db)) as c:
                found |= {row[0] for row in c.execute("SELECT DISTINCT match_id FROM events")}
        return found

    def end(self) -> None:
        """SIGKILL every process group still there, then remove whatever the matches of the
        logs left (hosts, disks, cages): a killed controller never removed its own."""
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for process in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
        ids = self.match_ids()
        leaks.MATCH_IDS.update(ids)
        left = leaks.leftovers(ids)
        if left:
            leaks.remove(left)


@pytest.fixture
def arena_runs() -> Iterator[ArenaRuns]:
    """Start `opsarena` processes through this: each is killed, and what its matches left
    is removed, when the test ends however it ends."""
    runs = ArenaRuns()
    try:
        yield runs
    finally:
        runs.end()


@pytest.fixture
def match_id() -> str:
    return new_match_id()


@pytest.fixture
def podman_driver() -> HostDriver:
    return get_driver("podman")


@pytest.fixture
async def host_factory(podman_driver: HostDriver, match_id: str) -> AsyncIterator[HostFactory]:
    """`await host_factory("territory")` boots a host; all are removed at teardown."""

    async def make(territory: str = "a", **spec: object) -> Host:
        return await podman_driver.create(
            HostSpec(match_id=match_id, territory=territory, image=TEST_IMAGE, **spec)  # type: ignore[arg-type]
        )

    try:
        yield make
    finally:
        await asyncio.shield(podman_driver.cleanup(match_id=match_id))


@pytest.fixture
def opsarena_serve(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`opsarena serve` on a free port, as a subprocess: (its URL, its database)."""
    db = tmp_path / "live.db"
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "opsarena.cli.main", "serve", "--port", "0", "--db", str(db)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (found := re.findall(r"http://127\.0\.0\.1:\d+", log_path.read_text())):
            assert server.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "opsarena serve did not listen within 30s"
            time.sleep(0.1)
        yield found[0], db
    finally:
        server.terminate()
        server.wait(10)


def wait_for_event(db: Path, event_type: str, timeout: float = 120) -> str:
    """The match id of the first event of `event_type` in `db`, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.exists():
            with sqlite3.connect(db) as conn:
                try:
                    row = conn.execute(
                        "SELECT match_id FROM events WHERE type = ? LIMIT 1", (event_type,)
                    ).fetchone()
                except sqlite3.OperationalError:
                    row = None
            if row:
                return str(row[0])
        time.sleep(0.2)
    raise AssertionError(f"no {event_type} event within {timeout}s")


SharedHosts = Callable[..., Awaitable[Host]]


@pytest.fixture(scope="module")
async def shared_hosts() -> AsyncIterator[SharedHosts]:
    """`await shared_hosts("territory", **spec)` boots that territory's host once per
    module and returns the same host to every later call; all are removed at the end.
    Booting a host costs about a second: cases that only read a host's state share one;
    cases that damage a host (fork bomb, memory hog, disk fill) get their own territory."""
    driver = get_driver("podman")
    match_id = new_match_id("hard")
    made: dict[str, Host] = {}
    lock = asyncio.Lock()

    async def get(territory: str, **spec: object) -> Host:
        async with lock:
            if territory not in made:
                made[territory] = await driver.create(
                    HostSpec(match_id=match_id, territory=territory, image=TEST_IMAGE, **spec)  # type: ignore[arg-type]
                )
            return made[territory]

    try:
        yield get
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))
