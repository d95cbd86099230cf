"""Store kinds are plug-ins: `store.kinds.STORES`, keyed by URL scheme (`file` for a path),
extended through the `opsarena.stores` entry point group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from opsarena.errors import RegistryError, StoreError
from opsarena.store import (
    FILE_KIND,
    STORES,
    EventStore,
    SqliteEventStore,
    open_store,
    resolve_target,
    store_kind,
)

PLUGIN = '''
from urllib.parse import urlsplit

from opsarena.store import STORES, SqliteEventStore


class ThirdPartyStore(SqliteEventStore):
    """A store of another package: here an SQLite file named by a `thirdparty://` URL."""


def _open(target, read_only):
    return ThirdPartyStore(urlsplit(target).path, read_only=read_only)


STORES.register("thirdparty", _open)
'''


def test_the_kind_is_the_url_scheme_or_file_for_a_path(tmp_path: Path) -> None:
    assert store_kind(tmp_path / "x.db") == FILE_KIND
    assert store_kind("relative/postgresql://x") == FILE_KIND
    assert store_kind("  PostgreSQL://h/db ") == "postgresql"
    assert resolve_target("  PostgreSQL://h/db ") == "postgresql://h/db"
    assert store_kind("postgres://h/db") == "postgres"
    assert {FILE_KIND, "postgres", "postgresql"} <= set(STORES.names())


def _open_kindtest(target: str, read_only: bool) -> EventStore:
    return SqliteEventStore(urlsplit(target).path, read_only=read_only)


def test_a_registered_kind_is_opened_by_its_scheme_and_a_name_is_taken_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k.db"
    STORES.register("kindtest", _open_kindtest)
    with open_store(f" KindTest://{path} ") as store:
        assert isinstance(store, SqliteEventStore) and store.path == path
    with pytest.raises(RegistryError, match="'kindtest' is registered already"):
        STORES.register("kindtest", SqliteEventStore)
    with pytest.raises(StoreError, match=r"no event store for nokind://x: .*kindtest://"):
        open_store("nokind://x")


def test_a_store_of_another_package_is_found_through_its_entry_point(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "thirdparty_store").mkdir(parents=True)
    (site / "thirdparty_store" / "__init__.py").write_text(PLUGIN)
    info = site / "thirdparty_store-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-store\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[opsarena.stores]\nthirdparty = thirdparty_store\n")
    db = tmp_path / "third.db"
    env = {k: v for k, v in os.environ.items() if k != "OPSARENA_DB"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])

    def opsarena(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "opsarena.cli.main", *args],
            env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip

    migrated = opsarena("db", "migrate", "--db", f"thirdparty://{db}")
    assert migrated.returncode == 0, migrated.stderr
    with SqliteEventStore(db) as store:  # the plug-in made a real event log there
        store.append_blocking("tp1", "match_created", {}, 0)
    listed = opsarena("events", "tp1", "--db", f"thirdparty://{db}")
    assert listed.returncode == 0 and "match_created" in listed.stdout, listed.stderr
    unknown = opsarena("ls", "--db", "nokind://x")
    assert unknown.returncode == 2 and "thirdparty://" in unknown.stderr, unknown.stderr
