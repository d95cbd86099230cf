"""The strict double refuses what the real back ends refuse, with their status and body.

Many llm agent tests assert `double.rejected == []`: that proves something only if the
double's checks fire. Here each invalid request is sent over HTTP, and the answer is
compared with what the real service sends: api.openai.com's error object (`message`,
`type`, `param`, `code`) for the `openai` flavour; for `openrouter`, OpenRouter's own
`{"error": {code, message}}` when the router itself refuses (the window), and "Provider
returned error" with `metadata.provider_name` and the provider's body in `metadata.raw`
when the model's provider refuses (the conversation, the reasoning). A valid variant of
each request is answered 200, so the checks are not simply refusing everything. The
agent's own reading of each answer (`wire.classify_status`) is checked too.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx
import pytest

from opsarena.agents.llm.wire import classify_status, error_text, window_from_error
from tests.agents.openai_double import API_KEY, Model, OpenAIDouble, completion

Flavour = Literal["openrouter", "openai"]
FLAVOURS: list[Flavour] = ["openrouter", "openai"]
SYSTEM = {"role": "system", "content": "You are a test."}
USER = {"role": "user", "content": "Begin."}


@asynccontextmanager
async def serving(flavour: Flavour) -> AsyncIterator[OpenAIDouble]:
    double = OpenAIDouble(flavour)
    await double.start()
    try:
        yield double
    finally:
        await double.stop()


def call(call_id: str, command: str = "true") -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}


def result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "exit code: 0"}


async def post(
    double: OpenAIDouble, messages: list[dict[str, Any]], model: str = "double-model", **more: Any
) -> httpx.Response:
    body = {"model": model, "messages": messages, **more}
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(
            f"{double.base_url}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {API_KEY}"},
        )


def openai_error(body: Any) -> dict[str, Any]:
    """The error object of api.openai.com's shape (and of DeepSeek's, which copies it)."""
    assert isinstance(body, dict) and set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return dict(error)


def refusal(response: httpx.Response, flavour: Flavour) -> tuple[str | None, Any]:
    """A provider's refusal as the flavour sends it: (the provider OpenRouter names or None
    for api.openai.com, the provider's own error body)."""
    assert response.status_code == 400
    body = response.json()
    if flavour == "openai":
        return None, body
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"code", "message", "metadata"}
    assert (error["code"], error["message"]) == (400, "Provider returned error")
    assert set(error["metadata"]) == {"provider_name", "raw"}
    assert isinstance(error["metadata"]["raw"], str)  # the provider's body, as a string
    return error["metadata"]["provider_name"], json.loads(error["metadata"]["raw"])


def agent_reads(response: httpx.Response) -> str:
    """What the agent makes of the answer (the SDK hands it the `error` object, or the
    whole body when there is none, as SGLang sends it)."""
    body = response.json()
    return classify_status(response.status_code, error_text(body.get("error", body)))


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_null_content_assistant_turn_without_tool_calls_is_refused(
    flavour: Flavour,
) -> None:
    async with serving(flavour) as double:
        double.script = [completion(content="fine")]
        refused = await post(double, [SYSTEM, USER, {"role": "assistant", "content": None}, USER])
        provider, raw = refusal(refused, flavour)
        assert provider in (None, "DoubleCloud")
        assert openai_error(raw) == {
            "message": "Invalid value for 'content': expected a string, got null.",
            "type": "invalid_request_error",
            "param": "messages.[2].content",
            "code": None,
        }
        assert agent_reads(refused) == "refused"
        assert double.requests == [] and len(double.rejected) == 1
        assert len(double.script) == 1  # a refused request uses up no reply

        empty = await post(double, [SYSTEM, USER, {"role": "assistant", "content": ""}, USER])
        _, raw = refusal(empty, flavour)
        assert "must have either content or tool_calls" in openai_error(raw)["message"]

        said = await post(double, [SYSTEM, USER, {"role": "assistant", "content": "ok"}, USER])
        assert said.status_code == 200 and said.json()["choices"][0]["message"]["content"] == "fine"


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_tool_calls_without_their_results_are_refused(flavour: Flavour) -> None:
    turn = {"role": "assistant", "content": None, "tool_calls": [call("call_a"), call("call_b")]}
    async with serving(flavour) as double:
        double.script = [completion(content="fine")]
        missing = await post(double, [SYSTEM, USER, turn, result("call_a"), USER])
        _, raw = refusal(missing, flavour)
        error = openai_error(raw)
        assert error["message"] == (
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            "response messages: call_b"
        )
        assert (error["param"], error["code"]) == ("messages.[4].role", None)
        assert agent_reads(missing) == "refused"

        at_the_end = await post(double, [SYSTEM, USER, turn, result("call_a")])
        _, raw = refusal(at_the_end, flavour)
        assert openai_error(raw)["param"] == "messages"

        stray = await post(double, [SYSTEM, USER, result("call_z")])
        _, raw = refusal(stray, flavour)
        error = openai_error(raw)
        assert error["message"].startswith("Invalid parameter: messages with role 'tool' must be")
        assert error["param"] == "messages.[2].role"

        no_id = {"role": "assistant", "content": None, "tool_calls": [call("")]}
        unnamed = await post(double, [SYSTEM, USER, no_id, result("")])
        _, raw = refusal(unnamed, flavour)
        assert openai_error(raw)["code"] == "empty_string"

        assert double.requests == [] and len(double.rejected) == 4
        answered = await post(double, [SYSTEM, USER, turn, result("call_a"), result("call_b")])
        assert answered.status_code == 200


MALFORMED = {
    "single quotes": ("{'command': 'ls'}", "Expecting property name enclosed in double quotes"),
    "truncated": ('{"command": "ls', "Unterminated string starting at: line 1 column 13"),
    "an array": ('["ls"]', "Can only get item pairs from a mapping."),
    "a string": ('"ls"', "Can only get item pairs from a mapping."),
}


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_open_weights_servers_refuse_past_arguments_that_are_not_an_object(
    flavour: Flavour, engine: Literal["vllm", "sglang"]
) -> None:
    """vLLM and SGLang parse every past call's arguments to render the chat template;
    api.openai.com takes any string (the `openai` engine, still checked here)."""
    async with serving(flavour) as double:
        double.models["open-model"] = Model(engine=engine)
        double.script = [completion(content="fine", repeat=True)]
        for arguments, message in MALFORMED.values():
            bad = call("call_a")
            bad["function"]["arguments"] = arguments
            turn = {"role": "assistant", "content": None, "tool_calls": [bad]}
            conversation = [SYSTEM, USER, turn, result("call_a"), USER]
            refused = await post(double, conversation, "open-model")
            provider, raw = refusal(refused, flavour)
            assert provider in (None, f"Double{engine.upper()}")
            if engine == "vllm":  # {"error": {...}}, as vllm#43995 shows it
                assert set(raw) == {"error"} and raw["error"]["code"] == 400
                error = raw["error"]
            else:  # SGLang's flat ErrorResponse
                assert raw["object"] == "error" and raw["code"] == 400
                error = raw
            assert error["type"] == "BadRequestError" and error["message"].startswith(message)
            assert agent_reads(refused) == "refused"
            # The same conversation is fine for a model api.openai.com serves.
            assert (await post(double, conversation)).status_code == 200
        for fine in ("{}", "", '{"command": "ls"}'):
            good = call("call_a")
            good["function"]["arguments"] = fine
            turn = {"role": "assistant", "content": None, "tool_calls": [good]}
            answered = await post(double, [SYSTEM, USER, turn, result("call_a")], "open-model")
            assert answered.status_code == 200, fine
        assert len(double.rejected) == len(MALFORMED)


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_thinking_turn_sent_back_without_its_reasoning_content_is_refused(
    flavour: Flavour,
) -> None:
    async with serving(flavour) as double:
        double.models["thinker"] = Model(reasoning_model="deepseek")
        thought = "The unit must be checked first."
        double.script = [
            completion(calls=[("bash", {"command": "true"})], model="thinker",
                       reasoning_content=thought),
            completion(content="fine", model="thinker"),
        ]  # fmt: skip
        first = await post(double, [SYSTEM, USER], model="thinker")
        assert first.status_code == 200
        served = first.json()["choices"][0]["message"]
        turn = {"role": "assistant", "content": None, "tool_calls": served["tool_calls"]}
        answer = result(served["tool_calls"][0]["id"])

        refused = await post(double, [SYSTEM, USER, turn, answer], model="thinker")
        provider, raw = refusal(refused, flavour)
        assert provider in (None, "DeepSeek")
        assert openai_error(raw) == {
            "message": "The reasoning_content in the thinking mode must be passed back to the API.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_request_error",
        }
        assert agent_reads(refused) == "refused"

        whole = {**turn, "reasoning_content": thought}
        again = await post(double, [SYSTEM, USER, whole, answer], model="thinker")
        assert again.status_code == 200 and len(double.rejected) == 1


async def test_a_signed_thinking_turn_sent_back_altered_is_refused_by_its_provider() -> None:
    async with serving("openrouter") as double:
        double.models["claude"] = Model(reasoning_model="signed")
        details = [{"type": "reasoning.encrypted", "data": "c2lnbmVk", "id": "r1", "index": 0}]
        double.script = [
            completion(calls=[("bash", {"command": "true"})], model="claude",
                       reasoning="Check the unit.", reasoning_details=details),
            completion(content="fine", model="claude"),
        ]  # fmt: skip
        served = (await post(double, [SYSTEM, USER], model="claude")).json()["choices"][0]
        calls = served["message"]["tool_calls"]
        answer = result(calls[0]["id"])
        altered = [{**details[0], "data": "Zm9yZ2Vk"}]
        turn = {"role": "assistant", "content": None, "tool_calls": calls,
                "reasoning": "Check the unit.", "reasoning_details": altered}  # fmt: skip

        refused = await post(double, [SYSTEM, USER, turn, answer], model="claude")
        provider, raw = refusal(refused, "openrouter")
        assert provider == "Anthropic"
        assert raw["type"] == "error" and raw["error"]["type"] == "invalid_request_error"
        assert "thinking block" in raw["error"]["message"]
        assert agent_reads(refused) == "refused"

        unchanged = {**turn, "reasoning_details": details}
        again = await post(double, [SYSTEM, USER, unchanged, answer], model="claude")
        assert again.status_code == 200


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_conversation_past_the_window_is_refused_with_the_window_named(
    flavour: Flavour,
) -> None:
    async with serving(flavour) as double:
        double.models["small"] = Model(context_length=300)
        double.script = [completion(content="fine", model="small")]
        long = {"role": "user", "content": "x" * 2000}
        refused = await post(double, [SYSTEM, long], model="small")
        assert refused.status_code == 400
        body = refused.json()
        if flavour == "openai":
            error = openai_error(body)
            assert (error["param"], error["code"]) == ("messages", "context_length_exceeded")
            assert error["message"].startswith("This model's maximum context length is 300 tokens.")
        else:  # OpenRouter's own check, before any provider: no metadata
            assert set(body["error"]) == {"code", "message"} and body["error"]["code"] == 400
            assert body["error"]["message"].startswith(
                "This endpoint's maximum context length is 300 tokens. However, you requested "
                "about 5"
            )
        assert agent_reads(refused) == "context"
        assert window_from_error(error_text(body["error"])) == 300

        fits = [SYSTEM, {"role": "user", "content": "x" * 400}]
        assert (await post(double, fits, model="small", max_tokens=250)).status_code == 400
        assert double.requests == [] and len(double.rejected) == 2
        assert (await post(double, fits, model="small", max_tokens=100)).status_code == 200


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_bad_key_gets_the_flavours_401(flavour: Flavour) -> None:
    async with serving(flavour) as double, httpx.AsyncClient(timeout=30) as http:
        body = {"model": "double-model", "messages": [USER]}
        answer = await http.post(
            f"{double.base_url}/chat/completions", json=body,
            headers={"Authorization": "Bearer wrong"},
        )  # fmt: skip
    assert answer.status_code == 401
    if flavour == "openai":
        assert openai_error(answer.json())["code"] == "invalid_api_key"
    else:
        assert answer.json() == {"error": {"code": 401, "message": "User not found."}}
    assert classify_status(401, error_text(answer.json()["error"])) == "auth"
