"""The `llm:MODEL` agent: a tool-calling loop over any OpenAI-compatible chat-completions API.

The system prompt carries the brief; the model acts on its host through four tools
(`bash`, `read_file`, `write_file`, `done`). Between turns the referee's feedback
arrives as user messages starting "Referee:". Each response's usage is reported at
once (`report("usage", ...)`), and every message, tool call and tool result is reported
as a bounded transcript entry, so `replay_messages` can rebuild the conversation.

How the agent ends (`AgentOutcome`):
- `done` called, or a reply with text and no tool call: completed, successful;
- a limit reached (turns, tokens, cost, wall time): terminated, detail names the limit;
- the API failed (after retries for 408/409/429/5xx/timeouts, honouring Retry-After)
  or refused the request: failed, `failure_source` "arena";
- more than `max_corrections` malformed responses in a row: failed, "player";
- the match deadline: terminated, "controller".
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import re
import time
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache
from importlib import resources
from typing import Any, cast

from openai import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncOpenAI,
    AuthenticationError,
    NotFoundError,
    PermissionDeniedError,
)
from openai.types.chat import ChatCompletion
from pydantic import ValidationError

from opsarena.agents.base import Agent, AgentContext, AgentOutcome
from opsarena.agents.spec import AgentSettings, Limits, Price, find_price
from opsarena.errors import AgentConfigError, HostError, HostFileError, HostUnavailableError
from opsarena.hosts import ExecResult

log = logging.getLogger(__name__)

ENV_BASE_URL = ("OPSARENA_LLM_BASE_URL", "OPENAI_BASE_URL")
ENV_API_KEY = ("OPSARENA_LLM_API_KEY", "OPENAI_API_KEY")
DEFAULT_BASE_URL = "https://api.openai.com/v1"
TOOL_OUTPUT_LIMIT = 16 * 1024
"""Bytes of each output stream (and of a file read) the model sees from one tool call."""
TRANSCRIPT_FIELD_LIMIT = 32 * 1024
"""Characters kept of each text field of a transcript entry."""
DETAIL_LIMIT = 2000
DEFAULT_BASH_TIMEOUT = 120.0
MAX_BASH_TIMEOUT = 900.0
READ_FILE_LIMIT = 1024 * 1024

SYSTEM_PROMPT = """\
You are a competitor in opsarena, a live infrastructure challenge. You are root on your \
own Linux host (Debian, systemd as init). The host has no network access beyond its own \
loopback. You act on it only through your tools:
- bash: run a command in the host through `bash -c` (a fresh shell each call; it is \
killed after {timeout:g} seconds unless you pass timeout_s; each output stream is cut \
after {limit} bytes);
- read_file / write_file: read or replace a whole file in the host;
- done: declare that you have finished, with a short summary.
A referee probes your work from outside the host and may restart your service or reboot \
the host while you work. While the host reboots, tools answer with an error for a few \
seconds: wait and try again. Messages starting with "Referee:" report what it found.

The challenge brief:

{brief}"""

START_MESSAGE = "Begin. Use the tools to complete the brief, then call done."

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command in the host with bash -c, as root. Returns the exit "
            "code, stdout and stderr.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command to run."},
                    "timeout_s": {
                        "type": "number",
                        "description": f"Seconds before it is killed (at most "
                        f"{MAX_BASH_TIMEOUT:g}).",
                    },
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file in the host.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Absolute path."}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file in the host, creating parent directories and "
            "replacing any file there.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Absolute path."},
                    "content": {"type": "string", "description": "The whole new content."},
                    "mode": {
                        "type": "string",
                        "description": "Octal mode, e.g. 0755 (default 0644).",
                    },
                },
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "done",
            "description": "Declare that you have finished the brief.",
            "parameters": {
                "type": "object",
                "properties": {"summary": {"type": "string", "description": "What you did."}},
                "required": ["summary"],
            },
        },
    },
]

_REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "bash": {"command": str},
    "read_file": {"path": str},
    "write_file": {"path": str, "content": str},
    "done": {"summary": str},
}
_OPTIONAL: dict[str, dict[str, type | tuple[type, ...]]] = {
    "bash": {"timeout_s": (int, float)},
    "write_file": {"mode": str},
}
_MODE_RE = re.compile(r"^0?[0-7]{3,4}$")


# --- decisions (pure) -----------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How transient API errors are retried. `attempts` counts the first try; a
    Retry-After (or retry-after-ms) header is honoured up to `max_retry_after_s`,
    otherwise the delay doubles from `initial_delay_s` up to `max_delay_s`."""

    attempts: int = 6
    initial_delay_s: float = 1.0
    max_delay_s: float = 30.0
    max_retry_after_s: float = 120.0


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait (`retry-after-ms`, or `retry-after` in seconds
    or as an HTTP date), or None when it did not say. Header names are lowercase."""
    if not headers:
        return None
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return float(ms) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        parsed = email.utils.parsedate_tz(value)
        if parsed is None:
            return None
        seconds = email.utils.mktime_tz(parsed) - (time.time() if now is None else now)
    return seconds if math.isfinite(seconds) else None


def retry_delay(
    retry: int, headers: Mapping[str, str] | None, policy: RetryPolicy, now: float | None = None
) -> float:
    """Seconds to wait before retry number `retry` (1 for the first retry)."""
    asked = parse_retry_after(headers, now)
    if asked is not None:
        return min(max(asked, 0.0), policy.max_retry_after_s)
    return float(min(policy.initial_delay_s * 2 ** (retry - 1), policy.max_delay_s))


def is_retryable(status: int | None) -> bool:
    """Timeouts and connection failures (status None), 408, 409, 429 and 5xx are transient."""
    return status is None or status in (408, 409, 429) or status >= 500


@dataclass(frozen=True)
class Usage:
    """One response's usage. `cost_microusd` is None when neither the provider nor a price
    says what it cost."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost_microusd: int | None


def _microusd(value: Decimal) -> int:
    return int(value.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def priced_cost_microusd(input_tokens: int, output_tokens: int, cached: int, price: Price) -> int:
    """Cost from a price (USD per million tokens = micro-USD per token); cached prompt
    tokens are part of `input_tokens`."""
    cached = min(cached, input_tokens)
    cached_rate = price.cached_input_usd_per_mtok
    if cached_rate is None:
        cached_rate = price.input_usd_per_mtok
    total = (
        Decimal(input_tokens - cached) * Decimal(str(price.input_usd_per_mtok))
        + Decimal(cached) * Decimal(str(cached_rate))
        + Decimal(output_tokens) * Decimal(str(price.output_usd_per_mtok))
    )
    return _microusd(total)


def usage_of(raw: Mapping[str, Any], price: Price | None) -> Usage:
    """The usage block of a chat-completions response, with its cost: the provider's
    `cost` (USD, as OpenRouter reports it) when present, else priced, else None."""
    input_tokens = int(raw.get("prompt_tokens") or 0)
    output_tokens = int(raw.get("completion_tokens") or 0)
    details = raw.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0
    reported = raw.get("cost")
    cost: int | None = None
    if (
        isinstance(reported, int | float)
        and not isinstance(reported, bool)
        and math.isfinite(reported)
        and reported >= 0
    ):
        cost = _microusd(Decimal(str(reported)) * 1_000_000)
    if cost is None and price is not None:
        cost = priced_cost_microusd(input_tokens, output_tokens, cached, price)
    return Usage(input_tokens, output_tokens, cached, cost)


@dataclass
class Spent:
    """What an agent has used so far."""

    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_microusd: int = 0

    def add(self, usage: Usage) -> None:
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cost_microusd += usage.cost_microusd or 0


def limit_reached(limits: Limits, spent: Spent) -> str | None:
    """The limit (turns, tokens, cost) `spent` has reached, in words, or None.
    Wall time is enforced by a timeout, not here."""
    if limits.turns is not None and spent.turns >= limits.turns:
        return f"turn limit ({limits.turns}) reached"
    if limits.input_tokens is not None and spent.input_tokens >= limits.input_tokens:
        return f"input token limit ({limits.input_tokens}) reached ({spent.input_tokens} used)"
    if limits.output_tokens is not None and spent.output_tokens >= limits.output_tokens:
        return f"output token limit ({limits.output_tokens}) reached ({spent.output_tokens} used)"
    if limits.cost_microusd is not None and spent.cost_microusd >= limits.cost_microusd:
        return (
            f"cost limit ({limits.cost_microusd} micro-USD) reached "
            f"({spent.cost_microusd} micro-USD used)"
        )
    return None


def bounded(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters cut]"


class ToolCallError(Exception):
    """A tool call the model got wrong; `str()` is the correction the model is sent."""


def parse_tool_arguments(name: str, arguments: str) -> dict[str, Any]:
    """The arguments of a call to tool `name`, checked. Raises `ToolCallError`."""
    if name not in _REQUIRED:
        raise ToolCallError(f"there is no tool {name!r}; the tools are {', '.join(_REQUIRED)}")
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"the arguments of {name} are not valid JSON ({exc})") from None
    if not isinstance(args, dict):
        raise ToolCallError(f"the arguments of {name} must be a JSON object")
    for key, kind in _REQUIRED[name].items():
        if not isinstance(args.get(key), kind):
            raise ToolCallError(f"{name} needs the argument {key!r} ({_type_name(kind)})")
    for key, kind in _OPTIONAL.get(name, {}).items():
        if key in args and (not isinstance(args[key], kind) or isinstance(args[key], bool)):
            raise ToolCallError(f"{name}'s argument {key!r} must be {_type_name(kind)}")
    if name == "write_file" and "mode" in args and not _MODE_RE.match(args["mode"]):
        raise ToolCallError(f"mode {args['mode']!r} is not an octal mode like 0644")
    if name in ("read_file", "write_file") and not args["path"].startswith("/"):
        raise ToolCallError(f"path {args['path']!r} must be absolute")
    return args


def _type_name(kind: type | tuple[type, ...]) -> str:
    return "a string" if kind is str else "a number"


def format_exec_result(result: ExecResult, timeout: float, limit: int) -> str:
    """What the model sees of one bash call."""
    lines = [f"exit code: {result.exit_code}"]
    if result.timed_out:
        lines.append(f"(killed after {timeout:g}s: the command ran past its timeout)")
    for label, data in (("stdout", result.stdout), ("stderr", result.stderr)):
        if data:
            lines.append(f"{label}:\n{data.decode(errors='replace')}")
    if result.truncated:
        lines.append(f"(output cut after {limit} bytes per stream)")
    return "\n".join(lines)


def replay_messages(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rebuild the chat messages the agent sent from its transcript entries (the `entry`
    of each `agent_transcript` event, in order). Exact unless an entry was bounded."""
    messages: list[dict[str, Any]] = []
    for entry in entries:
        kind = entry.get("kind")
        if kind == "system":
            messages.append({"role": "system", "content": entry["content"]})
        elif kind in ("user", "feedback"):
            messages.append({"role": "user", "content": entry["content"]})
        elif kind == "assistant":
            messages.append({"role": "assistant", "content": entry["content"]})
        elif kind == "tool_call" and messages and messages[-1]["role"] == "assistant":
            messages[-1].setdefault("tool_calls", []).append(
                {
                    "id": entry["id"],
                    "type": "function",
                    "function": {"name": entry["name"], "arguments": entry["arguments"]},
                }
            )
        elif kind == "tool_result":
            messages.append(
                {"role": "tool", "tool_call_id": entry["id"], "content": entry["content"]}
            )
    return messages


# --- configuration --------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where an llm agent's API is, and where its key came from (for messages)."""

    base_url: str
    api_key: str
    key_source: str


def _first(env: Mapping[str, str], names: Iterable[str]) -> tuple[str, str] | None:
    for name in names:
        if env.get(name):
            return name, env[name]
    return None


def resolve_endpoint(settings: AgentSettings, env: Mapping[str, str]) -> Endpoint:
    """The endpoint for `settings`: its `base_url` and `api_key_env`, else
    OPSARENA_LLM_BASE_URL / OPSARENA_LLM_API_KEY, else OPENAI_BASE_URL / OPENAI_API_KEY.
    A base URL without a key is allowed (local servers need none). Raises
    `AgentConfigError` when nothing is configured or `api_key_env` names an unset variable."""
    found_url = _first(env, ENV_BASE_URL)
    base_url = settings.base_url or (found_url[1] if found_url else None)
    if settings.api_key_env:
        key = env.get(settings.api_key_env)
        if not key:
            raise AgentConfigError(
                f"environment variable {settings.api_key_env} (api_key_env) is not set: "
                f"export it with the API key for {base_url or DEFAULT_BASE_URL}"
            )
        return Endpoint(base_url or DEFAULT_BASE_URL, key, settings.api_key_env)
    found_key = _first(env, ENV_API_KEY)
    if base_url is None and found_key is None:
        raise AgentConfigError(
            "no LLM endpoint configured: set OPSARENA_LLM_BASE_URL and OPSARENA_LLM_API_KEY "
            "(or base_url and api_key_env in the competitors file)"
        )
    if found_key is None:
        return Endpoint(base_url or DEFAULT_BASE_URL, "none", "no key")
    return Endpoint(base_url or DEFAULT_BASE_URL, found_key[1], found_key[0])


@lru_cache(maxsize=1)
def builtin_prices() -> dict[str, Price]:
    """The price table shipped in `opsarena/agents/prices.toml`, by model name."""
    text = resources.files("opsarena.agents").joinpath("prices.toml").read_text()
    table = tomllib.loads(text).get("models", {})
    try:
        return {name: Price(**value) for name, value in table.items()}
    except ValidationError as exc:  # a packaging bug, not the user's
        raise RuntimeError(f"prices.toml is invalid: {exc}") from exc


# --- the agent ------------------------------------------------------------------------


class _ProviderFailure(Exception):
    """The API failed for good; `str()` is the terminal detail."""


class LlmAgent(Agent):
    """A model driving its host through tools. See the module docstring for how it ends."""

    def __init__(
        self,
        model: str,
        *,
        endpoint: Endpoint,
        limits: Limits | None = None,
        price: Price | None = None,
        retry: RetryPolicy | None = None,
        max_tokens: int | None = None,
        bash_timeout_s: float = DEFAULT_BASH_TIMEOUT,
        request_timeout_s: float = 300.0,
        preflight_timeout_s: float = 10.0,
        max_corrections: int = 3,
        tool_output_limit: int = TOOL_OUTPUT_LIMIT,
        transcript_limit: int = TRANSCRIPT_FIELD_LIMIT,
    ) -> None:
        self.model = model
        self.endpoint = endpoint
        self.limits = limits or Limits()
        self.price = price
        self.retry = retry or RetryPolicy()
        self.max_tokens = max_tokens
        self.bash_timeout_s = bash_timeout_s
        self.request_timeout_s = request_timeout_s
        self.preflight_timeout_s = preflight_timeout_s
        self.max_corrections = max_corrections
        self.tool_output_limit = tool_output_limit
        self.transcript_limit = transcript_limit

    @classmethod
    def from_settings(cls, model: str, settings: AgentSettings, env: Mapping[str, str]) -> LlmAgent:
        """An agent for `model` configured by `settings`; the price is the settings' own,
        else the built-in table's. Raises `AgentConfigError` (see `resolve_endpoint`)."""
        return cls(
            model,
            endpoint=resolve_endpoint(settings, env),
            limits=settings.limits,
            price=settings.price or find_price(model, builtin_prices()),
            max_tokens=settings.max_tokens,
            bash_timeout_s=settings.bash_timeout_s or DEFAULT_BASH_TIMEOUT,
        )

    def client(self, timeout: float) -> AsyncOpenAI:
        # Retries are ours (RetryPolicy), so the SDK must not retry as well.
        return AsyncOpenAI(
            api_key=self.endpoint.api_key,
            base_url=self.endpoint.base_url,
            max_retries=0,
            timeout=timeout,
        )

    async def preflight(self) -> None:
        """Check within `preflight_timeout_s` that the endpoint answers and accepts the key
        (GET /models; a 404 still proves it reachable). Raises a one-line `AgentConfigError`."""
        url = self.endpoint.base_url
        client = self.client(self.preflight_timeout_s)
        try:
            await client.models.list()
        except NotFoundError:
            return
        except (AuthenticationError, PermissionDeniedError) as exc:
            raise AgentConfigError(
                f"LLM endpoint {url} refused the key from {self.endpoint.key_source} "
                f"(HTTP {exc.status_code}): check the key"
            ) from None
        except APIStatusError as exc:
            raise AgentConfigError(
                f"LLM endpoint {url} answered HTTP {exc.status_code} to GET /models: "
                f"{_one_line(_api_message(exc), 200)}"
            ) from None
        except APIConnectionError as exc:
            why = "timed out" if isinstance(exc, APITimeoutError) else _one_line(str(exc), 200)
            raise AgentConfigError(
                f"LLM endpoint {url} is not reachable ({why}): check OPSARENA_LLM_BASE_URL "
                "or base_url"
            ) from None
        finally:
            await client.close()

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        return await _Session(self, ctx).run()


def _api_message(exc: APIStatusError) -> str:
    """The provider's own error message (OpenAI's body shape), else the SDK's text."""
    body = exc.body
    if isinstance(body, Mapping) and isinstance(body.get("message"), str) and body["message"]:
        return str(body["message"])
    if isinstance(body, str) and body.strip():
        return body
    return exc.message


def _one_line(text: str, limit: int) -> str:
    return bounded(" ".join(text.split()), limit)


@dataclass
class _Session:
    """One run of an `LlmAgent`: the conversation, what was spent, the warnings given."""

    agent: LlmAgent
    ctx: AgentContext
    messages: list[dict[str, Any]] = field(default_factory=list)
    spent: Spent = field(default_factory=Spent)
    warned: set[str] = field(default_factory=set)

    async def run(self) -> AgentOutcome:
        agent, started = self.agent, time.monotonic()
        wall_end = started + agent.limits.wall_s if agent.limits.wall_s else math.inf
        end = min(self.ctx.deadline, wall_end)
        client = agent.client(agent.request_timeout_s)
        scope = asyncio.timeout(end - time.monotonic())
        try:
            async with scope:
                return await self._loop(client)
        except TimeoutError:
            if not scope.expired():
                raise
            if wall_end <= self.ctx.deadline:
                detail = f"wall time limit ({agent.limits.wall_s:g}s) reached"
                return AgentOutcome("terminated", None, detail, "player")
            return AgentOutcome("terminated", None, "match deadline reached", "controller")
        except _ProviderFailure as exc:
            return AgentOutcome("failed", False, str(exc), "arena")
        finally:
            await client.close()

    async def _loop(self, client: AsyncOpenAI) -> AgentOutcome:
        agent = self.agent
        prompt = SYSTEM_PROMPT.format(
            timeout=agent.bash_timeout_s, limit=agent.tool_output_limit, brief=self.ctx.brief
        )
        await self._add({"role": "system", "content": prompt}, {"kind": "system"})
        await self._add({"role": "user", "content": START_MESSAGE}, {"kind": "user"})
        malformed_in_a_row = 0
        while True:
            await self._take_feedback()
            if (reached := limit_reached(agent.limits, self.spent)) is not None:
                return AgentOutcome("terminated", None, reached, "player")
            response = await self._complete(client)
            self.spent.turns += 1
            await self._record_usage(response)
            message = response.choices[0].message
            calls = list(message.tool_calls or [])
            assistant: dict[str, Any] = {"role": "assistant", "content": message.content}
            await self._add(assistant, {"kind": "assistant"})
            if not calls:
                if message.content and message.content.strip():
                    return AgentOutcome("completed", True, bounded(message.content, DETAIL_LIMIT))
                problem = "your reply had neither text nor a tool call"
                await self._add(
                    {
                        "role": "user",
                        "content": f"Error: {problem}. Use the tools, then call done.",
                    },
                    {"kind": "user"},
                )
                malformed_in_a_row += 1
            else:
                finished, problem_or_none = await self._run_calls(assistant, calls)
                if finished is not None:
                    detail = bounded(finished, DETAIL_LIMIT) if finished else "declared done"
                    return AgentOutcome("completed", True, detail)
                malformed_in_a_row = malformed_in_a_row + 1 if problem_or_none else 0
                problem = problem_or_none or ""
            if malformed_in_a_row > agent.max_corrections:
                detail = (
                    f"model output unusable: {malformed_in_a_row} malformed responses in a row "
                    f"(last: {problem})"
                )
                return AgentOutcome("failed", False, bounded(detail, DETAIL_LIMIT), "player")

    async def _run_calls(
        self, assistant: dict[str, Any], calls: list[Any]
    ) -> tuple[str | None, str | None]:
        """Run the tool calls of one response in order. Returns (the done summary if `done`
        was called, the last problem if a call was malformed)."""
        problem: str | None = None
        tool_calls: list[dict[str, Any]] = []
        assistant["tool_calls"] = tool_calls
        for call in calls:
            function = getattr(call, "function", None)
            name = str(getattr(function, "name", "") or "")
            arguments = str(getattr(function, "arguments", "") or "")
            tool_calls.append(
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
            await self._record(
                {"kind": "tool_call", "id": call.id, "name": name, "arguments": arguments}
            )
        for call, sent in zip(calls, tool_calls, strict=True):
            name, arguments = sent["function"]["name"], sent["function"]["arguments"]
            try:
                args = parse_tool_arguments(name, arguments)
            except ToolCallError as exc:
                problem = str(exc)
                result = f"Error: {exc}. Call the tool again with corrected arguments."
            else:
                if name == "done":
                    return args["summary"], problem
                result = await self._run_tool(name, args)
            await self._add(
                {"role": "tool", "tool_call_id": call.id, "content": result},
                {"kind": "tool_result", "id": call.id, "name": name},
            )
        return None, problem

    async def _run_tool(self, name: str, args: dict[str, Any]) -> str:
        agent, host = self.agent, self.ctx.host
        try:
            if name == "bash":
                timeout = min(
                    float(args.get("timeout_s") or agent.bash_timeout_s), MAX_BASH_TIMEOUT
                )
                result = await host.exec(
                    args["command"], timeout=timeout, output_limit=agent.tool_output_limit
                )
                return format_exec_result(result, timeout, agent.tool_output_limit)
            if name == "read_file":
                data = await host.read_file(args["path"], limit=READ_FILE_LIMIT)
                text = data[: agent.tool_output_limit].decode(errors="replace")
                if len(data) > agent.tool_output_limit:
                    text += f"\n[file cut after {agent.tool_output_limit} of {len(data)} bytes]"
                return text
            content = args["content"].encode()
            await host.write_file(args["path"], content, mode=int(args.get("mode", "644"), 8))
            return f"wrote {len(content)} bytes to {args['path']}"
        except HostUnavailableError as exc:
            return (
                f"Error: the host is not reachable right now (it may be rebooting): {exc}. "
                "Wait a few seconds and try again."
            )
        except HostFileError as exc:
            return f"Error: {exc}"
        except HostError as exc:
            return f"Error: the host could not do it: {exc}"

    async def _complete(self, client: AsyncOpenAI) -> ChatCompletion:
        agent = self.agent
        extra: dict[str, Any] = {}
        if agent.max_tokens is not None:
            extra["max_tokens"] = agent.max_tokens
        if "openrouter.ai" in agent.endpoint.base_url:
            extra["extra_body"] = {"usage": {"include": True}}  # makes OpenRouter report cost
        attempt = 0
        while True:
            attempt += 1
            status: int | None = None
            headers: Mapping[str, str] | None = None
            try:
                response: ChatCompletion = await client.chat.completions.create(
                    model=agent.model,
                    messages=cast(Any, self.messages),
                    tools=cast(Any, TOOLS),
                    **extra,
                )
            except APIStatusError as exc:
                status, headers = exc.status_code, exc.response.headers
                why = f"HTTP {status}: {_one_line(_api_message(exc), 300)}"
            except APIConnectionError as exc:
                why = "request timed out" if isinstance(exc, APITimeoutError) else str(exc)
            else:
                if not response.choices:
                    raise _ProviderFailure("LLM API answered with no choices")
                return response
            if not is_retryable(status):
                raise _ProviderFailure(f"LLM API refused the request: {why}")
            if attempt >= agent.retry.attempts:
                raise _ProviderFailure(f"LLM API failed {attempt} times; last: {why}")
            delay = retry_delay(attempt, headers, agent.retry)
            await self._record(
                {"kind": "retry", "attempt": attempt, "error": why, "delay_s": delay}
            )
            await asyncio.sleep(delay)

    async def _record_usage(self, response: ChatCompletion) -> None:
        if response.usage is None:
            await self._warn("usage", "the LLM API reported no usage: tokens and cost unknown")
            return
        usage = usage_of(response.usage.model_dump(), self.agent.price)
        self.spent.add(usage)
        if usage.cost_microusd is None:
            await self._warn(
                "price",
                f"no price known for {self.agent.model} and the API reports no cost: cost is "
                "recorded as null (add the model to prices in the competitors file)",
            )
        await self.ctx.report(
            "usage",
            {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cached_tokens": usage.cached_tokens,
                "cost_microusd": usage.cost_microusd,
            },
        )

    async def _take_feedback(self) -> None:
        lines = []
        while True:
            try:
                lines.append(self.ctx.feedback.get_nowait())
            except asyncio.QueueEmpty:
                break
        if lines:
            content = "\n".join(f"Referee: {line}" for line in lines)
            await self._add({"role": "user", "content": content}, {"kind": "feedback"})

    async def _add(self, message: dict[str, Any], entry: dict[str, Any]) -> None:
        self.messages.append(message)
        await self._record({**entry, "content": message["content"]})

    async def _record(self, entry: dict[str, Any]) -> None:
        limit = self.agent.transcript_limit
        entry = {k: bounded(v, limit) if isinstance(v, str) else v for k, v in entry.items()}
        await self.ctx.report("transcript", {"entry": {"turn": self.spent.turns, **entry}})

    async def _warn(self, key: str, text: str) -> None:
        if key in self.warned:
            return
        self.warned.add(key)
        log.warning("%s: %s", self.ctx.territory, text)
        await self._record({"kind": "warning", "content": text})
