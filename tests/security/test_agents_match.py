"""Red team, competitor programs in a whole match: a fork bomb, a memory hog and a program
that tries to end a person's session, next to an honest neighbour that must still win.

The hostile programs are planted exactly as competitors would give them (`command:` in
the match's plan); the match runs on real hosts with the real controller, referee and
SQLite log, and everything is judged from the record and the log afterwards.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from opsarena.agents.cage import DEFAULT_LIMITS
from opsarena.agents.competitors import competitor_from_cli
from opsarena.challenges.catalog import find_challenge
from opsarena.hosts import get_driver
from opsarena.match.controller import Controller, MatchPlan
from opsarena.store import SqliteEventStore
from tests.agents.contexts import script
from tests.conftest import new_match_id, podman_names

pytestmark = pytest.mark.hosts

MIB = 1024 * 1024


async def test_a_fork_bomb_a_memory_hog_and_a_forged_done_leave_the_neighbour_to_win(
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    bomb = script(
        tmp_path / "bomb.sh",
        """
        #!/bin/bash
        echo "bombing"
        bomb() { bomb | bomb & }
        bomb
        sleep 600
        """,
    )
    hog = script(
        tmp_path / "hog.py",
        """
        #!/usr/bin/python3
        chunks = []
        for i in range(64):  # 4 GiB, touched page by page
            chunks.append(b"\\x01" * (64 << 20))
            print(f"holding {(i + 1) * 64} MiB", flush=True)
        """,
    )
    opsarena = Path(sys.executable).parent / "opsarena"
    doner = script(
        tmp_path / "doner.sh",
        f"""
        #!/bin/bash
        for cli in {opsarena} opsarena; do
          OPSARENA_DONE_TOKEN=guess "$cli" done "$OPSARENA_MATCH" victim --db {db}
          echo "cli $?"
        done
        OPSARENA_DB={db} python3 -m opsarena done "$OPSARENA_MATCH" victim; echo "module $?"
        python3 -c 'import sqlite3; c = sqlite3.connect("{db}"); c.execute("select 1 from events")'
        echo "sqlite $?"
        """,
    )
    competitors = {
        "reference": "scripted:reference",
        "bomb": f"command:{bomb}",
        "hog": f"command:{hog}",
        "doner": f"command:{doner}",
        "victim": "human",
    }
    plan = MatchPlan(
        challenge=find_challenge("durable-records"),
        competitors=[competitor_from_cli(t, a) for t, a in competitors.items()],
        time_limit_s=240.0,
        match_id=new_match_id("red"),
        drain_s=2.0,
    )
    try:
        with SqliteEventStore(db) as store:
            record = await Controller(plan, store).run()
            events = await store.read(plan.match_id)
    finally:
        await get_driver("podman").cleanup(match_id=plan.match_id)

    assert (record.winner, record.finish_reason) == ("reference", "first durable deployment")
    assert record.territories["reference"].milestone_points == 100

    def output(agent: str) -> str:
        return "".join(
            e.data["text"] for e in events if e.type == "agent_output" and e.data["agent"] == agent
        )

    assert "bombing" in output("bomb")
    assert re.search(r"fork|Resource temporarily unavailable", output("bomb")), output("bomb")
    held = [int(n) for n in re.findall(r"holding (\d+) MiB", output("hog"))]
    assert held and max(held) * MIB <= DEFAULT_LIMITS.memory_bytes, held
    hog_agent = record.agents[record.territories["hog"].agent]
    assert hog_agent.terminal_state == "failed", hog_agent

    doner_out = output("doner")
    assert re.findall(r"^(?:cli|module|sqlite) (\d+)$", doner_out, re.M) == ["127"] * 2 + ["1"] * 2
    assert not [e for e in events if e.type in ("done_requested", "competitor_done")]
    assert record.territories["victim"].done_by is None
    victim_agent = record.agents[record.territories["victim"].agent]
    assert "declared done" not in (victim_agent.terminal_detail or "")

    assert subprocess.run(["true"], check=False).returncode == 0, "the arena can still fork"
    assert podman_names(plan.match_id) == []
