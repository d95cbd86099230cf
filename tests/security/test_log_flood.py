"""Red team, a competitor against the log and the controller (issue 23, items 4 to 6), in
a whole match on real hosts with the real controller and SQLite log, next to an honest
neighbour that must still win:

- commands that are not UTF-8 (a `\\xff` in an exec and in a put's path): each is
  recorded before it runs, or refused; never run unrecorded;
- output floods (`cat /dev/zero`, twice at once): each exec is ended at the output limit,
  not read away until its timeout;
- a loop of 127 000-byte commands of control characters: each field reaches the log
  clipped (with the SHA-256 of the whole), and past the agent's log budget its events are
  counted, not stored.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from opsarena.agents.competitors import competitor_from_cli
from opsarena.challenges.catalog import find_challenge
from opsarena.hosts import get_driver
from opsarena.match.controller import Controller, MatchPlan
from opsarena.store import SqliteEventStore
from tests.agents.contexts import script
from tests.conftest import new_match_id, podman_names

pytestmark = pytest.mark.hosts

BIG = 127_000
ROUNDS = 40


async def test_unloggable_commands_floods_and_huge_commands_cost_the_arena_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    flooder = script(
        tmp_path / "flood.sh",
        f"""
        #!/bin/bash
        $OPSARENA_EXEC $'echo ran > /tmp/ff-exec-\\xff'; echo "ff exec $?"
        echo data > "$TMPDIR/f"; $OPSARENA_PUT "$TMPDIR/f" $'/tmp/ff-put-\\xff'; echo "ff put $?"
        $OPSARENA_EXEC 'cat /dev/zero' > /dev/null & first=$!
        $OPSARENA_EXEC 'cat /dev/zero' > /dev/null; echo "zero $?"
        wait $first; echo "zero $?"
        big=$(head -c {BIG} /dev/zero | tr '\\0' '\\1')
        for i in $(seq 1 {ROUNDS}); do $OPSARENA_EXEC ": $big" || echo "big $?"; done
        echo "flooded"
        """,
    )
    competitors = {"reference": "scripted:reference", "flooder": f"command:{flooder}"}
    plan = MatchPlan(
        challenge=find_challenge("durable-records"),
        competitors=[competitor_from_cli(t, a) for t, a in competitors.items()],
        time_limit_s=240.0,
        finish="all",
        match_id=new_match_id("red"),
        drain_s=2.0,
        log_budget_mb=1,
    )
    caplog.set_level(logging.ERROR, logger="asyncio")
    try:
        with SqliteEventStore(tmp_path / "log.db") as store:
            record = await Controller(plan, store).run()
            events = await store.read(plan.match_id)
    finally:
        await get_driver("podman").cleanup(match_id=plan.match_id)

    assert record.winner == "reference"
    assert record.territories["reference"].milestone_points == 100
    mine = [e for e in events if e.data.get("agent") == "flooder"]
    out = "".join(e.data["text"] for e in mine if e.type == "agent_output")
    transcript = [e.data["entry"] for e in mine if e.type == "agent_transcript"]

    # 5: a command or path that is not UTF-8 was recorded before it ran (or refused).
    ff_exec = [e for e in transcript if "/tmp/ff-exec-\\xff" in e.get("command", "")]
    if "ff exec 0" in out:
        assert [e["kind"] for e in ff_exec] == ["exec_request", "exec"], ff_exec
    else:
        assert "ff exec 2" in out and not [e for e in ff_exec if e["kind"] == "exec"], out
    ff_put = [e for e in transcript if "/tmp/ff-put-\\xff" in e.get("path", "")]
    if "ff put 0" in out:
        assert [e["kind"] for e in ff_put] == ["put_request", "put"], ff_put
    else:
        assert "ff put 2" in out and not [e for e in ff_put if e["kind"] == "put"], out
    for index, entry in enumerate(transcript):  # no result without its request before
        if entry.get("kind") in ("exec", "put"):
            key = "command" if entry["kind"] == "exec" else "path"
            requests = [
                e for e in transcript[:index] if e.get("kind") == f"{entry['kind']}_request"
            ]
            assert any(e[key] == entry[key] for e in requests), entry
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]

    # 6: each flood was ended at the output limit (SIGKILL: 137), not run to its timeout.
    assert out.count("zero 137") == 2, out
    zeros = [e for e in transcript if e.get("kind") == "exec" and e["command"] == "cat /dev/zero"]
    assert len(zeros) == 2 and all(e["output_cut"] and e["exit_code"] == 137 for e in zeros)

    # 4: huge commands reach the log clipped, with the whole command's length and hash...
    whole = ": " + "\x01" * BIG
    digest = hashlib.sha256(whole.encode()).hexdigest()
    huge = [e for e in transcript if e.get("command", "").startswith(": \x01")]
    assert huge and all(f"{len(whole)} bytes in all, sha256 {digest}" in e["command"] for e in huge)
    assert max(len(json.dumps(e.data)) for e in mine) < 64 * 1024
    # ... and past the agent's budget they are counted, not stored; the neighbour's are.
    stored = sum(len(json.dumps(e.data, separators=(",", ":"), ensure_ascii=False)) for e in mine)
    assert stored <= 1024 * 1024 + 4096, stored
    assert [e["kind"] for e in transcript].count("log_budget_spent") == 1
    agent = record.agents[record.territories["flooder"].agent]
    assert agent.log_events_dropped > 0 and agent.log_bytes_dropped > 0, agent
    assert "flooded" not in out or agent.log_events_dropped >= 2 * ROUNDS - len(huge)
    assert record.agents[record.territories["reference"].agent].log_events_dropped == 0
    assert podman_names(plan.match_id) == []
