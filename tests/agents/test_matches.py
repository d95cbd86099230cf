"""Every kind of competitor in a whole match on real hosts: llm, command and human.

The LLM endpoint is the one test double allowed: a local server speaking the
OpenAI chat-completions wire protocol (tests/agents/openai_double.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsarena.agents.competitors import Competitor, competitor_from_cli
from opsarena.agents.registry import parse_agent_spec
from opsarena.agents.spec import AgentSettings
from opsarena.challenges.catalog import find_challenge
from opsarena.match.controller import Controller, MatchPlan
from opsarena.store import SqliteEventStore
from tests.agents.openai_double import (
    API_KEY,
    Model,
    OpenAIDouble,
    completion,
    error_in_200,
)
from tests.agents.records_service import APP, APP_PATH, UNIT, WAIT_HEALTHY
from tests.conftest import ArenaRuns, new_match_id, podman_names, wait_for_event

pytestmark = pytest.mark.hosts

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]
ROOT = Path(__file__).resolve().parents[2]
UNIT_PATH = "/etc/systemd/system/builder-app.service"


async def test_an_llm_agent_wins_a_match_and_the_record_shows_its_usage(
    openai_double: OpenAIDouble, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPSARENA_LLM_BASE_URL", openai_double.base_url)
    monkeypatch.setenv("OPSARENA_LLM_API_KEY", API_KEY)
    unit = UNIT.replace("durable records service", "builder-app")
    openai_double.script = [
        completion(
            calls=[
                ("write_file", {"path": APP_PATH, "content": APP}),
                ("write_file", {"path": UNIT_PATH, "content": unit}),
            ],
            prompt_tokens=1500, completion_tokens=800, cost=0.0021,
        ),
        completion(
            calls=[("bash", {"command": "systemctl daemon-reload && "
                             "systemctl enable --now builder-app && " + WAIT_HEALTHY})],
            prompt_tokens=2600, completion_tokens=60, cost=0.0011,
        ),
        completion(
            calls=[("done", {"summary": "builder-app is enabled, durable and healthy"})],
            prompt_tokens=2800, completion_tokens=20, cost=0.0009,
        ),
    ]  # fmt: skip
    plan = MatchPlan(
        challenge=find_challenge("durable-records"),
        competitors=[competitor_from_cli("builder-one", "llm:double-model")],
        time_limit_s=150,
        match_id=new_match_id("m"),
    )
    with SqliteEventStore(tmp_path / "log.db") as store:
        record = await Controller(plan, store).run()
        transcript = [e for e in await store.read(plan.match_id) if e.type == "agent_transcript"]

    assert (record.finish_reason, record.winner) == ("first durable deployment", "builder-one")
    assert record.territories["builder-one"].milestone_points == 100
    agent = record.agents[record.territories["builder-one"].agent]
    assert agent.model == "double-model"
    assert (agent.terminal_state, agent.successful) == ("completed", True)
    assert (agent.input_tokens, agent.output_tokens) == (1500 + 2600 + 2800, 800 + 60 + 20)
    assert agent.cost_microusd == 2100 + 1100 + 900
    assert transcript, "the conversation is kept as events"
    assert podman_names(plan.match_id) == []


def test_a_command_agent_wins_through_opsarena_run(tmp_path: Path) -> None:
    record_path = tmp_path / "record.json"
    result = subprocess.run(
        [*OPSARENA, "run", "--quiet", "--db", str(tmp_path / "log.db"), "--record",
         str(record_path), "--builder", f"a=command:{ROOT / 'examples' / 'command-agent.sh'}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads(record_path.read_text())
    assert record["winner"] == "a" and record["territories"]["a"]["milestone_points"] == 100
    agent = record["agents"][record["territories"]["a"]["agent"]]
    assert agent["terminal_state"] == "completed" and agent["successful"] is True


def test_a_person_declares_done_and_the_referee_verifies(
    arena_runs: ArenaRuns, tmp_path: Path
) -> None:
    db = tmp_path / "log.db"
    process = arena_runs.start(
        db,
        [*OPSARENA, "run", "--quiet", "--db", str(db), "--time-limit", "200",
         "--builder", "me=human", "--record", str(tmp_path / "record.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        instructions = process.stderr.readline()
        token = re.search(r"OPSARENA_DONE_TOKEN=(\S+) opsarena done", instructions)
        assert token, instructions
        match_id = wait_for_event(db, "match_started")
        wrong = subprocess.run(
            [*OPSARENA, "done", match_id, "nobody", "--db", str(db)],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "OPSARENA_DONE_TOKEN": token[1]},
        )  # fmt: skip
        assert wrong.returncode == 2 and "has no territory 'nobody'" in wrong.stderr
        time.sleep(0.5)
        for bad in ({}, {"OPSARENA_DONE_TOKEN": token[1][:-1] + "x"}):
            refused = subprocess.run(
                [*OPSARENA, "done", match_id, "me", "--db", str(db)],
                capture_output=True, text=True, timeout=60, check=False,
                stdin=subprocess.DEVNULL,
                env={**{k: v for k, v in os.environ.items() if k != "OPSARENA_DONE_TOKEN"}, **bad},
            )  # fmt: skip
            assert refused.returncode == 2, refused.stderr
            assert "token" in refused.stderr and len(refused.stderr.splitlines()) == 1
        done = subprocess.run(
            [*OPSARENA, "done", match_id, "me", "--db", str(db)],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "OPSARENA_DONE_TOKEN": token[1]},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        _out, err = process.communicate(timeout=200)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert f"opsarena hosts shell {match_id}/me" in instructions
    assert token[1] not in db.read_bytes().decode(errors="replace"), "the token is never logged"
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["finish_reason"] == "all competitors finished"
    territory = record["territories"]["me"]
    assert territory["done_by"] and territory["milestone_points"] == 0
    agent = record["agents"][territory["agent"]]
    assert agent["terminal_state"] == "completed" and "declared done by" in agent["terminal_detail"]


def test_the_seed_match_says_in_one_line_when_no_endpoint_is_configured(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if "OPENAI" not in k and "OPSARENA_LLM" not in k}
    result = subprocess.run(
        [*OPSARENA, "run", "--quiet", "--db", str(tmp_path / "log.db"),
         "--competitors", str(ROOT / "examples" / "seed-match.toml")],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "no LLM endpoint configured" in lines[0]


async def test_the_seed_match_plays_against_any_reachable_endpoint(
    openai_double: OpenAIDouble, arena_runs: ArenaRuns, tmp_path: Path
) -> None:
    """The shipped competitors file, three models, one endpoint: every agent's usage and
    the provider's cost land in the record under the seed's agent names, and each model's
    routing and reasoning settings reach the endpoint."""
    for name in ("deepseek/deepseek-v4-flash-0731", "openai/gpt-5.6-luna", "z-ai/glm-5.2"):
        openai_double.models[name] = Model()
    openai_double.script = [
        completion(
            calls=[("done", {"summary": "nothing deployed"})],
            prompt_tokens=700, completion_tokens=12, cost=0.0005, repeat=True,
        )
    ]  # fmt: skip
    env = {
        **os.environ,
        "OPSARENA_LLM_BASE_URL": openai_double.base_url,
        "OPSARENA_LLM_API_KEY": API_KEY,
    }
    record_path = tmp_path / "record.json"
    # The double serves from this test's event loop: run opsarena without blocking it.
    process = await asyncio.create_subprocess_exec(
        *OPSARENA, "run", "--quiet", "--db", str(tmp_path / "log.db"), "--record",
        str(record_path), "--competitors", str(ROOT / "examples" / "seed-match.toml"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        start_new_session=True,
    )  # fmt: skip
    arena_runs.adopt(process.pid, tmp_path / "log.db")
    _out, err = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode == 0, err.decode()
    record = json.loads(record_path.read_text())
    assert set(record["agents"]) == {"deepseek-builder", "luna-builder", "glm-builder"}
    assert record["agents"]["luna-builder"]["model"] == "openai/gpt-5.6-luna"
    for agent in record["agents"].values():
        assert (agent["input_tokens"], agent["output_tokens"]) == (700, 12)
        assert agent["cost_microusd"] == 500
        assert agent["terminal_state"] == "completed"
    assert record["finish_reason"] == "all competitors finished" and record["winner"] is None
    sent = {request["model"]: request for request in openai_double.requests}
    assert set(sent) == {"deepseek/deepseek-v4-flash-0731", "openai/gpt-5.6-luna", "z-ai/glm-5.2"}
    assert sent["openai/gpt-5.6-luna"]["provider"] == {"only": ["openai"], "allow_fallbacks": False}
    assert sent["deepseek/deepseek-v4-flash-0731"]["reasoning"] == {"effort": "high"}
    assert sent["z-ai/glm-5.2"]["temperature"] == 0.6
    assert all(r["max_tokens"] == 16_000 for r in sent.values())


async def test_a_model_that_talks_reasons_overflows_and_is_cut_still_wins_a_match(
    openai_double: OpenAIDouble, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15's done-when: a thinking model (its reasoning must go back on every tool
    turn, as DeepSeek's API demands) talks without acting, fills a small window with long
    outputs (its competitor's settings overstate the window, so the back end refuses one
    request as too long), gets an error inside a 200 and a `length` cut, and only then
    deploys the reference service, then watches. It wins."""
    monkeypatch.setenv("OPSARENA_LLM_BASE_URL", openai_double.base_url)
    monkeypatch.setenv("OPSARENA_LLM_API_KEY", API_KEY)
    openai_double.models["lab/thinker"] = Model(context_length=8000, reasoning_model="deepseek")
    unit = UNIT.replace("durable records service", "builder-app")

    def think(n: int) -> str:
        return f"Step {n}: the brief wants a durable service; look before acting."

    noisy = 'for i in $(seq 1 300); do echo "apt: reading package lists $i"; done'
    script = [
        completion(content="Let me look at the host first.", reasoning_content=think(0)),
        *[
            completion(calls=[("bash", {"command": noisy})], reasoning_content=think(n))
            for n in range(1, 6)
        ],
        error_in_200(502, "Provider returned error", metadata={"provider_name": "Acme"}),
        completion(
            calls=[("write_file", '{"path": "/opt/records/app.py", "content": "import js')],
            finish_reason="length", completion_tokens=2048, reasoning_content=think(6),
        ),
        completion(
            calls=[
                ("write_file", {"path": APP_PATH, "content": APP}),
                ("write_file", {"path": UNIT_PATH, "content": unit}),
            ],
            reasoning_content=think(7), cost=0.001,
        ),
        completion(
            calls=[("bash", {"command": "systemctl daemon-reload && "
                             "systemctl enable --now builder-app && " + WAIT_HEALTHY})],
            reasoning_content=think(8), cost=0.001,
        ),
        # It keeps watching (thinking each time) until the referee declares it durable.
        completion(calls=[("bash", {"command": "sleep 1"})], reasoning_content=think(9),
                   repeat=True),
    ]  # fmt: skip
    for reply in script:
        if isinstance(reply.body, dict) and "choices" in reply.body:
            reply.body["model"] = "lab/thinker"
    openai_double.script = script
    competitor = Competitor(
        "builder-one",
        "builder-one",
        parse_agent_spec("llm:lab/thinker"),
        AgentSettings(context_window=100_000),
    )
    plan = MatchPlan(
        challenge=find_challenge("durable-records"),
        competitors=[competitor],
        time_limit_s=240,
        match_id=new_match_id("m"),
    )
    with SqliteEventStore(tmp_path / "log.db") as store:
        record = await Controller(plan, store).run()
        events = await store.read(plan.match_id)
    transcript = [e.data["entry"] for e in events if e.type == "agent_transcript"]

    assert (record.finish_reason, record.winner) == ("first durable deployment", "builder-one")
    agent = record.agents["builder-one"]
    assert agent.failure_source != "player" and agent.terminal_state != "failed"
    assert openai_double.key_requests == 1  # the key was checked where OpenRouter checks it
    refusals = [why for _, why in openai_double.rejected]
    assert refusals and all("maximum context length is 8000" in why for why in refusals)
    kinds = [e["kind"] for e in transcript]
    assert "context" in kinds and "discarded" in kinds
    retries = [e["error"] for e in transcript if e["kind"] == "retry"]
    assert any("Provider returned error (provider Acme)" in r for r in retries)
    thoughts = [e.get("reasoning_content") for e in transcript if e["kind"] == "assistant"]
    assert think(0) in thoughts and think(9) in thoughts
    assert podman_names(plan.match_id) == []
