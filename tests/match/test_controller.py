"""Whole matches on real hosts: the controller, referee, agents and log together."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsarena.agents import Agent, AgentContext, AgentOutcome
from opsarena.agents.competitors import competitor_from_cli
from opsarena.agents.registry import register_agent_kind
from opsarena.challenges.catalog import find_challenge
from opsarena.errors import MatchError
from opsarena.match.controller import Controller, MatchPlan
from opsarena.match.fold import fold_events
from opsarena.store import SqliteEventStore
from tests.conftest import ArenaRuns, new_match_id, podman_names, wait_for_event
from tests.match.seed_record import incompatibilities

pytestmark = pytest.mark.hosts


def plan_of(builders: dict[str, str], **extra: object) -> MatchPlan:
    return MatchPlan(
        challenge=find_challenge("durable-records"),
        competitors=[competitor_from_cli(t, a) for t, a in builders.items()],
        time_limit_s=float(extra.pop("time_limit_s", 150.0)),  # type: ignore[arg-type]
        match_id=new_match_id("m"),
        drain_s=2.0,
        **extra,  # type: ignore[arg-type]
    )


async def test_full_match_record_matches_each_builder(tmp_path: Path) -> None:
    plan = plan_of(
        {
            "reference": "scripted:reference",
            "in-memory": "scripted:in-memory",
            "not-enabled": "scripted:not-enabled",
            "idle": "scripted:idle",
        },
        finish="all",  # judge every builder to its end, not only up to the first durable one
    )
    with SqliteEventStore(tmp_path / "log.db") as store:
        record = await Controller(plan, store).run()
        events = await store.read(plan.match_id)

    assert record.match_state == "finished"
    assert (record.finish_reason, record.winner) == ("all competitors finished", "reference")
    points = {name: t.milestone_points for name, t in record.territories.items()}
    assert points == {"reference": 100, "in-memory": 30, "not-enabled": 60, "idle": 0}
    reference = record.territories["reference"]
    assert reference.competitor_state == "durable" and reference.durable_at_ms is not None
    assert reference.milestones["host-reboot"].evidence is not None
    assert reference.milestones["host-reboot"].evidence["reboot"] is True
    assert record.territories["in-memory"].milestones["service-restart"].failure_reason == (
        "record_missing"
    )
    assert record.territories["idle"].milestones["service-up"].failure_reason == (
        "connection_refused"
    )
    # The first reboot left the service down; later attempts find it refused at once.
    first_reboot = next(
        e.data
        for e in events
        if e.type == "attempt_result"
        and (e.data["territory"], e.data["milestone"], e.data["attempt"])
        == ("not-enabled", "host-reboot", 1)
    )
    assert first_reboot["failure_reason"] == "not_ready_after_fault"
    for name, territory in record.territories.items():
        assert territory.state == "removed", name
        assert territory.resources == 1
        assert not any(m.evaluating for m in territory.milestones.values())
    for agent in record.agents.values():
        assert agent.running is False and agent.terminal_state is not None
        assert agent.resource_units_used == 1
    assert record.last_sequence == len(events) and [e.seq for e in events] == list(
        range(1, len(events) + 1)
    )
    # The record is a fold: the same events give the same bytes, and the seed's shape holds.
    assert fold_events(events).model_dump_json() == record.model_dump_json()
    assert incompatibilities(record) == []
    assert podman_names(plan.match_id) == []


async def test_preflight_refuses_a_host_that_already_passes(tmp_path: Path) -> None:
    """A competitor that does nothing can never score: an image that already serves the
    challenge is refused before any agent starts, and nothing is left behind."""
    source_match = new_match_id("pre")
    image = f"localhost/opsarena-test-solved:{source_match}"
    plan = plan_of({"solver": "scripted:reference"})
    from opsarena.agents import AgentContext
    from opsarena.agents.scripted import get_scripted
    from opsarena.hosts import HostSpec, get_driver
    from opsarena.hosts.podman import PodmanDriver

    driver = get_driver("podman")
    # The solved image is made from a host without a user namespace of its own: podman
    # 4.3 commits a user-namespaced host's files with the machine's uids, which no other
    # host could use (docs/SECURITY.md, "Hosts").
    maker = PodmanDriver()
    maker.podman.confine_flags, maker.podman.global_flags = [], []
    maker.podman.own_disks = False  # in podman's storage, to commit; a disk of its own maps ids
    try:
        host = await maker.create(
            HostSpec(match_id=source_match, territory="solver", image=plan.challenge.image)
        )
        ctx = AgentContext(source_match, "solver", "", host, time.monotonic() + 60)
        await get_scripted("reference", plan.challenge.directory).run(ctx)
        subprocess.run(["podman", "commit", host.name, image], check=True, capture_output=True)
        await driver.cleanup(match_id=source_match)
        solved = plan.challenge.model_copy(update={"image": image})
        broken = MatchPlan(
            challenge=solved,
            competitors=plan.competitors,
            time_limit_s=60,
            match_id=new_match_id("m"),
        )
        with SqliteEventStore(tmp_path / "log.db") as store:
            with pytest.raises(MatchError, match="already passes service-up"):
                await Controller(broken, store).run()
            record = fold_events(await store.read(broken.match_id))
        assert record.finish_reason == "aborted" and record.match_state == "finished"
        assert record.started_at is None
        assert all(a.terminal_state == "not-started" for a in record.agents.values())
        assert podman_names(broken.match_id) == []
    finally:
        await driver.cleanup(match_id=source_match)
        subprocess.run(["podman", "rmi", "--force", image], check=False, capture_output=True)


def test_ctrl_c_ends_the_match_cleanly_and_leaves_no_host(
    arena_runs: ArenaRuns, tmp_path: Path
) -> None:
    db = tmp_path / "log.db"
    record_path = tmp_path / "record.json"
    stderr = tmp_path / "stderr"
    with stderr.open("wb") as stderr_file:
        process = arena_runs.start(
            db,
            [sys.executable, "-m", "opsarena.cli.main", "run", "--quiet", "--db", str(db),
             "--builder", "a=human", "--builder", "b=scripted:wrong-health",
             "--time-limit", "300", "--record", str(record_path)],
            stdout=subprocess.PIPE, stderr=stderr_file,
        )  # fmt: skip
    try:
        match_id = wait_for_event(db, "match_started")
        wait_for_event(db, "attempt_started")  # the referee's task runs
        process.send_signal(signal.SIGUSR1)  # what it waits on, printed; the match goes on
        deadline = time.monotonic() + 60
        while b"--- task referee" not in stderr.read_bytes():
            assert process.poll() is None and time.monotonic() < deadline, stderr.read_bytes()
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    err = stderr.read_bytes()
    assert process.returncode == 0, err
    assert b"unfinished tasks" in err, err
    record = json.loads(record_path.read_text())
    assert record["finish_reason"] == "aborted" and record["match_state"] == "finished"
    assert {t["state"] for t in record["territories"].values()} == {"removed"}
    assert podman_names(match_id) == []
    assert b"aborted" in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "a match needs competitors"),
        (["--builder", "a"], "must look like TERRITORY=AGENT"),
        (["--builder", "a=scripted:nope"], "nope"),
        (["--builder", "a=martian:x"], "martian"),
        (["--builder", "a=scripted:idle", "--challenge", "no-such-challenge"], "no-such-challenge"),
        (["--builder", "a=scripted:idle", "--seed", "xyz"], "--seed 'xyz'"),
        (["--builder", "a=scripted:idle", "--finish", "never"], "--finish 'never'"),
        (["--builder", "a=scripted:idle", "--record", "/nonexistent/dir/r.json"], "does not exist"),
        (["--builder", "a=scripted:idle", "--builder", "a=scripted:idle"], "'a' is given twice"),
        (["--builder", "A=scripted:idle"], "territory 'A' is not valid"),
    ],
)
def test_bad_run_input_is_one_line_exit_2_and_makes_nothing(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    db = tmp_path / "log.db"
    result = subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", "run", "--quiet", "--db", str(db), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert expected in lines[0]
    if db.exists():
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)


def test_demo_command_runs_a_match_to_its_verdict(tmp_path: Path) -> None:
    env = {**os.environ, "OPSARENA_DB": str(tmp_path / "log.db")}
    result = subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", "demo", "--quiet"],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "winner: reference" in result.stdout
    assert "first durable deployment" in result.stdout
    match_id = result.stdout.split("look again: opsarena show ")[1].split()[0]
    shown = subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", "show", match_id, "--json"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    record = json.loads(shown.stdout)
    assert record["winner"] == "reference"
    assert record["territories"]["reference"]["milestone_points"] == 100
    # The match ended at the first durable deployment (how soon after it is measured by
    # bench/referee.py, not asserted here).
    assert record["territories"]["reference"]["durable_at_ms"] <= record["elapsed_ms"]
    assert podman_names(match_id) == []


async def test_finish_all_scores_everyone_and_nobody_durable_means_no_winner(
    tmp_path: Path,
) -> None:
    plan = plan_of({"wrong": "scripted:wrong-health", "mem": "scripted:in-memory"}, finish="all")
    with SqliteEventStore(tmp_path / "log.db") as store:
        record = await asyncio.wait_for(Controller(plan, store).run(), 200)
    assert record.finish_reason == "all competitors finished"
    assert record.winner is None  # mem has the most points, but it loses records
    assert record.territories["mem"].milestone_points > record.territories["wrong"].milestone_points
    assert record.territories["wrong"].milestones["service-up"].failure_reason == "wrong_body"
    assert record.territories["mem"].competitor_state == "scored"


async def test_time_limit_ends_a_match_a_person_never_finished(tmp_path: Path) -> None:
    plan = plan_of({"mem": "scripted:in-memory", "person": "human"}, time_limit_s=25.0)
    with SqliteEventStore(tmp_path / "log.db") as store:
        record = await asyncio.wait_for(Controller(plan, store).run(), 200)
    assert (record.finish_reason, record.winner) == ("time limit", None)  # mem is not durable
    person = record.agents[record.territories["person"].agent]
    assert person.terminal_state == "terminated" and person.terminal_detail
    assert record.elapsed_ms >= 25_000


class FeedbackListener(Agent):
    """Does nothing but wait for the referee's first message, and ends with it."""

    model = "listener"

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        try:
            message = await asyncio.wait_for(ctx.feedback.get(), 8)
        except TimeoutError:
            return AgentOutcome("completed", True, "no feedback came")
        return AgentOutcome("completed", True, message)


register_agent_kind("test-listener", lambda spec, settings, env: FeedbackListener(), arg=None)


@pytest.mark.parametrize("feedback", [True, False])
async def test_referee_feedback_reaches_agents_when_the_challenge_enables_it(
    tmp_path: Path, feedback: bool
) -> None:
    plan = plan_of({"quiet": "test-listener"}, time_limit_s=30.0)
    plan.challenge = plan.challenge.model_copy(update={"feedback": feedback})
    with SqliteEventStore(tmp_path / "log.db") as store:
        record = await Controller(plan, store).run()
    detail = record.agents["quiet"].terminal_detail or ""
    if feedback:
        assert detail.startswith("service-up failed: connection_refused")
    else:
        assert detail == "no feedback came"
