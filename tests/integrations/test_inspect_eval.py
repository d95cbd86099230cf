"""`opsarena/durable_records` (and `opsarena/tls_gateway`) run by Inspect on real hosts,
with a scripted model (Inspect's `mockllm`: the double of the remote LLM API, the only
one allowed).

The scripted model (Inspect's `mockllm`, no network) plays a conversation of tool calls:
it deploys a records service through the bash and text editor tools in the sample's
host, then submits. The referee then judges the host from outside, with its faults.
The reference service (disk, fsync) must score 1.0; the in-memory one 0.3 with the
service-restart milestone failed as record_missing. The real `inspect` CLI runs the
task too (an agent that does nothing scores 0.0), and `inspect log dump` reads every
log written. tls-gateway's brief and CA derive from the sample's seed: its scripted
model reads the server name from the brief it is given, as a model would, and issues
the certificate with the CA the setup placed; 1.0 needs the referee to judge with the
same seed.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from inspect_ai import eval_async
from inspect_ai.log import EvalLog, read_eval_log
from inspect_ai.model import ChatMessage, ModelOutput, ModelUsage, get_model

from opsarena.agents.scripted import builders_module
from opsarena.agents.scripted.deploy import (
    ServiceTarget,
    Storage,
    activation_script,
    records_unit,
)
from opsarena.challenges.catalog import builtin_challenge, builtin_root
from opsarena.integrations.inspect.scorer import sample_input
from opsarena.match.commitment import reveal_problem
from opsarena.referee.contract import brief_for
from tests.integrations.conftest import TEST_IMAGE

pytestmark = pytest.mark.hosts

INSPECT = str(Path(sys.executable).with_name("inspect"))
"""The `inspect` CLI of the interpreter running the tests (a worktree may have no .venv)."""
MODEL = "mockllm/model"
SETTLE_S = 3.0
"""The scorer's settle window in these tests (the challenge's 30 s would only slow them)."""


@pytest.fixture(autouse=True)
def quiet_display(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INSPECT_DISPLAY", "none")


# Inspect's mockllm model (the LLM API's double) counts tokens with tiktoken, whose
# encoding is downloaded at first use;
# this machine has no network, so the scripted turns carry their usage (as a real
# provider's do) and the CLI run counts a token per four characters.
CLI_WITH_OFFLINE_TOKEN_COUNT = (
    "import sys, inspect_ai.model._model as m\n"
    "m.count_text_tokens = lambda text: max(1, len(text) // 4)\n"
    "from inspect_ai._cli.main import main\n"
    "sys.argv[0] = 'inspect'\n"
    "main()\n"
)


def turn(tool: str, arguments: dict[str, Any]) -> ModelOutput:
    output = ModelOutput.for_tool_call(MODEL, tool, arguments)
    output.usage = ModelUsage(input_tokens=1000, output_tokens=100, total_tokens=1100)
    return output


def deploy_conversation(storage: Storage, target: ServiceTarget | None = None) -> list[ModelOutput]:
    """Tool calls that deploy the shared records server with `storage`, then submit; for
    a TLS `target` (tls-gateway), with a certificate issued by the placed CA first."""
    target = target or ServiceTarget()
    tls = builders_module(builtin_root() / "tls-gateway")
    script = resources.files("opsarena.workloads.records").joinpath("server.py")
    script_path = f"{target.program_dir}/records_server.py"
    encoded = base64.b64encode(script.read_bytes()).decode()
    unit = records_unit(
        target,
        script_path,
        storage=storage,
        health_body="ready",
        builder=f"scripted-{storage}",
        extra_args=tls.tls_server_args(target, None) if target.tls else (),  # type: ignore[union-attr]
    )
    install = (
        f"mkdir -p {target.program_dir} && echo {encoded} | base64 -d > {script_path}"
        f" && python3 -m py_compile {script_path}"
    )
    issue = [turn("bash", {"command": tls.tls_issue_script(target, self_signed=False)})]  # type: ignore[union-attr]
    return [
        turn("bash", {"command": install}),
        *(issue if target.tls else []),
        turn("text_editor", {"command": "create", "path": target.unit_path, "file_text": unit}),
        turn("bash", {"command": activation_script(target, enable=True, wait_seconds=20.0)}),
        turn("submit", {"answer": f"deployed ({storage})"}),
    ]


SERVER_NAME = re.compile(r"\bgw-[0-9a-f]{10}\.arena\.test\b")
"""How tls-gateway's brief names the certificate's server (docs/CHALLENGES.md)."""

Respond = Callable[[list[ChatMessage], object, object, object], ModelOutput]


def tls_gateway_agent() -> Respond:
    """A scripted model for tls-gateway: on its first turn it reads the server name
    from the brief it was given (it cannot know it otherwise: the name derives from the
    sample's secret seed), then deploys the reference TLS gateway through the tools."""
    steps: list[ModelOutput] = []

    def respond(messages: list[ChatMessage], *_: object) -> ModelOutput:
        if not steps:
            brief = next(m.text for m in messages if m.role == "user")
            found = SERVER_NAME.search(brief)
            assert found is not None, f"no server name in the brief: {brief[:600]}"
            name, port = found.group(0), builtin_challenge("tls-gateway").port  # 443
            target = ServiceTarget(port=port, server_name=name, tls=True)
            steps.extend(reversed(deploy_conversation("disk", target)))
        return steps.pop()

    return respond


async def run_eval(
    conversation: Storage | list[ModelOutput] | Respond,
    match_prefix: str,
    log_dir: Path,
    task: str = "opsarena/durable_records",
) -> EvalLog:
    if isinstance(conversation, str):
        conversation = deploy_conversation(conversation)
    logs = await eval_async(
        task,
        model=get_model(MODEL, custom_outputs=conversation),
        # A short settle window: the failing samples would otherwise be retried for 30 s.
        task_args={"image": TEST_IMAGE, "match_prefix": match_prefix, "settle_s": SETTLE_S},
        log_dir=str(log_dir),
    )
    assert len(logs) == 1
    return logs[0]


def sample_score(log: EvalLog) -> tuple[float, str, dict[str, Any]]:
    assert log.status == "success", log.error
    assert log.samples is not None and len(log.samples) == 1
    sample = log.samples[0]
    assert sample.scores is not None
    score = sample.scores["referee"]
    assert isinstance(score.value, float)
    assert score.explanation is not None and score.metadata is not None
    return score.value, score.explanation, score.metadata


def tool_errors(log: EvalLog) -> list[str]:
    assert log.samples is not None
    return [
        f"{m.function}: {m.error.type}: {m.error.message}"
        for m in log.samples[0].messages
        if m.role == "tool" and m.error is not None
    ]


def dump(log_file: str) -> dict[str, Any]:
    """What `inspect log dump` prints for a log file, parsed."""
    done = subprocess.run(
        [INSPECT, "log", "dump", log_file], capture_output=True, text=True, check=True, timeout=120
    )
    data: dict[str, Any] = json.loads(done.stdout)
    return data


async def test_reference_service_scores_one(match_prefix: str, tmp_path: Path) -> None:
    log = await run_eval("disk", match_prefix, tmp_path)
    assert tool_errors(log) == []
    value, explanation, metadata = sample_score(log)
    assert value == 1.0, explanation
    assert metadata["durable"] is True
    assert [m["passed"] for m in metadata["milestones"]] == [True, True, True, True]
    assert metadata["failure_reasons"] == []
    kinds = [e["fault"] for e in metadata["referee_events"] if e["type"] == "fault_injected"]
    assert kinds == ["restart", "restart", "reboot", "reboot"]  # two fault rounds each
    assert metadata["usage"]["total_tokens"] == 4 * 1100
    dumped = dump(log.location)
    assert dumped["eval"]["task"] == "opsarena/durable_records"
    assert dumped["samples"][0]["scores"]["referee"]["value"] == 1.0


async def test_in_memory_service_scores_three_tenths(match_prefix: str, tmp_path: Path) -> None:
    log = await run_eval("memory", match_prefix, tmp_path)
    assert tool_errors(log) == []
    value, explanation, metadata = sample_score(log)
    assert value == pytest.approx(0.3), explanation
    restart = next(m for m in metadata["milestones"] if m["id"] == "service-restart")
    assert restart["passed"] is False
    assert restart["failure_reason"] == "record_missing"
    assert metadata["failure_reasons"] == ["record_missing"]
    assert "service-restart: failed (record_missing)" in explanation
    dumped = dump(log.location)
    assert dumped["samples"][0]["scores"]["referee"]["metadata"]["points"] == 30


async def test_tls_gateway_deployed_from_the_seeded_brief_scores_one(
    match_prefix: str, tmp_path: Path
) -> None:
    """The proof that the sample's seed is one from the host's making to the score: the
    brief names a server from the seed, the certificate is signed by the CA the setup
    placed from the seed, and the referee trusts only the CA it derives from the seed
    it judges with. Any mismatch fails tls-up."""
    log = await run_eval(tls_gateway_agent(), match_prefix, tmp_path, "opsarena/tls_gateway")
    assert tool_errors(log) == []
    value, explanation, metadata = sample_score(log)
    assert value == 1.0, explanation
    assert metadata["durable"] is True and metadata["failure_reasons"] == []
    assert [e["fault"] for e in metadata["referee_events"] if e["type"] == "fault_injected"] == [
        "reboot",
        "reboot",
    ]
    # The agent read the brief rendered with the seed the score reveals, and the seed
    # opens the commitment the sample published before the agent started.
    assert log.samples is not None
    sample = log.samples[0]
    challenge = builtin_challenge("tls-gateway")
    seed = bytes.fromhex(metadata["seed"])
    [prompt] = [m.text for m in sample.messages if m.role == "user"]
    assert prompt == sample_input(brief_for(challenge, seed), challenge.total_points, SETTLE_S)
    assert "{{" not in prompt and "{{" not in str(sample.input)
    published = (sample.metadata["match_id"], sample.metadata["seed_commitment"])
    assert reveal_problem(*published, metadata["seed"], metadata["seed_nonce"]) is None
    assert metadata["seed"] not in json.dumps([m.model_dump() for m in sample.messages])


async def test_an_agent_that_halts_its_host_scores_zero(match_prefix: str, tmp_path: Path) -> None:
    """Hostile: the agent powers its host off and submits. The sample still ends and is
    scored 0. systemd shuts down in the background, so when the referee looks the host
    is either still going down (nothing listens) or gone (host_down): both are the
    competitor's failure. A command run meanwhile is an ordinary result or a
    sandbox_unavailable tool error, never a crash."""
    conversation = [
        turn("bash", {"command": "systemctl poweroff; sleep 120"}),
        turn("bash", {"command": "true"}),
        turn("submit", {"answer": "nothing to see"}),
    ]
    log = await run_eval(conversation, match_prefix, tmp_path)
    errors = tool_errors(log)
    assert all(e.startswith("bash: sandbox_unavailable:") for e in errors), errors
    value, explanation, metadata = sample_score(log)
    assert value == 0.0
    assert metadata["failure_reasons"] in (["host_down"], ["connection_refused"]), explanation
    [service_up] = [m for m in metadata["milestones"] if m["id"] == "service-up"]
    assert service_up["failure_category"] == "verification_failed"


def test_inspect_cli_runs_the_task(match_prefix: str, tmp_path: Path) -> None:
    """The real CLI finds the task through the entry point; mockllm's default answer
    makes no tool call, so nothing listens and the referee says so."""
    done = subprocess.run(
        [
            sys.executable, "-c", CLI_WITH_OFFLINE_TOKEN_COUNT,
            "eval", "opsarena/durable_records", "--model", MODEL,
            "-T", f"image={TEST_IMAGE}", "-T", f"match_prefix={match_prefix}",
            "-T", f"settle_s={SETTLE_S}",
            "--message-limit", "4", "--log-dir", str(tmp_path), "--display", "none",
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    [log_file] = sorted(tmp_path.glob("*.eval"))
    log = read_eval_log(str(log_file))
    value, explanation, metadata = sample_score(log)
    assert value == 0.0
    assert metadata["failure_reasons"] == ["connection_refused"], explanation
    assert dump(str(log_file))["samples"][0]["scores"]["referee"]["value"] == 0.0
