"""Agent kinds declare their capabilities where they register; the controller and the CLI
ask for them (`has_done_token`, `runs_in_cage`) and name no kind."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from opsarena.agents.cage import CageLimits, ProcessCage
from opsarena.agents.competitors import competitor_from_cli
from opsarena.agents.human import HumanAgent
from opsarena.agents.registry import (
    has_done_token,
    register_agent_kind,
    remove_cages,
    runs_in_cage,
)
from opsarena.challenges.catalog import find_challenge
from opsarena.cli.run import _announce_humans
from opsarena.match.controller import MatchPlan
from tests.conftest import new_match_id

register_agent_kind(
    "test-pager-person", lambda spec, settings, env: HumanAgent(), arg=None, done_token=True
)


def test_the_built_in_kinds_declare_what_they_are() -> None:
    assert [k for k in ("scripted", "command", "llm", "human") if has_done_token(k)] == ["human"]
    assert [k for k in ("scripted", "command", "llm", "human") if runs_in_cage(k)] == ["command"]
    assert not has_done_token("no-such-kind") and not runs_in_cage("no-such-kind")


def test_a_plug_in_kind_with_a_done_token_is_announced_its_token(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What the kind declared, not its name, gets a person the token (`opsarena run`)."""
    assert has_done_token("test-pager-person") and not runs_in_cage("test-pager-person")
    plan = MatchPlan(
        challenge=find_challenge("durable-records"),
        competitors=[
            competitor_from_cli("pat", "test-pager-person"),
            competitor_from_cli("bot", "scripted:idle"),
        ],
        time_limit_s=60.0,
    )
    _announce_humans(plan)
    printed = capsys.readouterr().err
    assert f"OPSARENA_DONE_TOKEN={plan.done_token('pat')} opsarena done" in printed
    assert "bot:" not in printed


@pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups needs root")
def test_remove_cages_kills_and_removes_what_a_matchs_agents_left() -> None:
    match_id = new_match_id("cages")
    cage = ProcessCage.create(match_id, "t", CageLimits(pids=8))
    sleeper: subprocess.Popen[bytes] | None = None
    try:
        sleeper = subprocess.Popen(cage.wrap(["sleep", "100"]))
        deadline = time.monotonic() + 10
        while sleeper.pid not in cage.pids():  # the wrapper moves itself in, then execs
            assert time.monotonic() < deadline, "the sleeper never entered its cage"
            time.sleep(0.02)
        assert remove_cages(match_id) == 1
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert ProcessCage.of_match(match_id) == []
        assert remove_cages(match_id) == 0
    finally:
        if sleeper is not None:
            sleeper.kill()
        cage.remove()
