"""Shared by the scoreboard tests: one real match per session, and the server serving it.

`played` runs `opsarena demo` (four scripted builders on real podman hosts, about 10 s)
once per session into its own event log; `scoreboard` serves that log over real HTTP on a
free loopback port, from a background thread, exactly as `opsarena run --serve` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from opsarena.store import SqliteEventStore
from opsarena.web import ScoreboardServer


@dataclass(frozen=True)
class Played:
    db: Path
    match_id: str


def opsarena(*args: str, db: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the `opsarena` CLI of this interpreter against `db`."""
    env = {**os.environ, "OPSARENA_DB": str(db)}
    return subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="session")
def played(tmp_path_factory: pytest.TempPathFactory) -> Played:
    """A finished real match (the demo) alone in a fresh event log."""
    db = tmp_path_factory.mktemp("web") / "played.db"
    done = opsarena("demo", "--quiet", db=db)
    assert done.returncode == 0, done.stderr
    listed = opsarena("ls", db=db)
    match_id = listed.stdout.splitlines()[1].split()[0]
    record = json.loads(opsarena("show", match_id, "--json", db=db).stdout)
    assert record["match_state"] == "finished"
    return Played(db, match_id)


@contextlib.contextmanager
def serving(db: Path, events: list[dict[str, Any]]) -> Iterator[str]:
    """A scoreboard (its base URL) serving `db` filled with `events` (envelopes as
    `tests.match.simulated.simulate` makes them)."""
    with SqliteEventStore(db) as store:
        for event in events:
            store.append_blocking(
                event["match_id"], event["type"], event["data"], event["t_ms"], wall=event["wall"]
            )
    server = ScoreboardServer(db, port=0)
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def scoreboard(played: Played) -> Iterator[str]:
    """The base URL of a scoreboard serving `played`'s event log."""
    server = ScoreboardServer(played.db, port=0)
    url = server.start()
    try:
        yield url
    finally:
        server.stop()
