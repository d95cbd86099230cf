"""The llm agent: its decisions directly, and whole runs against the OpenAI test double on
real hosts (the double stands in for the paid API; everything else is real)."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from opsarena.agents import AgentContext
from opsarena.agents.llm import (
    Completion,
    Endpoint,
    LlmAgent,
    Problem,
    RetryPolicy,
    Spent,
    ToolCallError,
    Usage,
    assistant_message,
    builtin_prices,
    fit,
    head_tail,
    limit_reached,
    normalise_calls,
    parse_retry_after,
    parse_tool_arguments,
    priced_cost_microusd,
    read_completion,
    replay_messages,
    request_fields,
    resolve_endpoint,
    retry_delay,
    usage_of,
)
from opsarena.agents.llm.context import digest, estimate_tokens
from opsarena.agents.llm.endpoint import lookup_generation
from opsarena.agents.llm.tools import read_slice
from opsarena.agents.spec import (
    AgentSettings,
    Limits,
    Price,
    ProviderRouting,
    Reasoning,
    find_price,
)
from opsarena.errors import AgentConfigError
from opsarena.hosts import Host
from tests.agents.contexts import Events, recording_context
from tests.agents.openai_double import (
    API_KEY,
    Model,
    OpenAIDouble,
    Reply,
    completion,
    error,
    error_in_200,
    html_page,
    no_choices,
    rate_limited,
)
from tests.agents.records_service import (
    APP,
    APP_PATH,
    UNIT,
    UNIT_PATH,
    WAIT_HEALTHY,
    assert_durable,
)
from tests.conftest import HostFactory

BRIEF = "Deploy a durable records service on port 8080 (unit records.service)."


def make_ctx(host: Host, deadline_s: float = 300.0) -> tuple[AgentContext, Events]:
    return recording_context(host, brief=BRIEF, deadline_s=deadline_s)


def make_agent(double: OpenAIDouble, **kwargs: Any) -> LlmAgent:
    kwargs.setdefault("retry", RetryPolicy(attempts=3, initial_delay_s=0.01, max_delay_s=0.02))
    kwargs.setdefault("rand", lambda: 0.0)
    return LlmAgent(
        kwargs.pop("model", "double-model"),
        endpoint=Endpoint(double.base_url, API_KEY, "test", double.flavour == "openrouter"),
        **kwargs,
    )


def entries(events: Events) -> list[dict[str, Any]]:
    return [data["entry"] for kind, data in events if kind == "transcript"]


def usages(events: Events) -> list[dict[str, Any]]:
    return [data for kind, data in events if kind == "usage"]


def tool_results(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


# --- decisions -------------------------------------------------------------------------


def test_retry_delay_honours_retry_after_then_backs_off() -> None:
    policy = RetryPolicy(initial_delay_s=1.0, max_delay_s=5.0, max_retry_after_s=60.0, jitter=0)
    assert retry_delay(1, {"retry-after": "7"}, policy) == 7.0
    assert retry_delay(1, {"retry-after-ms": "250", "retry-after": "9"}, policy) == 0.25
    assert retry_delay(1, {"retry-after": "3600"}, policy) == 60.0
    date = "Wed, 21 Oct 2026 07:28:10 GMT"
    now = parse_retry_after({"retry-after": date}, now=0.0)
    assert now is not None
    assert parse_retry_after({"retry-after": date}, now=now - 12.0) == 12.0
    assert [retry_delay(n, {}, policy) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    assert retry_delay(2, {"retry-after": "soon"}, policy) == 2.0


def test_cost_is_the_providers_else_priced_else_unknown() -> None:
    price = Price(input_usd_per_mtok=0.5, output_usd_per_mtok=2.0, cached_input_usd_per_mtok=0.1)
    raw = {"prompt_tokens": 1000, "completion_tokens": 100, "prompt_tokens_details": {}}
    assert usage_of({**raw, "cost": 0.0123456}, price) == Usage(1000, 100, 0, 12346)
    assert usage_of(raw, price) == Usage(1000, 100, 0, 700)
    cached = {**raw, "prompt_tokens_details": {"cached_tokens": 400}}
    assert usage_of(cached, price) == Usage(1000, 100, 400, 300 + 40 + 200)
    assert usage_of(raw, None).cost_microusd is None
    assert priced_cost_microusd(3, 0, 0, Price(input_usd_per_mtok=0.15, output_usd_per_mtok=0)) == 0


def test_limits_name_what_was_reached() -> None:
    spent = Spent(
        turns=3, input_tokens=900, fresh_input_tokens=500, output_tokens=50, cost_microusd=900
    )
    assert limit_reached(Limits(), spent) is None
    assert limit_reached(Limits(turns=3), spent) == "turn limit (3) reached"
    assert limit_reached(Limits(turns=4, input_tokens=500), spent) == (
        "input token limit (500) reached (500 used)"
    )
    assert "output token limit (40)" in str(limit_reached(Limits(output_tokens=40), spent))
    assert "cost limit (800 micro-USD)" in str(limit_reached(Limits(cost_microusd=800), spent))


def test_tool_arguments_are_checked() -> None:
    assert parse_tool_arguments("bash", '{"command": "ls", "timeout_s": 5}')["timeout_s"] == 5
    for name, arguments, words in [
        ("bash", '{"command": ', "not valid JSON"),
        ("bash", "[1]", "JSON object"),
        ("bash", '{"cmd": "ls"}', "needs the argument 'command'"),
        ("bash", '{"command": "ls", "timeout_s": "5"}', "must be a number"),
        ("write_file", '{"path": "/x", "content": "", "mode": "rwx"}', "octal"),
        ("read_file", '{"path": "etc/passwd"}', "absolute"),
        ("curl", "{}", "there is no tool 'curl'"),
    ]:
        with pytest.raises(ToolCallError, match=words):
            parse_tool_arguments(name, arguments)


def test_endpoint_comes_from_settings_then_opsarena_then_openai_variables() -> None:
    env = {
        "OPSARENA_LLM_BASE_URL": "http://a/v1",
        "OPSARENA_LLM_API_KEY": "ka",
        "OPENAI_BASE_URL": "http://b/v1",
        "OPENAI_API_KEY": "kb",
        "MY_KEY": "km",
    }
    assert resolve_endpoint(AgentSettings(), env) == Endpoint(
        "http://a/v1", "ka", "OPSARENA_LLM_API_KEY"
    )
    openai_only = {k: v for k, v in env.items() if k.startswith("OPENAI")}
    assert resolve_endpoint(AgentSettings(), openai_only).base_url == "http://b/v1"
    own = AgentSettings(base_url="http://c/v1", api_key_env="MY_KEY")
    assert resolve_endpoint(own, env) == Endpoint("http://c/v1", "km", "MY_KEY")
    assert resolve_endpoint(AgentSettings(base_url="http://local/v1"), {}).api_key == "none"
    with pytest.raises(AgentConfigError, match="no LLM endpoint configured"):
        resolve_endpoint(AgentSettings(), {})
    with pytest.raises(AgentConfigError, match="MISSING_KEY"):
        resolve_endpoint(AgentSettings(api_key_env="MISSING_KEY"), env)


def test_price_table_is_shipped_and_found_by_name_or_suffix() -> None:
    table = builtin_prices()
    assert table, "prices.toml must be packaged and non-empty"
    assert find_price("openai/gpt-4o-mini", table) == table["gpt-4o-mini"]
    assert find_price("nobody/unknown-model", table) is None


def test_replay_rebuilds_assistant_messages_with_their_tool_calls() -> None:
    log = [
        {"kind": "system", "content": "s"},
        {"kind": "user", "content": "u"},
        {"kind": "assistant", "content": None},
        {"kind": "tool_call", "id": "c1", "name": "bash", "arguments": "{}"},
        {"kind": "retry", "attempt": 1, "error": "HTTP 429", "delay_s": 1.0},
        {"kind": "tool_result", "id": "c1", "name": "bash", "content": "exit code: 0"},
        {"kind": "feedback", "content": "Referee: x"},
    ]
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    assert replay_messages(log) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "exit code: 0"},
        {"role": "user", "content": "Referee: x"},
    ]


# --- preflight (the double only) --------------------------------------------------------


async def test_preflight_accepts_a_reachable_endpoint(openai_double: OpenAIDouble) -> None:
    await make_agent(openai_double).preflight()
    assert openai_double.model_requests == 1


async def test_preflight_says_in_one_line_when_the_key_is_refused(
    openai_double: OpenAIDouble,
) -> None:
    agent = LlmAgent("m", endpoint=Endpoint(openai_double.base_url, "wrong", "MY_KEY"))
    with pytest.raises(AgentConfigError, match=r"refused the key from MY_KEY \(HTTP 401\)") as exc:
        await agent.preflight()
    assert "\n" not in str(exc.value)


async def test_preflight_says_in_one_line_when_nothing_answers(
    openai_double: OpenAIDouble,
) -> None:
    url = openai_double.base_url
    await openai_double.stop()  # the port is closed now
    agent = LlmAgent("m", endpoint=Endpoint(url, API_KEY, "k"), preflight_timeout_s=2.0)
    with pytest.raises(AgentConfigError, match="is not reachable") as exc:
        await agent.preflight()
    assert "\n" not in str(exc.value)


# --- whole runs on real hosts -----------------------------------------------------------


@pytest.mark.hosts
async def test_llm_agent_deploys_a_durable_service_and_records_usage_and_cost(
    openai_double: OpenAIDouble, host_factory: HostFactory
) -> None:
    host = await host_factory("builder-one")
    openai_double.script = [
        completion(
            content="Writing the service.",
            calls=[
                ("write_file", {"path": APP_PATH, "content": APP}),
                ("write_file", {"path": UNIT_PATH, "content": UNIT, "mode": "0644"}),
            ],
            prompt_tokens=1200,
            completion_tokens=900,
            cached_tokens=200,
            cost=0.001234,
        ),
        completion(
            calls=[
                ("bash", {"command": "systemctl daemon-reload && systemctl enable --now records"})
            ],
            prompt_tokens=2500,
            completion_tokens=40,
            cost=0.000987,
        ),
        completion(
            calls=[("bash", {"command": WAIT_HEALTHY}), ("read_file", {"path": UNIT_PATH})],
            prompt_tokens=2600,
            completion_tokens=30,
            cost=0.00101,
        ),
        completion(
            calls=[("done", {"summary": "records.service is enabled and healthy"})],
            prompt_tokens=2800,
            completion_tokens=15,
            cost=0.0011,
        ),
    ]
    ctx, events = make_ctx(host)
    outcome = await make_agent(openai_double).run(ctx)

    assert (outcome.terminal_state, outcome.successful) == ("completed", True)
    assert outcome.terminal_detail == "records.service is enabled and healthy"
    await assert_durable(host)
    assert usages(events) == [
        {"input_tokens": 1200, "output_tokens": 900, "cached_tokens": 200, "cost_microusd": 1234},
        {"input_tokens": 2500, "output_tokens": 40, "cached_tokens": 0, "cost_microusd": 987},
        {"input_tokens": 2600, "output_tokens": 30, "cached_tokens": 0, "cost_microusd": 1010},
        {"input_tokens": 2800, "output_tokens": 15, "cached_tokens": 0, "cost_microusd": 1100},
    ]
    first = openai_double.requests[0]
    assert first["model"] == "double-model"
    assert {tool["function"]["name"] for tool in first["tools"]} == {
        "bash",
        "read_file",
        "write_file",
        "done",
    }
    assert BRIEF in first["messages"][0]["content"]
    last_results = tool_results(openai_double.messages(-1))
    assert last_results[-2].startswith("exit code: 0\nstdout:\nready")
    assert "ExecStart=/usr/bin/python3 /opt/records/app.py" in last_results[-1]
    assert replay_messages(entries(events))[: len(openai_double.messages(-1))] == (
        openai_double.messages(-1)
    )


@pytest.mark.hosts
async def test_a_429_is_retried_after_the_time_the_server_asks(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        rate_limited(0.2),
        completion(calls=[("done", {"summary": "ok"})]),
    ]
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert (outcome.terminal_state, outcome.successful) == ("completed", True)
    assert len(openai_double.requests) == 2
    retries = [e for e in entries(events) if e["kind"] == "retry"]
    assert [(r["delay_s"], r["error"]) for r in retries] == [
        (0.2, "HTTP 429: Rate limit exceeded: free-models-per-min")
    ]
    assert len(usages(events)) == 1


@pytest.mark.hosts
async def test_500s_until_the_agent_gives_up_are_the_arenas_failure(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [error(500, "upstream exploded", repeat=True)]
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert (outcome.terminal_state, outcome.successful) == ("failed", False)
    assert outcome.failure_source == "arena"
    assert outcome.terminal_detail == "LLM API failed 3 times; last: HTTP 500: upstream exploded"
    assert len(openai_double.requests) == 3
    assert usages(events) == []


@pytest.mark.hosts
async def test_a_refused_request_is_not_retried(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [error(400, "model does not support tools", repeat=True)]
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert (outcome.terminal_state, outcome.failure_source) == ("failed", "arena")
    assert "refused the request: HTTP 400: model does not support tools" in outcome.terminal_detail
    assert len(openai_double.requests) == 1


@pytest.mark.hosts
async def test_malformed_tool_calls_are_corrected_a_bounded_number_of_times(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [completion(calls=[("bash", '{"command": "ls"')], repeat=True)]
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double, max_corrections=2).run(ctx)
    assert (outcome.terminal_state, outcome.successful) == ("failed", False)
    assert outcome.failure_source == "player"
    assert outcome.terminal_detail.startswith("model output unusable: 3 unusable responses")
    assert len(openai_double.requests) == 3
    corrections = tool_results(openai_double.messages(-1))
    assert len(corrections) == 2
    assert all("arguments of bash are not valid JSON" in c for c in corrections)


@pytest.mark.hosts
async def test_a_corrected_model_goes_on(openai_double: OpenAIDouble, agents_host: Host) -> None:
    openai_double.script = [
        completion(calls=[("shell", {"command": "true"})]),
        completion(calls=[("bash", {"command": "echo fixed"})]),
        completion(calls=[("done", {"summary": "fine"})]),
    ]
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double, max_corrections=1).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "fine")
    assert tool_results(openai_double.messages(-1)) == [
        "Error: there is no tool 'shell'; the tools are bash, read_file, write_file, done. "
        "Call the tool again with corrected arguments.",
        "exit code: 0\nstdout:\nfixed\n",
    ]


MALFORMED_ARGUMENTS = {
    "single quotes": "{'command': 'echo hi'}",
    "truncated": '{"command": "echo hi',
    "an array": '["echo hi"]',
    "a string": '"echo hi"',
}


def open_weights(double: OpenAIDouble, engine: str = "vllm") -> str:
    """A model the double serves as vLLM (or SGLang) does: past arguments parsed."""
    double.models["open-model"] = Model(engine=engine)  # type: ignore[arg-type]
    return "open-model"


@pytest.mark.hosts
@pytest.mark.parametrize("malformed", MALFORMED_ARGUMENTS)
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_malformed_arguments_go_back_as_an_empty_object_and_the_run_goes_on(
    openai_double: OpenAIDouble, agents_host: Host, malformed: str, engine: str
) -> None:
    """Before: the next request carried the raw text, vLLM/SGLang answered 400 to it (and
    to every later one), and the run ended `failed`, blamed on the arena."""
    raw = MALFORMED_ARGUMENTS[malformed]
    model = open_weights(openai_double, engine)
    openai_double.script = [
        completion(calls=[("bash", raw)]),
        completion(calls=[("bash", {"command": "echo fixed"})]),
        completion(calls=[("done", {"summary": "fine"})]),
    ]
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double, model=model).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "fine")
    assert openai_double.rejected == []
    sent = openai_double.messages(1)
    (turn,) = [m for m in sent if m["role"] == "assistant"]
    assert turn["tool_calls"][0]["function"]["arguments"] == "{}"
    (told,) = tool_results(sent)
    assert told.startswith("Error: ") and told.endswith(f"You sent: {raw}")
    first_call = next(e for e in entries(events) if e["kind"] == "tool_call")
    assert (first_call["arguments"], first_call["sent_arguments"]) == (raw, "{}")  # raw kept
    assert replay_messages(entries(events))[: len(openai_double.messages(-1))] == (
        openai_double.messages(-1)
    )


@pytest.mark.hosts
async def test_open_weights_quirks_are_taken_in_stride(
    plain_double: OpenAIDouble, agents_host: Host
) -> None:
    """What such providers do that api.openai.com does not, in one run: parallel calls
    (one to a tool that does not exist, with single-quoted arguments) under
    `finish_reason: "stop"` and without `usage`; a 503 and a 429 with Retry-After. Served
    directly (vLLM's own /v1), so there is no generation record to look the usage up in."""
    model = open_weights(plain_double)
    plain_double.script = [
        completion(
            calls=[("bash", {"command": "echo one"}), ("functions.bash", "{'command': 'x'}")],
            finish_reason="stop",
            usage=False,
            provider=None,
        ),
        error(503, "Service Unavailable", headers={"Retry-After": "0"}),
        rate_limited(0.1),
        completion(calls=[("done", {"summary": "ok"})]),
    ]
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(plain_double, model=model, max_corrections=0).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "ok")
    assert plain_double.rejected == []
    results = tool_results(plain_double.messages(-1))
    assert results[0] == "exit code: 0\nstdout:\none\n"
    assert results[1].startswith("Error: there is no tool 'functions.bash'")
    calls = next(m for m in plain_double.messages(-1) if m["role"] == "assistant")["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ['{"command": "echo one"}', "{}"]
    retries = [(e["error"], e["delay_s"]) for e in entries(events) if e["kind"] == "retry"]
    assert retries == [
        ("HTTP 503: Service Unavailable", 0.0),
        ("HTTP 429: Rate limit exceeded: free-models-per-min", 0.1),
    ]
    warnings = [e["content"] for e in entries(events) if e["kind"] == "warning"]
    assert "the LLM API reported no usage: tokens and cost unknown" in warnings


def provider_refusal(message: str, *, repeat: bool = False) -> Reply:
    """A 400 that OpenRouter passes on from a vLLM provider, in vLLM's shape."""
    raw = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    return error(400, "Provider returned error", repeat=repeat,
                 metadata={"provider_name": "DoubleVLLM", "raw": json.dumps(raw)})  # fmt: skip


@pytest.mark.hosts
async def test_a_refusal_of_the_models_own_reply_is_the_models(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    """The provider refuses the request carrying the model's newest turn and accepts it
    without: the turn is taken out (what it ran stays, as text), the run goes on; refused
    turns in a row end it as the player's failure, never the arena's."""
    openai_double.script = [
        completion(content="Looking.", calls=[("bash", {"command": "echo ran"})]),
        provider_refusal("Unterminated string starting at: line 1 column 13 (char 12)"),
        completion(calls=[("done", {"summary": "fine"})]),
    ]
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "fine")
    again = openai_double.messages(-1)
    assert [m["role"] for m in again] == ["system", "user", "user"]
    assert "the provider refused every request that carried it" in again[-1]["content"]
    assert "Unterminated string" in again[-1]["content"]
    assert "Its text: Looking." in again[-1]["content"]
    assert "returned:\nexit code: 0\nstdout:\nran\n" in again[-1]["content"]
    assert [e["kind"] for e in entries(events)].count("taken_out") == 1
    assert replay_messages(entries(events))[: len(again)] == again

    openai_double.script = [
        completion(calls=[("bash", {"command": "true"})]),
        provider_refusal("bad history"),
        completion(calls=[("bash", {"command": "true"})]),
        provider_refusal("bad history again"),
    ]
    outcome = await make_agent(openai_double, max_corrections=1).run(make_ctx(agents_host)[0])
    assert (outcome.terminal_state, outcome.failure_source) == ("failed", "player")
    assert outcome.terminal_detail.startswith(
        "model output unusable: the provider refused 2 of its replies in a row (last: HTTP 400"
    )


@pytest.mark.hosts
async def test_a_refusal_that_outlasts_the_models_reply_is_the_arenas(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(calls=[("bash", {"command": "true"})]),
        provider_refusal("model does not support tools", repeat=True),
    ]
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert (outcome.terminal_state, outcome.failure_source) == ("failed", "arena")
    assert "refused the request: HTTP 400" in outcome.terminal_detail
    assert "model does not support tools" in outcome.terminal_detail
    assert len(openai_double.requests) == 3  # the turn, then with and without the model's reply
    assert [e["kind"] for e in entries(events)].count("taken_out") == 1


@pytest.mark.hosts
@pytest.mark.parametrize(
    ("limits", "detail"),
    [
        (Limits(turns=2), "turn limit (2) reached"),
        (Limits(input_tokens=1000), "input token limit (1000) reached (1200 used)"),
        (Limits(output_tokens=500), "output token limit (500) reached (600 used)"),
        (Limits(cost_microusd=700), "cost limit (700 micro-USD) reached (800 micro-USD used)"),
    ],
)
async def test_each_spending_limit_ends_the_agent_naming_it(
    openai_double: OpenAIDouble, agents_host: Host, limits: Limits, detail: str
) -> None:
    openai_double.script = [
        completion(
            calls=[("bash", {"command": "true"})],
            prompt_tokens=600,
            completion_tokens=300,
            cost=0.0004,
            repeat=True,
        )
    ]
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double, limits=limits).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("terminated", detail)
    assert outcome.failure_source == "player"
    assert len(openai_double.requests) == 2
    assert len(usages(events)) == 2


@pytest.mark.hosts
async def test_the_wall_time_limit_ends_the_agent_mid_request(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [completion(calls=[("done", {"summary": "late"})], delay_s=3.0)]
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double, limits=Limits(wall_s=0.3)).run(ctx)
    assert (outcome.terminal_state, outcome.successful) == ("terminated", None)
    assert (outcome.terminal_detail, outcome.failure_source) == (
        "wall time limit (0.3s) reached",
        "player",
    )


@pytest.mark.hosts
async def test_feedback_reaches_the_model_and_the_transcript_replays_the_conversation(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(content="Looking.", calls=[("bash", {"command": "echo one; echo two >&2"})]),
        completion(calls=[("done", {"summary": "done"})]),
    ]
    ctx, events = make_ctx(agents_host)
    ctx.feedback.put_nowait("service-up failed: connection_refused nothing listens on 8080")
    outcome = await make_agent(openai_double).run(ctx)
    assert outcome.terminal_state == "completed"
    first = openai_double.messages(0)
    assert first[-1] == {
        "role": "user",
        "content": "Referee: service-up failed: connection_refused nothing listens on 8080",
    }
    sent = openai_double.messages(-1)
    assert tool_results(sent) == ["exit code: 0\nstdout:\none\n\nstderr:\ntwo\n"]
    replayed = replay_messages(entries(events))
    assert replayed[: len(sent)] == sent
    assert replayed[len(sent)]["tool_calls"][0]["function"]["name"] == "done"


@pytest.mark.hosts
async def test_an_unreachable_host_is_a_tool_error_and_the_agent_goes_on(
    openai_double: OpenAIDouble, host_factory: HostFactory, podman_driver: Any
) -> None:
    host = await host_factory("gone")
    await podman_driver.remove(host.name)
    openai_double.script = [
        completion(calls=[("bash", {"command": "systemctl status"})]),
        completion(calls=[("done", {"summary": "gave up on the host"})]),
    ]
    ctx, _ = make_ctx(host)
    outcome = await make_agent(openai_double).run(ctx)
    assert outcome.terminal_state == "completed"
    (result,) = tool_results(openai_double.messages(-1))
    assert result.startswith("Error: the host is not reachable right now (it may be rebooting)")


@pytest.mark.hosts
async def test_an_unpriced_model_has_null_cost_and_one_warning(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(calls=[("bash", {"command": "true"})]),
        completion(calls=[("bash", {"command": "true"})]),
        completion(calls=[("done", {"summary": "ok"})]),
    ]
    openai_double.models["lab/unpriced-7b"] = Model()
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double, model="lab/unpriced-7b").run(ctx)
    assert outcome.terminal_state == "completed"
    assert [u["cost_microusd"] for u in usages(events)] == [None, None, None]
    warnings = [e for e in entries(events) if e["kind"] == "warning"]
    assert len(warnings) == 1
    assert "no price known for lab/unpriced-7b" in warnings[0]["content"]


@pytest.mark.hosts
async def test_a_price_is_used_when_the_api_reports_no_cost(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(
            calls=[("done", {"summary": "ok"})], prompt_tokens=10_000, completion_tokens=1000
        )
    ]
    ctx, events = make_ctx(agents_host)
    price = Price(input_usd_per_mtok=0.4, output_usd_per_mtok=1.6)
    await make_agent(openai_double, price=price).run(ctx)
    assert usages(events)[0]["cost_microusd"] == 4000 + 1600


# --- provider behaviour: each defect of issue 15 -----------------------------------------


def test_a_200_can_still_be_an_error_or_unusable() -> None:
    inner = {"code": 502, "message": "Upstream error", "metadata": {"provider_name": "Acme",
             "raw": "connection reset"}}  # fmt: skip
    problem = read_completion({"error": inner})
    assert isinstance(problem, Problem) and problem.kind == "retry"
    assert "Upstream error (provider Acme): connection reset" in problem.why
    budget = read_completion({"error": {"code": 402, "message": "Insufficient credits"}})
    assert isinstance(budget, Problem) and budget.kind == "budget"
    assert isinstance(read_completion({"id": "g", "choices": []}), Problem)
    html = read_completion(None, "<html><body>502 Bad Gateway</body></html>")
    assert isinstance(html, Problem) and "not JSON" in html.why and "Bad Gateway" in html.why
    cut = {"choices": [{"message": {"content": "par"}, "finish_reason": "error",
                        "native_finish_reason": "overloaded"}], "id": "gen-1"}  # fmt: skip
    failed = read_completion(cut)
    assert isinstance(failed, Problem) and failed.generation_id == "gen-1"
    assert "native overloaded" in failed.why
    ok = read_completion({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                          "provider": "Acme", "model": "m-0731"})  # fmt: skip
    assert isinstance(ok, Completion) and (ok.provider, ok.model) == ("Acme", "m-0731")


def test_byok_cost_adds_the_upstream_bill_and_usage_extras_are_read() -> None:
    raw = {
        "prompt_tokens": 1000, "completion_tokens": 300, "cost": 0.0001, "is_byok": True,
        "cost_details": {"upstream_inference_cost": 0.002},
        "prompt_tokens_details": {"cached_tokens": 200, "cache_write_tokens": 50},
        "completion_tokens_details": {"reasoning_tokens": 120},
    }  # fmt: skip
    usage = usage_of(raw, None)
    assert usage.cost_microusd == 2100
    assert (usage.reasoning_tokens, usage.cache_write_tokens, usage.byok) == (120, 50, True)
    not_byok = usage_of({**raw, "is_byok": False}, None)
    assert not_byok.cost_microusd == 100  # upstream cost is inside `cost` then


def test_backoff_is_jittered_and_injectable() -> None:
    policy = RetryPolicy(initial_delay_s=2.0, max_delay_s=30.0, jitter=0.5)
    assert retry_delay(2, {}, policy, rand=lambda: 0.0) == 4.0
    assert retry_delay(2, {}, policy, rand=lambda: 1.0) == 2.0
    assert retry_delay(2, {"retry-after": "3"}, policy, rand=lambda: 1.0) == 3.0


def test_cached_tokens_do_not_count_at_full_weight_against_the_input_limit() -> None:
    spent = Spent()
    spent.add(Usage(10_000, 10, 9_000, None))
    assert (spent.input_tokens, spent.fresh_input_tokens) == (10_000, 1_000)
    assert limit_reached(Limits(input_tokens=5_000), spent) is None


def test_empty_turns_are_not_sent_back_and_calls_get_ids() -> None:
    assert assistant_message({"content": None}, []) is None
    assert assistant_message({"content": "  "}, None) is None
    call = {"id": "x", "type": "function", "function": {"name": "bash", "arguments": "{'a'"}}
    turn = assistant_message({"content": "", "reasoning_content": "r"}, [call])
    sent = {**call, "function": {"name": "bash", "arguments": "{}"}}  # not an object: {}
    assert turn == {"role": "assistant", "content": None, "tool_calls": [sent],
                    "reasoning_content": "r"}  # fmt: skip
    assert call["function"]["arguments"] == "{'a'"  # what the model wrote is kept
    calls = normalise_calls([{"id": "", "function": {"name": "bash", "arguments": "{}"}},
                             {"function": {"name": "done"}}], turn=4)  # fmt: skip
    assert [c["id"] for c in calls] == ["call_t4_0", "call_t4_1"]
    assert calls[1]["function"] == {"name": "done", "arguments": ""}
    as_object = normalise_calls([{"id": "a", "function": {"name": "bash",
                                 "arguments": {"command": "ls"}}}], turn=1)  # fmt: skip
    assert as_object[0]["function"]["arguments"] == '{"command": "ls"}'


@pytest.mark.parametrize("bad", ["-5", "0", "NaN", "Infinity"])
def test_a_bash_timeout_must_be_a_positive_finite_number(bad: str) -> None:
    with pytest.raises(ToolCallError, match="timeout_s"):
        parse_tool_arguments("bash", f'{{"command": "ls", "timeout_s": {bad}}}')


def test_long_output_keeps_head_and_tail_and_read_file_takes_a_range() -> None:
    text = "".join(f"line {n}\n" for n in range(10_000))
    cut = head_tail(text, 1000)
    assert cut.startswith("line 0\n") and cut.endswith("line 9999\n")
    assert "characters cut from the middle" in cut and len(cut) < 1100
    data = b"0123456789" * 10
    assert read_slice(data, 0, 1000) == data.decode()
    assert read_slice(data, 95, 10) == "56789\n[bytes 95-100 of 100; read on with offset=100]"
    assert read_slice(data, 10, 5).startswith("01234\n[bytes 10-15 of 100")
    assert parse_tool_arguments("read_file", '{"path": "/x", "offset": 3, "length": 2}')
    with pytest.raises(ToolCallError, match="offset"):
        parse_tool_arguments("read_file", '{"path": "/x", "offset": -1}')


def test_fit_sheds_old_outputs_then_old_turns_and_keeps_the_recent_ones() -> None:
    def turn(n: int) -> list[dict[str, Any]]:
        call = {
            "id": f"c{n}",
            "type": "function",
            "function": {
                "name": "write_file",
                "arguments": json.dumps({"path": "/f", "content": "x" * 4000}),
            },
        }
        return [{"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"c{n}", "content": "y" * 4000}]  # fmt: skip

    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for n in range(6):
        messages += turn(n)

    def estimate(m: list[dict[str, Any]]) -> int:
        return estimate_tokens(m, 4.0)

    before = estimate(messages)
    shed, dropped = fit(messages, before // 2, estimate)
    assert shed > 0 and dropped == 0 and estimate(messages) <= before // 2
    assert messages[-1]["content"] == "y" * 4000  # the latest output stays
    assert "removed to fit the context window" in messages[3]["content"]
    assert "removed to fit" in messages[2]["tool_calls"][0]["function"]["arguments"]
    shed, dropped = fit(messages, 2500, estimate)
    assert dropped > 0
    note = messages[2]["content"]
    assert note.startswith(f"[{dropped} earlier turns were removed to fit the context window]")
    assert "What they did, oldest first:\n- write_file /f" in note
    assert sum(1 for m in messages if m["role"] == "assistant") >= 2


async def test_preflight_refuses_a_key_with_no_credit_left(openai_double: OpenAIDouble) -> None:
    openai_double.key_limit_remaining = 0.0
    with pytest.raises(AgentConfigError, match="no credit left") as exc:
        await make_agent(openai_double).preflight()
    assert "\n" not in str(exc.value)


async def test_preflight_learns_the_window_and_refuses_an_unknown_model(
    openai_double: OpenAIDouble,
) -> None:
    openai_double.models["small"] = Model(context_length=4096, max_completion_tokens=1024)
    agent = make_agent(openai_double, model="small")
    await agent.preflight()
    assert agent.window() == 4096 and agent.openrouter
    nitro = make_agent(openai_double, model="small:nitro")  # a routing shortcut of `small`
    await nitro.preflight()
    assert nitro.window() == 4096
    with pytest.raises(AgentConfigError, match="'no/such-model' is not in"):
        await make_agent(openai_double, model="no/such-model").preflight()


async def test_a_cost_limit_that_cannot_be_enforced_refuses_to_start(
    plain_double: OpenAIDouble,
) -> None:
    limits = Limits(cost_microusd=2_000_000)
    with pytest.raises(AgentConfigError, match="cost limit but its cost cannot be known") as exc:
        await make_agent(plain_double, limits=limits).preflight()
    assert "\n" not in str(exc.value)
    priced = Price(input_usd_per_mtok=1, output_usd_per_mtok=2)
    await make_agent(plain_double, limits=limits, price=priced).preflight()


async def test_preflight_elsewhere_checks_the_key_with_models(plain_double: OpenAIDouble) -> None:
    agent = LlmAgent("m", endpoint=Endpoint(plain_double.base_url, "wrong", "MY_KEY"))
    with pytest.raises(AgentConfigError, match=r"refused the key from MY_KEY \(HTTP 401\)"):
        await agent.preflight()


@pytest.mark.hosts
async def test_a_text_only_reply_does_not_end_the_run(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(content="Let me check the unit status next."),
        completion(calls=[("done", {"summary": "checked"})]),
    ]
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "checked")
    sent = openai_double.messages(-1)
    assert sent[-2] == {"role": "assistant", "content": "Let me check the unit status next."}
    assert sent[-1]["role"] == "user" and "nothing was run" in sent[-1]["content"]


@pytest.mark.hosts
async def test_a_model_that_only_talks_is_nudged_a_bounded_number_of_times(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [completion(content="I think it is fine.", repeat=True)]
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double, max_nudges=2).run(ctx)
    assert (outcome.terminal_state, outcome.successful, outcome.failure_source) == (
        "failed", False, "player")  # fmt: skip
    assert outcome.terminal_detail.startswith("the model stopped using its tools: 3 replies")
    assert len(openai_double.requests) == 3


@pytest.mark.hosts
async def test_finish_reason_error_is_a_provider_failure_and_retried(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(
            content="Partial answ",
            finish_reason="error",
            native_finish_reason="MAX",
            usage=False,
            generation={"total_cost": 0.0004, "tokens_prompt": 900, "tokens_completion": 7},
        ),
        completion(calls=[("done", {"summary": "ok"})], cost=0.0001),
    ]
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "ok")
    retries = [e for e in entries(events) if e["kind"] == "retry"]
    assert len(retries) == 1 and "finish_reason error, native MAX" in retries[0]["error"]
    # The failed generation was billed: its usage comes from GET /generation and counts
    # (looked up in the background, so it may be reported after the next response's).
    assert openai_double.generation_requests == 1
    by_cost = {u["cost_microusd"]: u for u in usages(events)}
    assert sorted(by_cost) == [100, 400] and by_cost[400]["input_tokens"] == 900


@pytest.mark.hosts
async def test_a_length_cut_runs_nothing_and_retries_with_room(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(
            calls=[("write_file", '{"path": "/opt/records/app.py", "content": "imp')],
            finish_reason="length",
            completion_tokens=4096,
        ),
        completion(calls=[("done", {"summary": "ok"})]),
    ]
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "ok")
    first, second = openai_double.requests
    assert "max_tokens" not in first  # nothing asked for, nothing sent
    assert second["max_tokens"] == 8192
    sent = openai_double.messages(-1)
    assert tool_results(sent) == []  # the cut call was neither run nor blamed on the model
    assert "cut off at the output token limit" in sent[-1]["content"]


@pytest.mark.hosts
async def test_content_filter_cuts_are_bounded(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [completion(content="", finish_reason="content_filter", repeat=True)]
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double, max_corrections=1).run(ctx)
    assert (outcome.terminal_state, outcome.failure_source) == ("failed", "player")
    assert "finish_reason content_filter" in outcome.terminal_detail
    assert len(openai_double.requests) == 2


@pytest.mark.hosts
@pytest.mark.parametrize("style", ["deepseek", "signed"])
async def test_reasoning_goes_back_unchanged_and_is_kept_in_the_transcript(
    openai_double: OpenAIDouble, agents_host: Host, style: str
) -> None:
    openai_double.models["thinker"] = Model(reasoning_model=style)  # type: ignore[arg-type]
    details = [{"type": "reasoning.encrypted", "data": "c2lnbmVk", "id": "r1", "index": 0}]
    fields: dict[str, Any] = (
        {"reasoning_content": "The unit must be checked first."}
        if style == "deepseek"
        else {"reasoning": "Check the unit.", "reasoning_details": details}
    )
    openai_double.script = [
        completion(calls=[("bash", {"command": "true"})], model="thinker", **fields),
        completion(calls=[("bash", {"command": "true"})], model="thinker", **fields),
        completion(calls=[("done", {"summary": "ok"})], model="thinker"),
    ]
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double, model="thinker").run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "ok")
    assert openai_double.rejected == []
    turns = [m for m in openai_double.messages(-1) if m["role"] == "assistant"]
    assert all({k: t[k] for k in fields} == fields for t in turns)
    said = [e for e in entries(events) if e["kind"] == "assistant"]
    assert all({k: e[k] for k in fields} == fields for e in said[:2])
    assert replay_messages(entries(events))[: len(openai_double.messages(-1))] == (
        openai_double.messages(-1)
    )


@pytest.mark.hosts
async def test_an_empty_turn_is_never_sent_back(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(content=None),
        completion(calls=[("done", {"summary": "ok"})]),
    ]
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "ok")
    assert openai_double.rejected == []
    assert all(m["role"] != "assistant" for m in openai_double.messages(-1))


@pytest.mark.hosts
async def test_tool_calls_without_ids_get_ids(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(
            calls=[("bash", {"command": "echo a"}), ("bash", {"command": "echo b"})], call_ids=False
        ),
        completion(calls=[("done", {"summary": "ok"})]),
    ]
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert outcome.terminal_detail == "ok" and openai_double.rejected == []
    sent = openai_double.messages(-1)
    ids = [c["id"] for c in sent[2]["tool_calls"]]
    assert len(set(ids)) == 2 and all(ids)
    assert [m["tool_call_id"] for m in sent[3:5]] == ids


@pytest.mark.hosts
@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (error_in_200(502, "Provider returned error",
                      metadata={"provider_name": "Acme", "raw": "upstream reset"}),
         "Provider returned error (provider Acme): upstream reset"),
        (no_choices(), "no choices"),
        (html_page(), "not JSON"),
        (error(503, "No allowed providers are available for the selected model",
               headers={"Retry-After": "0"}), "HTTP 503"),
        (error(408, "Request timed out"), "HTTP 408"),
    ],
)  # fmt: skip
async def test_errors_in_any_shape_are_retried(
    openai_double: OpenAIDouble, agents_host: Host, bad: Any, words: str
) -> None:
    openai_double.script = [bad, completion(calls=[("done", {"summary": "ok"})])]
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "ok")
    (retry,) = [e for e in entries(events) if e["kind"] == "retry"]
    assert words in retry["error"]


@pytest.mark.hosts
async def test_a_402_is_the_competitors_budget_not_the_arenas_failure(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        error(402, "Insufficient credits", metadata={"limit_source": "openrouter_key_limit"})
    ]
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert (outcome.terminal_state, outcome.failure_source) == ("terminated", "player")
    assert outcome.terminal_detail.startswith("the API key's credits are used up (HTTP 402)")
    assert len(openai_double.requests) == 1


@pytest.mark.hosts
async def test_routing_reasoning_and_temperature_are_sent_and_the_server_recorded(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(calls=[("bash", {"command": "true"})], provider="DeepInfra",
                   model="double-model-0731", reasoning_tokens=40, cost=0.0001),
        completion(calls=[("done", {"summary": "ok"})], provider="Chutes"),
    ]  # fmt: skip
    routing = ProviderRouting(order=["deepinfra/fp8"], allow_fallbacks=False,
                              quantizations=["fp8"], data_collection="deny")  # fmt: skip
    agent = make_agent(
        openai_double, provider=routing, reasoning=Reasoning(effort="low"), temperature=0.2,
        extra_body={"top_p": 0.9},
    )  # fmt: skip
    ctx, events = make_ctx(agents_host)
    assert (await agent.run(ctx)).terminal_detail == "ok"
    body = openai_double.requests[0]
    assert body["provider"] == {
        "order": ["deepinfra/fp8"],
        "allow_fallbacks": False,
        "quantizations": ["fp8"],
        "data_collection": "deny",
    }
    assert (body["reasoning"], body["temperature"], body["top_p"]) == ({"effort": "low"}, 0.2, 0.9)
    assert "usage" not in body  # `usage: {include: true}` is deprecated and has no effect
    served = [(e.get("provider"), e.get("served_model")) for e in entries(events)
              if e["kind"] == "assistant"]  # fmt: skip
    assert served == [("DeepInfra", "double-model-0731"), ("Chutes", "double-model")]
    extras = [e for e in entries(events) if e["kind"] == "usage"]
    assert extras[0]["reasoning_tokens"] == 40


@pytest.mark.hosts
async def test_openrouter_only_fields_are_not_sent_elsewhere(
    plain_double: OpenAIDouble, agents_host: Host
) -> None:
    plain_double.script = [completion(calls=[("done", {"summary": "ok"})])]
    agent = make_agent(plain_double, provider=ProviderRouting(order=["x"]),
                       reasoning=Reasoning(effort="high"))  # fmt: skip
    ctx, _ = make_ctx(agents_host)
    assert (await agent.run(ctx)).terminal_detail == "ok"
    body = plain_double.requests[0]
    assert "provider" not in body and "reasoning" not in body
    assert body["reasoning_effort"] == "high"


@pytest.mark.hosts
async def test_one_bad_call_among_good_ones_is_not_a_correction(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(calls=[("bash", {"command": "echo good"}), ("bash", '{"command": ')]),
        completion(calls=[("done", {"summary": "ok"})]),
    ]
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double, max_corrections=0).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "ok")
    results = tool_results(openai_double.messages(-1))
    assert results[0].startswith("exit code: 0") and "not valid JSON" in results[1]


@pytest.mark.hosts
async def test_bash_is_non_interactive_and_long_output_keeps_its_tail(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(calls=[
            ("bash", {"command": 'echo "$PAGER|$SYSTEMD_PAGER|$DEBIAN_FRONTEND"'}),
            ("bash", {"command": "seq 1 100000; echo 'E: the real error' >&2"}),
            ("read_file", {"path": "/etc/os-release", "offset": 0, "length": 10}),
        ]),
        completion(calls=[("done", {"summary": "ok"})]),
    ]  # fmt: skip
    ctx, _ = make_ctx(agents_host)
    await make_agent(openai_double).run(ctx)
    env, seq, part = tool_results(openai_double.messages(-1))
    assert env == "exit code: 0\nstdout:\ncat||noninteractive\n"
    assert "\n1\n2\n" in seq and seq.endswith("stderr:\nE: the real error\n")
    assert "\n100000\n" in seq and "characters cut from the middle" in seq
    assert part.startswith("PRETTY_NAM") and "read on with offset=10" in part


def _big_output_turns(n: int) -> list[Any]:
    return [
        completion(
            calls=[("bash", {"command": f"printf 'step {i} %.0s' $(seq 1 400)"})],
        )
        for i in range(n)
    ]


@pytest.mark.hosts
async def test_a_long_session_stays_inside_a_small_window(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.models["small"] = Model(context_length=6000, max_completion_tokens=1000)
    openai_double.script = [*_big_output_turns(12), completion(calls=[("done", {"summary": "ok"})])]
    agent = make_agent(openai_double, model="small")
    await agent.preflight()  # learns the window from the model list
    ctx, events = make_ctx(agents_host)
    outcome = await agent.run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "ok")
    assert openai_double.rejected == []
    assert all(openai_double.prompt_tokens(r) <= 6000 for r in openai_double.requests)
    assert any(e["kind"] == "context" for e in entries(events))
    assert "step 11" in tool_results(openai_double.messages(-1))[-1]


@pytest.mark.hosts
async def test_a_context_length_error_is_recovered_from_not_blamed_on_the_arena(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.models["small"] = Model(context_length=6000)
    openai_double.script = [*_big_output_turns(8), completion(calls=[("done", {"summary": "ok"})])]
    # The settings claim a window far larger than the model's: the back end says no.
    agent = make_agent(openai_double, model="small", context_window=100_000)
    ctx, _ = make_ctx(agents_host)
    outcome = await agent.run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "ok")
    assert openai_double.rejected, "the window was passed at least once"
    assert "maximum context length is 6000" in openai_double.rejected[0][1]


def test_request_fields_fit_the_endpoint() -> None:
    common: dict[str, Any] = {
        "temperature": None, "reasoning": Reasoning(max_tokens=2000, exclude=True),
        "provider": ProviderRouting(only=["a"]), "extra_body": {},
    }  # fmt: skip
    assert request_fields(max_out=None, openai=False, openrouter=False, **common) == {}
    assert request_fields(max_out=900, openai=True, openrouter=False, **common) == {
        "max_completion_tokens": 900
    }
    assert request_fields(max_out=900, openai=False, openrouter=True, **common) == {
        "max_tokens": 900,
        "reasoning": {"max_tokens": 2000, "exclude": True},
        "provider": {"only": ["a"]},
    }


@pytest.mark.hosts
async def test_a_persistent_shell_keeps_cwd_and_environment(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(calls=[("bash", {"command": "cd /etc && export GREETING='hi there'; exit 3"}),
                          ("bash", {"command": 'pwd; echo "$GREETING"'}),
                          ("bash", {"command": "sleep 30 & echo started", "timeout_s": 2})]),
        completion(calls=[("done", {"summary": "ok"})]),
    ]  # fmt: skip
    ctx, _ = make_ctx(agents_host)
    outcome = await make_agent(openai_double, persistent_shell=True).run(ctx)
    assert outcome.terminal_detail == "ok"
    first, second, third = tool_results(openai_double.messages(-1))
    assert first == "exit code: 3"
    assert second == "exit code: 0\nstdout:\n/etc\nhi there\n"
    # A background job holding stdout does not hold the call (at most until its timeout).
    assert third.startswith("exit code: ") and "started" in third
    openai_double.script = [
        completion(calls=[("bash", {"command": 'pwd; echo "[$GREETING]"'})]),
        completion(calls=[("done", {"summary": "ok"})]),
    ]
    ctx, _ = make_ctx(agents_host)
    await make_agent(openai_double).run(ctx)  # not persistent: a fresh shell
    (fresh,) = tool_results(openai_double.messages(-1))
    assert fresh == "exit code: 0\nstdout:\n/\n[]\n"
    await agents_host.exec("rm -f /run/opsarena-llm-shell.env", timeout=10)


@pytest.mark.hosts
async def test_a_timed_out_request_is_resent_and_its_unknown_usage_warned(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.script = [
        completion(calls=[("done", {"summary": "late"})], delay_s=2.0),
        completion(calls=[("done", {"summary": "ok"})]),
    ]
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double, request_timeout_s=0.5).run(ctx)
    assert outcome.terminal_detail == "ok"
    assert [e["error"] for e in entries(events) if e["kind"] == "retry"] == ["request timed out"]
    warnings = [e["content"] for e in entries(events) if e["kind"] == "warning"]
    assert any("may have billed it" in w for w in warnings)


@pytest.mark.hosts
async def test_streaming_reassembles_replies_and_takes_usage_from_the_last_chunk(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    openai_double.models["thinker"] = Model(reasoning_model="deepseek")
    openai_double.script = [
        completion(content="Looking first.", reasoning_content="Think about the unit.",
                   calls=[("bash", {"command": "echo streamed"})], model="thinker",
                   prompt_tokens=500, completion_tokens=60, cost=0.0007),
        error_in_200(502, "Provider returned error", metadata={"provider_name": "Acme"}),
        completion(calls=[("done", {"summary": "ok"})], model="thinker", cost=0.0001),
    ]  # fmt: skip
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double, model="thinker", stream=True).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "ok")
    assert all(r["stream"] is True for r in openai_double.requests)
    assert openai_double.rejected == []  # the reasoning went back whole
    sent = openai_double.messages(-1)
    assert sent[2]["content"] == "Looking first."
    assert sent[2]["reasoning_content"] == "Think about the unit."
    assert sent[2]["tool_calls"][0]["function"]["arguments"] == '{"command": "echo streamed"}'
    assert tool_results(sent) == ["exit code: 0\nstdout:\nstreamed\n"]
    assert usages(events)[0]["cost_microusd"] == 700
    (retry,) = [e for e in entries(events) if e["kind"] == "retry"]
    assert "error in the stream: Provider returned error (provider Acme)" in retry["error"]


@pytest.mark.hosts
async def test_a_stalled_stream_is_resent_and_its_billed_usage_looked_up(
    openai_double: OpenAIDouble, agents_host: Host
) -> None:
    stalled = completion(calls=[("done", {"summary": "late"})], cost=0.0003)
    stalled.stall_s = 3.0
    openai_double.script = [stalled, completion(calls=[("done", {"summary": "ok"})], cost=0.0001)]
    ctx, events = make_ctx(agents_host)
    agent = make_agent(openai_double, stream=True, request_timeout_s=0.5)
    outcome = await agent.run(ctx)
    assert outcome.terminal_detail == "ok"
    (retry,) = [e for e in entries(events) if e["kind"] == "retry"]
    assert retry["error"].startswith("request timed out (mid-stream, generation gen-")
    assert openai_double.generation_requests == 1
    assert sorted(u["cost_microusd"] for u in usages(events)) == [100, 300]


def test_dropped_turns_leave_a_digest_of_what_they_ran() -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "systemctl status records"}'},
    }
    turns = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "exit code: 3\nstdout:\ninactive"},
        {"role": "user", "content": "Referee: service-up failed: connection_refused"},
    ]  # fmt: skip
    assert digest(turns) == [
        "- bash systemctl status records -> exit code: 3",
        "- Referee: service-up failed: connection_refused",
    ]


# --- usage of failed generations, from OpenRouter's generation records -------------------

NO_HOST = cast(Host, None)
"""For runs whose model never calls a host tool."""
QUICK_LOOKUPS = (0.2, 0.2, 0.2, 0.2)


def failed_generation(**more: Any) -> Any:
    """A generation that failed after the provider billed it: no usage in the response,
    the usage only in OpenRouter's record of it."""
    return completion(
        content="Partial answ",
        finish_reason="error",
        usage=False,
        generation={"total_cost": 0.0004, "tokens_prompt": 900, "tokens_completion": 7},
        **more,
    )


async def test_a_failed_generations_usage_is_looked_up_again_until_recorded_without_waiting(
    openai_double: OpenAIDouble,
) -> None:
    # OpenRouter answers 404 until it has recorded a generation, seconds after it ended.
    openai_double.script = [
        failed_generation(generation_404s=2),
        completion(calls=[("done", {"summary": "ok"})], cost=0.0001),
    ]
    ctx, events = make_ctx(NO_HOST)
    agent = make_agent(openai_double, generation_lookup_delays_s=QUICK_LOOKUPS)
    outcome = await agent.run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == ("completed", "ok")
    assert [status for _, status, _ in openai_double.generation_log] == [404, 404, 200]
    # The retry went out long before the record was found: the lookup did not hold the turn.
    found_at = openai_double.generation_log[-1][2]
    assert openai_double.completion_times[1] < found_at - 0.3
    # Found after the last turn, it is still reported before the run ends, and counted.
    by_cost = {u["cost_microusd"]: u for u in usages(events)}
    assert sorted(by_cost) == [100, 400] and by_cost[400]["input_tokens"] == 900
    (entry,) = [e for e in entries(events) if e["kind"] == "usage"]
    assert entry["from_generation"] is True
    assert entry["generation"] == openai_double.generation_log[0][0]
    assert not [e for e in entries(events) if e["kind"] == "warning"]


async def test_usage_found_later_counts_against_the_cost_limit(
    openai_double: OpenAIDouble,
) -> None:
    openai_double.script = [
        failed_generation(generation_404s=1),
        completion(content="Thinking it over.", cost=0.00001, delay_s=0.6),
        completion(calls=[("done", {"summary": "too late"})]),
    ]
    ctx, _ = make_ctx(NO_HOST)
    agent = make_agent(
        openai_double, limits=Limits(cost_microusd=300), generation_lookup_delays_s=QUICK_LOOKUPS
    )
    outcome = await agent.run(ctx)
    assert (outcome.terminal_state, outcome.failure_source) == ("terminated", "player")
    assert outcome.terminal_detail.startswith("cost limit (300 micro-USD) reached (410 micro-USD")
    assert len(openai_double.requests) == 2


async def test_a_generation_never_recorded_is_asked_a_bounded_number_of_times_then_warned(
    openai_double: OpenAIDouble,
) -> None:
    openai_double.script = [
        failed_generation(generation_404s=100),
        completion(calls=[("done", {"summary": "ok"})], cost=0.0001),
    ]
    ctx, events = make_ctx(NO_HOST)
    agent = make_agent(openai_double, generation_lookup_delays_s=(0.05, 0.05, 0.05))
    outcome = await agent.run(ctx)
    assert outcome.terminal_detail == "ok"
    assert [status for _, status, _ in openai_double.generation_log] == [404, 404, 404]
    assert [u["cost_microusd"] for u in usages(events)] == [100]
    (warning,) = [e["content"] for e in entries(events) if e["kind"] == "warning"]
    assert "OpenRouter had no record of it after 3 lookups" in warning


async def test_generation_lookups_give_up_at_once_when_asking_again_cannot_help(
    openai_double: OpenAIDouble,
) -> None:
    wrong_key = Endpoint(openai_double.base_url, "wrong", "test", True)
    found = await lookup_generation(wrong_key, "gen-x", 5.0, (0.0, 0.0, 0.0))
    assert found is None and openai_double.generation_requests == 1  # a 401: once
    right_key = Endpoint(openai_double.base_url, API_KEY, "test", True)
    assert await lookup_generation(right_key, "gen-unknown", 5.0, (0.0, 0.0)) is None
    assert openai_double.generation_requests == 3  # a 404 is asked again


async def test_a_conversation_that_never_fits_fails_on_the_fourth_context_error(
    openai_double: OpenAIDouble,
) -> None:
    # The brief alone is past the window: shedding can never make the request fit.
    openai_double.models["tiny"] = Model(context_length=2000)
    openai_double.script = [completion(calls=[("done", {"summary": "unreachable"})])]
    ctx, _ = recording_context(NO_HOST, brief="Deploy it. " * 1000)
    outcome = await make_agent(openai_double, model="tiny").run(ctx)
    assert (outcome.terminal_state, outcome.successful, outcome.failure_source) == (
        "failed", False, "player")  # fmt: skip
    assert "(4 context-length errors in a row)" in outcome.terminal_detail
    # max_context_recoveries (3) recoveries, then the fourth error ends the run.
    assert len(openai_double.rejected) == 4 and openai_double.requests == []
