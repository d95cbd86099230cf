"""The llm agent: its decisions directly, and whole runs against the OpenAI test double on
real hosts (the double stands in for the paid API; everything else is real)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.agents.contexts import Events, recording_context
from tests.agents.openai_double import (
    API_KEY,
    Model,
    OpenAIDouble,
    completion,
    error,
    openai_double,
    plain_double,
)
from tests.agents.records_service import (
    APP,
    APP_PATH,
    UNIT,
    UNIT_PATH,
    WAIT_HEALTHY,
    agents_host,
    assert_durable,
)
from tests.conftest import HostFactory

from opsarena.agents import AgentContext
from opsarena.agents.llm import (
    Endpoint,
    LlmAgent,
    RetryPolicy,
    Spent,
    ToolCallError,
    Usage,
    builtin_prices,
    limit_reached,
    parse_retry_after,
    parse_tool_arguments,
    priced_cost_microusd,
    replay_messages,
    resolve_endpoint,
    retry_delay,
    usage_of,
)
from opsarena.agents.spec import (
    AgentSettings,
    Limits,
    Price,
    find_price,
)
from opsarena.errors import AgentConfigError
from opsarena.hosts import Host

__all__ = ["agents_host", "openai_double", "plain_double"]  # fixtures

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
        error(429, "rate limited", headers={"Retry-After": "0.2"}),
        completion(calls=[("done", {"summary": "ok"})]),
    ]
    ctx, events = make_ctx(agents_host)
    outcome = await make_agent(openai_double).run(ctx)
    assert (outcome.terminal_state, outcome.successful) == ("completed", True)
    assert len(openai_double.requests) == 2
    retries = [e for e in entries(events) if e["kind"] == "retry"]
    assert [(r["delay_s"], r["error"]) for r in retries] == [(0.2, "HTTP 429: rate limited")]
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
