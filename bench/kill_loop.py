"""Crash loop: SIGKILL the controller at a random moment, resume, check the log.

Run: `python bench/kill_loop.py [--rounds 10] [--json bench/results/kill_loop.json]`.
Each round starts `opsarena run` with two scripted builders and a command agent that
ignores SIGTERM (so the 4 s drain is always there to be killed in), kills it with
SIGKILL at a random moment between its first event and 13 s in, then runs
`opsarena resume`. Counted: events committed before the kill and missing after (must
be 0), sequence gaps and duplicates (0), records that do not fold (0), containers
left (0), agent processes left (0).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from opsarena.errors import OpsArenaError
from opsarena.match.fold import fold_events
from opsarena.store import SqliteEventStore

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]


def rows(db: Path, match_id: str) -> list[tuple[int, str, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT seq, type, data FROM events WHERE match_id = ? ORDER BY seq", (match_id,)
        ).fetchall()


def first_match(db: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.exists():
            try:
                with sqlite3.connect(db) as conn:
                    row = conn.execute("SELECT match_id FROM events LIMIT 1").fetchone()
            except sqlite3.OperationalError:
                row = None
            if row:
                return str(row[0])
        time.sleep(0.05)
    raise RuntimeError("the match never logged an event")


def containers(match_id: str) -> list[str]:
    out = subprocess.run(
        ["podman", "ps", "--all", "--filter", f"label=opsarena.match={match_id}",
         "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.split()


def agent_processes(program: Path) -> list[str]:
    found = subprocess.run(["pgrep", "-f", str(program)], capture_output=True, text=True)
    return found.stdout.split()


def one_round(workdir: Path, rng: random.Random, index: int) -> dict[str, Any]:
    db = workdir / f"round{index}.db"
    stubborn = workdir / f"stubborn{index}.sh"
    stubborn.write_text("#!/bin/sh\ntrap '' TERM\nsleep 600\n")
    stubborn.chmod(0o755)
    process = subprocess.Popen(
        [*OPSARENA, "run", "--quiet", "--db", str(db), "--time-limit", "120", "--drain", "4",
         "--builder", "a=scripted:reference", "--builder", "b=scripted:volatile",
         "--builder", f"c=command:{stubborn}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    match_id = first_match(db)
    delay = rng.uniform(0.2, 13.0)  # a demo-sized match finishes after ~8-9 s, then drains 4 s
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    before = rows(db, match_id)
    resumed = subprocess.run(
        [*OPSARENA, "resume", match_id, "--quiet", "--db", str(db)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    after = rows(db, match_id)
    seqs = [seq for seq, _, _ in after]
    with SqliteEventStore(db) as store:
        try:
            record = fold_events(store.read_blocking(match_id))
            folded, state, reason = True, record.match_state, record.finish_reason
        except OpsArenaError as exc:
            folded, state, reason = False, "unfoldable", str(exc)
    left = containers(match_id)
    orphans = agent_processes(stubborn)
    subprocess.run([*OPSARENA, "hosts", "cleanup", "--match", match_id], capture_output=True)
    subprocess.run(["pkill", "-KILL", "-f", str(stubborn)], capture_output=True)
    return {
        "round": index,
        "killed_after_s": round(delay, 2),
        "last_event_before_kill": before[-1][1] if before else None,
        "events_before_kill": len(before),
        "events_lost": len(set(before) - set(after)),
        "gaps": sum(1 for a, b in itertools.pairwise(seqs) if b != a + 1),
        "duplicates": len(seqs) - len(set(seqs)),
        "resume_exit": resumed.returncode,
        "resume_error": resumed.stderr.strip().splitlines()[-1:] if resumed.returncode else [],
        "folds": folded,
        "match_state": state,
        "finish_reason": reason,
        "containers_left_after_resume": len(left),
        "agent_processes_left_after_resume": len(orphans),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--json", type=Path, default=Path("bench/results/kill_loop.json"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        results = [one_round(Path(tmp), rng, i) for i in range(args.rounds)]
    summary = {
        "rounds": len(results),
        "events_lost": sum(r["events_lost"] for r in results),
        "gaps": sum(r["gaps"] for r in results),
        "duplicates": sum(r["duplicates"] for r in results),
        "unfoldable": sum(1 for r in results if not r["folds"]),
        "not_finished": sum(1 for r in results if r["match_state"] != "finished"),
        "containers_leaked": sum(r["containers_left_after_resume"] for r in results),
        "agent_processes_leaked": sum(r["agent_processes_left_after_resume"] for r in results),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for result in results:
        print(json.dumps(result))
    print(json.dumps(summary, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"summary": summary, "rounds": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
