"""A stand-in for a remote, paid OpenAI-compatible API: a real HTTP server on 127.0.0.1.

It speaks the chat-completions wire protocol (POST /v1/chat/completions, GET /v1/models,
bearer keys, OpenAI's error bodies, Retry-After) and answers from a script: each request
takes the next `Reply`; a reply with `repeat` answers every later request too. Every
request body is kept in `requests`, so tests see exactly what the agent sent.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

API_KEY = "test-key"


@dataclass
class Reply:
    """One scripted answer."""

    status: int = 200
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    repeat: bool = False


def completion(
    *,
    content: str | None = None,
    calls: Sequence[tuple[str, dict[str, Any] | str]] = (),
    prompt_tokens: int = 100,
    completion_tokens: int = 20,
    cached_tokens: int = 0,
    cost: float | None = None,
    repeat: bool = False,
    delay_s: float = 0.0,
) -> Reply:
    """A 200 chat completion with `content` and tool `calls` (name, arguments as a dict,
    or as a raw string to send malformed JSON), and a usage block (with `cost` in USD
    when given, as OpenRouter reports it)."""
    tool_calls = [
        {
            "id": f"call_{next(_ids)}",
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
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    if cost is not None:
        usage["cost"] = cost
    body = {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 1_780_000_000,
        "model": "double",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": usage,
    }
    return Reply(body=body, repeat=repeat, delay_s=delay_s)


def error(
    status: int, message: str, *, headers: dict[str, str] | None = None, repeat: bool = False
) -> Reply:
    """An error answer with OpenAI's error body."""
    body = {"error": {"message": message, "type": "server_error", "code": None}}
    return Reply(status=status, body=body, headers=headers or {}, repeat=repeat)


_ids = itertools.count(1)


class OpenAIDouble:
    """The server. `base_url` ends in /v1, as OpenAI-compatible base URLs do."""

    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.model_requests = 0
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def messages(self, index: int = -1) -> list[dict[str, Any]]:
        """The messages of request `index`."""
        messages: list[dict[str, Any]] = self.requests[index]["messages"]
        return messages

    def app(self) -> FastAPI:
        app = FastAPI()

        def unauthorized(request: Request) -> JSONResponse | None:
            if request.headers.get("authorization") != f"Bearer {API_KEY}":
                body = {"error": {"message": "Incorrect API key", "type": "invalid_request_error"}}
                return JSONResponse(body, status_code=401)
            return None

        @app.get("/v1/models")
        async def models(request: Request) -> JSONResponse:
            self.model_requests += 1
            if (refused := unauthorized(request)) is not None:
                return refused
            model = {"id": "double", "object": "model", "created": 0, "owned_by": "tests"}
            return JSONResponse({"object": "list", "data": [model]})

        @app.post("/v1/chat/completions")
        async def completions(request: Request) -> JSONResponse:
            if (refused := unauthorized(request)) is not None:
                return refused
            self.requests.append(await request.json())
            if not self.script:
                return JSONResponse(error(500, "the test script has no more replies").body, 500)
            reply = self.script[0] if self.script[0].repeat else self.script.pop(0)
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)

        return app

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


@pytest.fixture
async def openai_double() -> AsyncIterator[OpenAIDouble]:
    double = OpenAIDouble()
    await double.start()
    try:
        yield double
    finally:
        await double.stop()
