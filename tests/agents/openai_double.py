"""A stand-in for a remote, paid LLM API: a real HTTP server on 127.0.0.1, strict like the
real back ends.

Two flavours. `openrouter` (the default) serves OpenRouter's API under /api/v1:
POST /chat/completions, a public GET /models, GET /key (401 for a bad key, the key's
limit otherwise) and GET /generation?id=. `openai` serves /v1 the way api.openai.com
does: GET /models needs the key, there is no /key, and OpenRouter-only request fields
are refused.

Requests are *validated* as real back ends do, and a bad one gets the 400 they send:
an assistant turn with neither content nor tool calls; tool calls without ids or without
a tool result for each; a tool result for no call; a reasoning model's tool-call turn
sent back without its reasoning (`reasoning_model="deepseek"`: DeepSeek's thinking mode;
`"signed"`: the `reasoning_details` Claude and Gemini need back); a conversation past
the model's window (the double's tokenizer: 4 characters of JSON a token); both
`max_tokens` and `max_completion_tokens`; an unknown field in `provider` or `reasoning`;
for a model served by vLLM or SGLang (`Model(engine=...)`), a past tool call whose
`function.arguments` is not a JSON object (api.openai.com takes any string), answered in
that server's own error shape.
A rejected request does not use up a scripted reply. The 400's body has the flavour's
shape: api.openai.com's `{"error": {message, type, param, code}}`; on OpenRouter its
own checks (model, parameters, the window) answer `{"error": {code, message}}`, and what
the model's provider refuses (the conversation's shape, the reasoning) comes back as
"Provider returned error" with `metadata.provider_name` and the provider's own body as
the string `metadata.raw`, as OpenRouter passes an upstream 400 on
(tests/agents/test_openai_double.py shows each).

Valid requests take the next scripted `Reply` (one with `repeat` answers every later
request too). The helpers make every real answer: completions with reasoning fields,
`finish_reason` and `native_finish_reason`, `provider`, usage with `cost`,
`cost_details`, `is_byok` and token details; error bodies with `metadata`; errors inside
a 200; no choices; an HTML page; Retry-After headers. A request with `stream: true` is
answered as server-sent events (deltas, usage in the last chunk, an error event
mid-stream for an error reply; `stall_s` pauses after the first chunk). Every request
body is kept in `requests` (valid ones) and `rejected` (with the 400 message).

GET /generation answers 404 until a generation's stats exist, as OpenRouter's does for a
few seconds after a response: `Reply.generation_404s` is how many lookups of its id are
answered 404 before the stats; `generation_log` keeps every lookup (id, status, time).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

API_KEY = "test-key"
CHARS_PER_TOKEN = 4
REASONING_KEYS = ("reasoning", "reasoning_content", "reasoning_details")
PROVIDER_KEYS = {
    "order", "only", "ignore", "allow_fallbacks", "require_parameters", "quantizations",
    "data_collection", "sort", "zdr", "max_price", "enforce_distillable_text",
}  # fmt: skip
REASONING_PARAM_KEYS = {"effort", "max_tokens", "exclude", "enabled"}
OPENROUTER_ONLY = {"provider", "reasoning", "usage", "transforms", "models", "route"}


@dataclass
class Reply:
    """One scripted answer. `body` is JSON, or a string sent as is (`content_type`)."""

    status: int = 200
    body: dict[str, Any] | str = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    repeat: bool = False
    content_type: str = "application/json"
    generation: dict[str, Any] | None = None
    """What GET /generation reports for this reply's id (default: from its usage)."""
    stall_s: float = 0.0
    """Streamed: wait this long after the first chunk (a provider that stalls)."""
    generation_404s: int = 0
    """GET /generation answers 404 to this many lookups of the reply's id before its stats
    (OpenRouter records a generation's stats only seconds after it ended)."""


@dataclass
class Model:
    """A model the double serves."""

    context_length: int = 200_000
    max_completion_tokens: int | None = 32_000
    reasoning_model: Literal["deepseek", "signed"] | None = None
    engine: Literal["openai", "vllm", "sglang"] = "openai"
    """What serves it. `vllm` and `sglang` (open-weights models, directly or behind
    OpenRouter) parse every past tool call's `function.arguments` to render the chat
    template, and answer 400, in their own error shape, to arguments that are not a JSON
    object (vllm#43995, #47761 before PR#48922; SGLang before PR#28035); api.openai.com
    (`openai`) takes any string."""

    @property
    def provider(self) -> str:
        """Who serves it behind OpenRouter (named in a passed-on provider error)."""
        if self.engine != "openai":
            return f"Double{self.engine.upper()}"
        return {"deepseek": "DeepSeek", "signed": "Anthropic"}.get(
            self.reasoning_model or "", "DoubleCloud"
        )


@dataclass(frozen=True)
class Rejection:
    """Why a back end answers 400 to a request. `upstream`: the model's provider refused
    it (OpenRouter passes that on as "Provider returned error"), not the router itself;
    `param` and `code` are what api.openai.com puts beside the message."""

    message: str
    param: str | None = None
    code: str | None = None
    upstream: bool = False
    upstream_style: Literal["openai", "anthropic", "vllm", "sglang"] = "openai"


def openai_error_body(rejection: Rejection) -> dict[str, Any]:
    """A 400 as api.openai.com (and DeepSeek's and most OpenAI-compatible servers) sends it;
    vLLM's and SGLang's own shapes for their styles."""
    if rejection.upstream_style == "vllm":  # vllm/entrypoints/openai ErrorResponse
        return {"error": {"message": rejection.message, "type": "BadRequestError",
                          "param": None, "code": 400}}  # fmt: skip
    if rejection.upstream_style == "sglang":  # flat, with `object`
        return {"object": "error", "message": rejection.message, "type": "BadRequestError",
                "param": None, "code": 400}  # fmt: skip
    return {
        "error": {
            "message": rejection.message,
            "type": "invalid_request_error",
            "param": rejection.param,
            "code": rejection.code,
        }
    }


def template_arguments_problem(arguments: Any) -> str | None:
    """What vLLM/SGLang say about a past call's arguments when rendering the template: the
    JSON decoder's error, or jinja's for valid JSON that is not an object; None when fine
    (an object, or empty: taken as `{}`)."""
    if not arguments or isinstance(arguments, dict):
        return None
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        return str(exc)  # e.g. "Expecting ',' delimiter: line 1 column 54 (char 53)"
    return None if isinstance(parsed, dict) else "Can only get item pairs from a mapping."


_ids = itertools.count(1)


def completion(
    *,
    content: str | None = None,
    calls: Sequence[tuple[str, dict[str, Any] | str]] = (),
    reasoning: str | None = None,
    reasoning_content: str | None = None,
    reasoning_details: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    native_finish_reason: str | None = None,
    provider: str | None = "DoubleCloud",
    model: str = "double-model",
    prompt_tokens: int | None = None,
    completion_tokens: int = 20,
    cached_tokens: int = 0,
    cache_write_tokens: int = 0,
    reasoning_tokens: int = 0,
    cost: float | None = None,
    upstream_cost: float | None = None,
    byok: bool | None = None,
    usage: bool = True,
    call_ids: bool = True,
    repeat: bool = False,
    delay_s: float = 0.0,
    generation: dict[str, Any] | None = None,
    generation_404s: int = 0,
) -> Reply:
    """A 200 chat completion with `content` and tool `calls` (name, arguments as a dict,
    or a raw string to send malformed JSON), reasoning fields, and a usage block (`cost`
    in USD as OpenRouter reports it; `prompt_tokens` defaults to the double's own count
    of the request, as a real back end counts). `call_ids=False` sends calls with empty
    ids."""
    tool_calls = [
        {
            "id": f"call_{next(_ids)}" if call_ids else "",
            "type": "function",
            "function": {
                "name": name,
                "arguments": args if isinstance(args, str) else json.dumps(args),
            },
        }
        for name, args in calls
    ]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    for key, value in (
        ("reasoning", reasoning),
        ("reasoning_content", reasoning_content),
        ("reasoning_details", reasoning_details),
    ):
        if value is not None:
            message[key] = value
    finish = finish_reason or ("tool_calls" if tool_calls else "stop")
    body: dict[str, Any] = {
        "id": f"gen-{next(_ids)}",
        "object": "chat.completion",
        "created": 1_780_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
                "native_finish_reason": native_finish_reason or finish,
            }
        ],
    }
    if provider is not None:
        body["provider"] = provider
    if usage:
        block: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,  # None: filled in with the double's count
            "completion_tokens": completion_tokens,
            "total_tokens": (prompt_tokens or 0) + completion_tokens,
            "prompt_tokens_details": {
                "cached_tokens": cached_tokens,
                "cache_write_tokens": cache_write_tokens,
            },
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        }
        if cost is not None:
            block["cost"] = cost
        if upstream_cost is not None:
            block["cost_details"] = {"upstream_inference_cost": upstream_cost}
        if byok is not None:
            block["is_byok"] = byok
        body["usage"] = block
    return Reply(body=body, repeat=repeat, delay_s=delay_s, generation=generation,
                 generation_404s=generation_404s)  # fmt: skip


def error(
    status: int,
    message: str,
    *,
    metadata: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    repeat: bool = False,
) -> Reply:
    """An error answer with OpenRouter's body: `{"error": {code, message, metadata}}`."""
    inner: dict[str, Any] = {"code": status, "message": message}
    if metadata is not None:
        inner["metadata"] = metadata
    return Reply(status=status, body={"error": inner}, headers=headers or {}, repeat=repeat)


def rate_limited(retry_after_s: float, *, limit: int = 20) -> Reply:
    """A 429 as OpenRouter sends it: Retry-After and the X-RateLimit headers (the reset in
    epoch milliseconds)."""
    headers = {
        "Retry-After": f"{retry_after_s:g}",
        "X-RateLimit-Limit": str(limit),
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "1780000010000",
    }
    return error(429, "Rate limit exceeded: free-models-per-min", headers=headers,
                 metadata={"headers": headers})  # fmt: skip


def error_in_200(
    code: int, message: str, *, metadata: dict[str, Any] | None = None, repeat: bool = False
) -> Reply:
    """An error OpenRouter sends after the model started: HTTP 200, an error body."""
    reply = error(code, message, metadata=metadata, repeat=repeat)
    reply.status = 200
    return reply


def no_choices() -> Reply:
    return Reply(body={"id": f"gen-{next(_ids)}", "object": "chat.completion", "choices": []})


def html_page(status: int = 200) -> Reply:
    """What a proxy in the way sends: an HTML page."""
    page = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
    return Reply(status=status, body=page, content_type="text/html")


def _halves(text: str) -> list[str]:
    middle = len(text) // 2
    return [part for part in (text[:middle], text[middle:]) if part]


async def _sse(payload: dict[str, Any], stall_s: float) -> AsyncIterator[bytes]:
    """A response as OpenRouter streams it: deltas, the finish reason, usage last. An error
    body becomes an error event mid-stream, after a first chunk, as OpenRouter sends one."""
    gen = payload.get("id") or f"gen-{next(_ids)}"
    head = {"id": gen, "object": "chat.completion.chunk", "created": 1_780_000_000,
            "model": payload.get("model", "double-model")}  # fmt: skip
    if payload.get("provider"):
        head["provider"] = payload["provider"]

    def event(choices: list[dict[str, Any]], **more: Any) -> bytes:
        return f"data: {json.dumps({**head, 'choices': choices, **more})}\n\n".encode()

    yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}}])
    if stall_s:
        await asyncio.sleep(stall_s)
    if "error" in payload:
        yield event([{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
                    error=payload["error"])  # fmt: skip
        yield b"data: [DONE]\n\n"
        return
    choice = payload["choices"][0]
    message = choice["message"]
    for key in ("reasoning", "reasoning_content"):
        for part in _halves(message.get(key) or ""):
            yield event([{"index": 0, "delta": {key: part}}])
    if message.get("reasoning_details"):
        yield event([{"index": 0, "delta": {"reasoning_details": message["reasoning_details"]}}])
    for part in _halves(message.get("content") or ""):
        yield event([{"index": 0, "delta": {"content": part}}])
    for index, call in enumerate(message.get("tool_calls") or []):
        first, *rest = _halves(call["function"]["arguments"]) or [""]
        yield event([{"index": 0, "delta": {"tool_calls": [{"index": index, "id": call["id"],
                     "type": "function", "function": {"name": call["function"]["name"],
                     "arguments": first}}]}}])  # fmt: skip
        for part in rest:
            yield event([{"index": 0, "delta": {"tool_calls": [
                {"index": index, "function": {"arguments": part}}]}}])  # fmt: skip
    yield event([{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason"),
                  "native_finish_reason": choice.get("native_finish_reason")}])  # fmt: skip
    if payload.get("usage"):
        yield event([], usage=payload["usage"])
    yield b"data: [DONE]\n\n"


class OpenAIDouble:
    """The server. `base_url` ends in /api/v1 (openrouter) or /v1 (openai)."""

    def __init__(self, flavour: Literal["openrouter", "openai"] = "openrouter") -> None:
        self.flavour = flavour
        self.script: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.rejected: list[tuple[dict[str, Any], str]] = []
        self.models: dict[str, Model] = {"double-model": Model()}
        self.key_limit_remaining: float | None = 10.0
        self.generations: dict[str, dict[str, Any]] = {}
        self.model_requests = 0
        self.key_requests = 0
        self.generation_requests = 0
        self.generation_log: list[tuple[str, int, float]] = []
        """Every GET /generation: (id, status answered, loop time)."""
        self.completion_times: list[float] = []
        """The loop time at which each valid chat request arrived."""
        self._lookups_left: dict[str, int] = {}
        self.sent_reasoning: dict[str, dict[str, Any]] = {}
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def prefix(self) -> str:
        return "/api/v1" if self.flavour == "openrouter" else "/v1"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    def messages(self, index: int = -1) -> list[dict[str, Any]]:
        """The messages of (valid) request `index`."""
        messages: list[dict[str, Any]] = self.requests[index]["messages"]
        return messages

    # --- validation, as the real back ends do it ---------------------------------------

    def problem(self, body: Any) -> str | None:
        """Why a real back end would answer 400 to `body` (its message), or None."""
        rejection = self.rejection(body)
        return None if rejection is None else rejection.message

    def rejection(self, body: Any) -> Rejection | None:
        """Why a real back end would answer 400 to `body`, or None."""
        if not isinstance(body, dict):
            return Rejection("request body must be a JSON object")
        name = str(body.get("model"))
        model = self.models.get(name) or self.models.get(name.rsplit(":", 1)[0])  # `:nitro`
        if model is None:
            return Rejection(f"{body.get('model')} is not a valid model ID", "model")
        if self.flavour == "openai" and (extra := sorted(OPENROUTER_ONLY & body.keys())):
            return Rejection(f"Unrecognized request argument supplied: {extra[0]}")
        if "max_tokens" in body and "max_completion_tokens" in body:
            return Rejection("max_tokens and max_completion_tokens cannot both be set")
        if isinstance(body.get("provider"), dict) and (
            bad := body["provider"].keys() - PROVIDER_KEYS
        ):
            return Rejection(f"provider: unrecognized key {sorted(bad)[0]!r}", "provider")
        reasoning = body.get("reasoning")
        if isinstance(reasoning, dict):
            if bad := reasoning.keys() - REASONING_PARAM_KEYS:
                return Rejection(f"reasoning: unrecognized key {sorted(bad)[0]!r}", "reasoning")
            if "effort" in reasoning and "max_tokens" in reasoning:
                return Rejection(
                    "reasoning: only one of effort and max_tokens may be given", "reasoning"
                )
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return Rejection("messages must be a non-empty array", "messages")
        if (why := self._conversation_problem(messages, model)) is not None:
            return why
        return self._window_problem(body, model)

    def _conversation_problem(self, messages: list[Any], model: Model) -> Rejection | None:
        """What the model's provider refuses in the conversation (OpenAI's words)."""

        def upstream(
            message: str, param: str | None, code: str | None = None, style: str = "openai"
        ) -> Rejection:
            return Rejection(message, param, code, True, style)  # type: ignore[arg-type]

        def missing(ids: set[str], param: str) -> Rejection:
            return upstream(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(sorted(ids))}",
                param,
            )

        pending: set[str] = set()
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                return upstream(f"Invalid type for 'messages[{index}]': expected an object",
                                f"messages.[{index}]", "invalid_type")  # fmt: skip
            role = message.get("role")
            if pending and role != "tool":
                return missing(pending, f"messages.[{index}].role")
            if role == "assistant":
                calls = message.get("tool_calls") or []
                content = message.get("content")
                if not calls and content is None:
                    return upstream("Invalid value for 'content': expected a string, got null.",
                                    f"messages.[{index}].content")  # fmt: skip
                if not calls and content == "":
                    return upstream(
                        f"Invalid 'messages[{index}]': an assistant message must have either "
                        "content or tool_calls",
                        f"messages.[{index}]",
                    )
                for number, call in enumerate(calls):
                    if not isinstance(call, dict) or not call.get("id"):
                        return upstream(
                            f"Invalid 'messages[{index}].tool_calls[{number}].id': empty string. "
                            "Expected a string with minimum length 1, but got an empty string "
                            "instead.",
                            f"messages.[{index}].tool_calls.[{number}].id",
                            "empty_string",
                        )
                    function = call.get("function") or {}
                    if model.engine != "openai" and (
                        why := template_arguments_problem(function.get("arguments"))
                    ):
                        return upstream(why, None, style=model.engine)
                    pending.add(call["id"])
                if calls and model.reasoning_model is not None:
                    sent = self.sent_reasoning.get(calls[0]["id"])
                    if sent and any(message.get(k) != v for k, v in sent.items()):
                        if model.reasoning_model == "deepseek":
                            return upstream(
                                "The reasoning_content in the thinking mode must be passed "
                                "back to the API.",
                                None,
                                "invalid_request_error",
                            )
                        return upstream(
                            f"messages.{index}.content.0.type: Expected `thinking` or "
                            "`redacted_thinking`, but found `tool_use`. When `thinking` is "
                            "enabled, an assistant message with tool use must start with its "
                            "thinking block, passed back unchanged (reasoning_details, with its "
                            "signature)",
                            None,
                            style="anthropic",
                        )
            elif role == "tool":
                call_id = message.get("tool_call_id")
                if call_id not in pending:
                    return upstream(
                        "Invalid parameter: messages with role 'tool' must be a response to a "
                        "preceeding message with 'tool_calls'.",  # sic: OpenAI's spelling
                        f"messages.[{index}].role",
                    )
                pending.discard(call_id)
            elif role not in ("system", "user", "developer"):
                return upstream(
                    f"Invalid value: {role!r}. Supported values are: 'system', 'assistant', "
                    "'user', 'function', 'tool', and 'developer'.",
                    f"messages.[{index}].role",
                    "invalid_value",
                )
        if pending:
            return missing(pending, "messages")
        return None

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        """The double's token count of a request: 4 characters of JSON a token."""
        text = json.dumps(body.get("messages"), ensure_ascii=False)
        text += json.dumps(body.get("tools") or [], ensure_ascii=False)
        return len(text) // CHARS_PER_TOKEN

    def _window_problem(self, body: dict[str, Any], model: Model) -> Rejection | None:
        """Over the window: OpenRouter checks it itself, before any provider; api.openai.com
        answers `context_length_exceeded`."""
        asked_out = int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
        text = self.prompt_tokens(body)
        if text + asked_out <= model.context_length:
            return None
        if self.flavour == "openai":
            return Rejection(
                f"This model's maximum context length is {model.context_length} tokens. "
                f"However, you requested {text + asked_out} tokens ({text} in the messages, "
                f"{asked_out} in the completion). Please reduce the length of the messages or "
                "completion.",
                "messages",
                "context_length_exceeded",
            )
        return Rejection(
            f"This endpoint's maximum context length is {model.context_length} tokens. "
            f"However, you requested about {text + asked_out} tokens ({text} of text "
            f"input, {asked_out} in the output). Please reduce the length of either one, "
            'or use the "middle-out" transform to compress your prompt automatically.'
        )

    def error_body(self, rejection: Rejection, body: Any) -> dict[str, Any]:
        """The body of the 400 answering `rejection`, in the flavour's shape."""
        if self.flavour == "openai":
            return openai_error_body(rejection)
        if not rejection.upstream:
            return {"error": {"code": 400, "message": rejection.message}}
        if rejection.upstream_style == "anthropic":
            raw: dict[str, Any] = {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": rejection.message},
            }
        else:
            raw = openai_error_body(rejection)
        name = str(body.get("model")) if isinstance(body, dict) else ""
        model = self.models.get(name) or self.models.get(name.rsplit(":", 1)[0]) or Model()
        metadata = {"provider_name": model.provider, "raw": json.dumps(raw)}
        return {"error": {"code": 400, "message": "Provider returned error", "metadata": metadata}}

    # --- the app --------------------------------------------------------------------------

    def app(self) -> FastAPI:
        app = FastAPI()
        prefix = self.prefix

        def unauthorized(request: Request) -> JSONResponse | None:
            if request.headers.get("authorization") == f"Bearer {API_KEY}":
                return None
            if self.flavour == "openai":
                body = openai_error_body(
                    Rejection(
                        "Incorrect API key provided. You can find your API key at "
                        "https://platform.openai.com/account/api-keys.",
                        code="invalid_api_key",
                    )
                )
            else:
                body = {"error": {"code": 401, "message": "User not found."}}
            return JSONResponse(body, status_code=401)

        @app.get(f"{prefix}/models")
        async def models(request: Request) -> JSONResponse:
            self.model_requests += 1
            if self.flavour == "openai" and (refused := unauthorized(request)) is not None:
                return refused
            data = [
                {
                    "id": name,
                    "name": name,
                    "context_length": model.context_length,
                    "top_provider": {
                        "context_length": model.context_length,
                        "max_completion_tokens": model.max_completion_tokens,
                        "is_moderated": False,
                    },
                    "supported_parameters": ["tools", "tool_choice", "max_tokens", "reasoning"],
                }
                for name, model in self.models.items()
            ]
            return JSONResponse({"object": "list", "data": data})

        if self.flavour == "openrouter":

            @app.get(f"{prefix}/key")
            async def key(request: Request) -> JSONResponse:
                self.key_requests += 1
                if (refused := unauthorized(request)) is not None:
                    return refused
                data = {
                    "label": "sk-or-v1-tes...key",
                    "limit": None if self.key_limit_remaining is None else 10.0,
                    "limit_remaining": self.key_limit_remaining,
                    "usage": 0.0,
                    "is_free_tier": False,
                    "is_provisioning_key": False,
                }
                return JSONResponse({"data": data})

            @app.get(f"{prefix}/generation")
            async def generation(request: Request) -> JSONResponse:
                self.generation_requests += 1
                if (refused := unauthorized(request)) is not None:
                    return refused
                wanted = request.query_params.get("id", "")
                found = self.generations.get(wanted)
                now = asyncio.get_running_loop().time()
                if found is not None and self._lookups_left.get(wanted, 0) > 0:
                    self._lookups_left[wanted] -= 1  # its stats are not recorded yet
                    found = None
                if found is None:
                    self.generation_log.append((wanted, 404, now))
                    return JSONResponse(
                        {"error": {"code": 404, "message": f"Generation {wanted} not found"}}, 404
                    )
                self.generation_log.append((wanted, 200, now))
                return JSONResponse({"data": found})

        @app.post(f"{prefix}/chat/completions")
        async def completions(request: Request) -> Response:
            if (refused := unauthorized(request)) is not None:
                return refused
            body = await request.json()
            if (rejection := self.rejection(body)) is not None:
                self.rejected.append((body, rejection.message))
                return JSONResponse(self.error_body(rejection, body), 400)
            self.requests.append(body)
            self.completion_times.append(asyncio.get_running_loop().time())
            if not self.script:
                return JSONResponse(error(500, "the test script has no more replies").body, 500)
            reply = self.script[0] if self.script[0].repeat else self.script.pop(0)
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            payload = reply.body
            if isinstance(payload, str):
                return Response(payload, reply.status, reply.headers, media_type=reply.content_type)
            payload = json.loads(json.dumps(payload))
            if reply.repeat and "id" in payload:
                payload["id"] = f"gen-{next(_ids)}"
            usage = payload.get("usage")
            if isinstance(usage, dict) and usage.get("prompt_tokens") is None:
                usage["prompt_tokens"] = self.prompt_tokens(body)
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            self._remember(payload, reply)
            if body.get("stream") and reply.status == 200:
                return StreamingResponse(
                    _sse(payload, reply.stall_s), headers=reply.headers,
                    media_type="text/event-stream",
                )  # fmt: skip
            return JSONResponse(payload, status_code=reply.status, headers=reply.headers)

        return app

    def _remember(self, payload: dict[str, Any], reply: Reply) -> None:
        """Keep what the reasoning checks and GET /generation need of a served reply."""
        for choice in payload.get("choices") or []:
            message = choice.get("message") or {}
            calls = message.get("tool_calls") or []
            fields = {k: message[k] for k in REASONING_KEYS if message.get(k) is not None}
            if calls and fields and calls[0].get("id"):
                self.sent_reasoning[calls[0]["id"]] = fields
        generation_id = payload.get("id")
        if not isinstance(generation_id, str):
            return
        usage = payload.get("usage") or {}
        self._lookups_left[generation_id] = reply.generation_404s
        self.generations[generation_id] = reply.generation or {
            "id": generation_id,
            "model": payload.get("model"),
            "provider_name": payload.get("provider"),
            "tokens_prompt": usage.get("prompt_tokens", 0),
            "tokens_completion": usage.get("completion_tokens", 0),
            "native_tokens_prompt": usage.get("prompt_tokens", 0),
            "native_tokens_completion": usage.get("completion_tokens", 0),
            "total_cost": usage.get("cost", 0.0),
            "is_byok": usage.get("is_byok", False),
        }

    async def start(self) -> None:
        config = uvicorn.Config(
            self.app(),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
