"""Red team: a competitor hunting the seed while its match runs gets nothing.

A real match on real hosts: `hunter`, a command agent, looks for the seed everywhere a
competitor can reach (its environment, the log file's bytes, `opsarena show`/`events`/`ls`,
the live API and its stream, the page, every process's argv and environment) while
`ref` plays the reference builder to a durable deployment. After the close the record
reveals the seed: it must be nowhere in the loot, it must open the commitment the hunter
saw, and `opsarena verify` passes.

The hunter runs as the arena's user until the agent cage drops it to its own uid
(docs/SECURITY.md); `tests/store/test_tamper.py` shows another uid can read neither the log
nor the vault, so the vault is not hunted here.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from opsarena.web import ScoreboardServer
from tests.security.hunters import SEED_HUNTER

pytestmark = pytest.mark.hosts

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OPSARENA, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_seed_is_nowhere_a_competitor_looks_until_the_match_closes(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    work = tmp_path / "hunter"
    work.mkdir()
    (work / "hunter.py").write_text(SEED_HUNTER)
    server = ScoreboardServer(db, port=0)
    (work / "url").write_text(server.start())
    (work / "db").write_text(str(db))
    try:
        played = cli(
            "run", "--quiet", "--db", str(db), "--time-limit", "120", "--drain", "30",
            "--builder", f"hunter=command:{sys.executable} {work / 'hunter.py'} {work}",
            "--builder", "ref=scripted:reference",
        )  # fmt: skip
    finally:
        server.stop()
    assert played.returncode == 0, played.stderr
    record = json.loads(cli("show", "--db", str(db), "--json", _match_id(db)).stdout)
    assert record["match_state"] == "finished" and record["winner"] == "ref"
    seed, nonce, commitment = record["seed"], record["seed_nonce"], record["seed_commitment"]
    preimage = f"opsarena-seed-v1:{record['match_id']}:{nonce}:{seed}"
    assert hashlib.sha256(preimage.encode()).hexdigest() == commitment

    loot = (work / "loot").read_text()
    # The hunter did reach the log, the CLI and the API while the match ran...
    assert loot.count(commitment) >= 6, loot[:2000]
    assert '"match_state": "running"' in loot or '"match_state":"running"' in loot
    assert "FAILED" not in loot.split("== processes")[0], "a door the test meant open was shut"
    # ... and found no trace of the seed anywhere.
    assert seed not in loot and seed.upper() not in loot
    # The CLI shows it only in the summary it prints after the close.
    assert seed not in played.stderr
    summary = played.stdout.index(f"match {record['match_id']}: durable-records")
    assert played.stdout.index(seed) > summary

    verified = cli("verify", record["match_id"], "--db", str(db))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"revealed seed {seed} matches its commitment" in verified.stdout
    # Revealed and checked: the vault has let go of it.
    assert not (Path(f"{db}-secrets") / f"{record['match_id']}.json").exists()


def _match_id(db: Path) -> str:
    listed = cli("ls", "--db", str(db))
    return listed.stdout.splitlines()[1].split()[0]
