"""Every command with `--db` opens a PostgreSQL URL through `store.open_store`, the one
function that picks the store kind, however the URL is spelt (`POSTGRESQL://`, blanks
around it, `$OPSARENA_DB`), against a real PostgreSQL server; a URL no store kind takes is
one line and exit 2, never an SQLite file named after it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsarena.store import open_store
from opsarena.web.readonly import open_read_only
from tests.match.test_commitment import SEED, committed_events
from tests.pg import new_database, postgres_for_tests

MATCH = "pgv1"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with postgres_for_tests() as url:
        yield url


@pytest.fixture(scope="module")
def url(server: str) -> str:
    """A database holding one finished match with its seed commitment."""
    database = new_database(server)
    with open_store(database) as store:
        for event in committed_events(MATCH):
            store.append_blocking(  # type: ignore[attr-defined]
                MATCH, event["type"], event["data"], event["t_ms"], wall=event["wall"]
            )
    return database


def spelt(url: str) -> str:
    """`url` as a user may well type it: the scheme in capitals, blanks around it."""
    scheme, rest = url.split("://", 1)
    return f"  {scheme.upper()}://{rest} "


def opsarena(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "OPSARENA_DB"}
    return subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", *args],
        env={**base, "COLUMNS": "250", **(env or {})},
        cwd=cwd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize("how", ["url", "spelt", "env"])
def test_verify_checks_a_match_in_postgresql(url: str, how: str, tmp_path: Path) -> None:
    if how == "env":
        out = opsarena("verify", MATCH, cwd=tmp_path, env={"OPSARENA_DB": spelt(url)})
    else:
        out = opsarena("verify", MATCH, "--db", url if how == "url" else spelt(url), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    [line] = out.stdout.splitlines()
    assert line.startswith(f"match {MATCH}: {len(committed_events(MATCH))} events, hash chain")
    assert line.endswith(f"revealed seed {SEED.hex()} matches its commitment")
    assert list(tmp_path.iterdir()) == []  # no SQLite file named after the URL


def test_every_db_command_reads_the_match_from_postgresql(url: str, tmp_path: Path) -> None:
    db = spelt(url)
    shown = opsarena("show", MATCH, "--json", "--db", db, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["match_id"] == MATCH
    events = opsarena("events", MATCH, "--json", "--db", db, cwd=tmp_path)
    assert events.returncode == 0, events.stderr
    assert len(events.stdout.splitlines()) == len(committed_events(MATCH))
    listed = opsarena("ls", "--db", db, cwd=tmp_path)
    assert listed.returncode == 0 and MATCH in listed.stdout, listed.stderr
    # Commands that refuse a finished match can only say so having read it.
    resumed = opsarena("resume", MATCH, "--db", db, cwd=tmp_path)
    assert resumed.returncode == 2 and f"match {MATCH} is finished already" in resumed.stderr
    territory = next(iter(json.loads(shown.stdout)["territories"]))
    done = opsarena("done", MATCH, territory, "--db", db, cwd=tmp_path)
    assert done.returncode == 2 and f"match {MATCH} is finished" in done.stderr
    migrated = opsarena("db", "migrate", "--db", db, cwd=tmp_path)
    assert migrated.returncode == 0 and "schema version" in migrated.stdout, migrated.stderr
    tournaments = opsarena("tournament", "ls", "--db", db, cwd=tmp_path)
    assert tournaments.returncode == 0 and tournaments.stdout.startswith("tournament"), (
        tournaments.stderr
    )
    board = opsarena("leaderboard", "--json", "--db", db, cwd=tmp_path)
    assert board.returncode == 0 and isinstance(json.loads(board.stdout), list), board.stderr
    assert list(tmp_path.iterdir()) == []
    # `opsarena serve` opens its log this way (a long-running server: opened in process).
    with open_read_only(db) as store:
        assert [s.match_id for s in asyncio.run(store.list_matches())] == [MATCH]


@pytest.mark.parametrize(
    ("command", "db", "named"),
    [
        (
            ("verify", MATCH),
            "mysql://arena@db.invalid/opsarena",
            "mysql://arena@db.invalid/opsarena",
        ),
        (("ls",), "postgresql+psycopg://u:secret@h/db", "postgresql+psycopg://u:***@h/db"),
        (("db", "migrate"), "file:///var/lib/opsarena.db", "file:///var/lib/opsarena.db"),
    ],
)
def test_a_db_url_no_store_takes_is_one_line_exit_2(
    command: tuple[str, ...], db: str, named: str, tmp_path: Path
) -> None:
    out = opsarena(*command, "--db", db, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"no event store for {named}: --db takes an SQLite file's path" in out.stderr
    assert "postgresql://" in out.stderr and "secret" not in out.stderr
    assert list(tmp_path.iterdir()) == []  # nothing created, under any name
