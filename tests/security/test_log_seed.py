"""Red team: a competitor hunting the seed while its match runs gets nothing.

A real match on real hosts: `hunter`, a command agent, looks for the seed everywhere a
competitor can reach (its environment, the log file's bytes, `opsarena show`/`events`/`ls`,
the live API and its stream, the page, every process's argv and environment) while
`ref` plays the reference builder to a durable deployment. After the close the record
reveals the seed: it must be nowhere in the loot, it must open the commitment the hunter
saw, and `opsarena verify` passes.

The hunter runs in the agent cage (its own uid, no network, no view of the log or the
checkout: docs/SECURITY.md), so most doors are shut to it; it reports what it found on its
own stdout, which the log keeps. The doors a competitor's cage does not shut are hunted by
the test itself from outside, as the worst case: the live API, its stream and the page,
polled while the match runs. `tests/store/test_tamper.py` shows another uid can read
neither the log nor the vault.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
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
    url = server.start()
    (work / "url").write_text(url)
    (work / "db").write_text(str(db))
    os.chmod(work, 0o755)
    for name in ("hunter.py", "url", "db"):
        os.chmod(work / name, 0o644)
    outside: list[str] = []
    try:
        run = subprocess.Popen(
            [*OPSARENA, "run", "--quiet", "--db", str(db), "--time-limit", "120",
             "--drain", "30",
             "--builder", f"hunter=command:/usr/bin/python3 {work / 'hunter.py'} {work}",
             "--builder", "ref=scripted:reference"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            outside = _hunt_the_api(url, db, run)
            out, err = run.communicate(timeout=600)
        finally:
            if run.poll() is None:
                run.kill()
    finally:
        server.stop()
    played = subprocess.CompletedProcess(run.args, run.returncode, out, err)
    assert played.returncode == 0, played.stderr
    match_id = _match_id(db)
    record = json.loads(cli("show", "--db", str(db), "--json", match_id).stdout)
    assert record["match_state"] == "finished" and record["winner"] == "ref"
    seed, nonce, commitment = record["seed"], record["seed_nonce"], record["seed_commitment"]
    preimage = f"opsarena-seed-v1:{record['match_id']}:{nonce}:{seed}"
    assert hashlib.sha256(preimage.encode()).hexdigest() == commitment

    # From outside, while it ran: the API showed the commitment, never the seed.
    seen = "\n".join(outside)
    assert outside and commitment in seen, seen[:2000]
    assert '"match_state":"finished"' not in seen.replace(" ", "")  # polled while it ran
    assert seed not in seen and seed.upper() not in seen
    # From inside the cage: the hunter ran and found no trace of the seed either.
    events = json.loads("[" + ",".join(cli("events", match_id, "--json", "--db", str(db))
                                       .stdout.split("\n")[:-1]) + "]")  # fmt: skip
    loot = "\n".join(
        e["data"]["text"]
        for e in events
        if e["type"] == "agent_output" and e["data"].get("agent", "").startswith("hunter")
    )
    assert "looted" in loot, loot[:2000]
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


def _hunt_the_api(url: str, db: Path, run: subprocess.Popen[str]) -> list[str]:
    """What the live API, its stream and the page say while the match runs, polled from
    outside the cage; a round of polls counts only when the match was still running
    after it (the seed is revealed, rightly, once the match closes)."""
    import httpx

    def state(match: str) -> str:
        return str(httpx.get(f"{url}/api/matches/{match}", timeout=10).json()["match_state"])

    seen: list[str] = []
    deadline = time.monotonic() + 300
    while run.poll() is None and time.monotonic() < deadline:
        try:
            listed = httpx.get(f"{url}/api/matches", timeout=10).json()
        except (httpx.HTTPError, ValueError):
            time.sleep(0.5)
            continue
        for row in listed:
            match, round_ = row["match_id"], []
            with contextlib.suppress(httpx.HTTPError):
                for path in (f"/api/matches/{match}", f"/api/matches/{match}/events",
                             f"/matches/{match}"):  # fmt: skip
                    round_.append(httpx.get(f"{url}{path}", timeout=10).text)
                until = time.monotonic() + 2.0  # a live stream never ends by itself
                with httpx.stream("GET", f"{url}/api/matches/{match}/stream",
                                  timeout=3) as stream:  # fmt: skip
                    for line in stream.iter_lines():
                        round_.append(line)
                        if time.monotonic() > until:
                            break
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                if state(match) == "running":
                    seen.extend(round_)
        time.sleep(1)
    return seen


def _match_id(db: Path) -> str:
    listed = cli("ls", "--db", str(db))
    return listed.stdout.splitlines()[1].split()[0]
