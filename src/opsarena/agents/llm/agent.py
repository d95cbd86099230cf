"""The `llm:MODEL` agent's loop: requests, what each answer leads to, limits, the transcript.

How a run ends (`AgentOutcome`):
- `done` called: completed, successful (nothing else ends a run as a success);
- a limit reached (turns, tokens, cost, wall time): terminated, detail names the limit;
- the key's credits exhausted (HTTP 402): terminated, "player" (the competitor's budget);
- the API failed (after retries for 408/409/429/5xx, timeouts, errors inside a 200,
  empty choices, non-JSON bodies, `finish_reason` "error"), or refused the request as
  sent (400, 401, 404): failed, "arena". A refusal of a request carrying the model's
  newest turn is first met by taking that turn out (its calls' results stay, as text)
  and asking again: only when the provider still refuses is it the arena's;
- more than `max_corrections` unusable responses in a row (malformed calls, `length` or
  `content_filter` cuts, empty turns), or of the model's turns refused by the provider
  (taken out as above), more than `max_nudges` replies in a row without a
  tool call, or more than `max_context_recoveries` context-length errors in a row for one
  request (the conversation does not fit the window even after shedding): failed,
  "player";
- the match deadline: terminated, "controller".
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from openai import APIConnectionError, APIError, APIStatusError, APITimeoutError, AsyncOpenAI

from opsarena.agents.base import Agent, AgentContext, AgentOutcome
from opsarena.agents.llm import context as ctxwin
from opsarena.agents.llm.endpoint import (
    GENERATION_LOOKUP_DELAYS_S,
    Endpoint,
    EndpointFacts,
    builtin_prices,
    check_endpoint,
    lookup_generation,
    resolve_endpoint,
)
from opsarena.agents.llm.tools import (
    DEFAULT_BASH_TIMEOUT,
    TOOL_OUTPUT_LIMIT,
    TOOLS,
    ToolCallError,
    parse_tool_arguments,
    run_tool,
)
from opsarena.agents.llm.wire import (
    REASONING_KEYS,
    Completion,
    Problem,
    RetryPolicy,
    StreamedReply,
    Usage,
    classify_status,
    error_text,
    input_tokens_from_error,
    read_completion,
    retry_delay,
    usage_of,
    usage_of_generation,
    window_from_error,
)
from opsarena.agents.spec import (
    AgentSettings,
    Limits,
    Price,
    ProviderRouting,
    Reasoning,
    find_price,
)
from opsarena.errors import AgentConfigError

log = logging.getLogger(__name__)

TRANSCRIPT_FIELD_LIMIT = 32 * 1024
"""Characters kept of each text field of a transcript entry."""
DETAIL_LIMIT = 2000
OUTPUT_RESERVE = 8192
"""Tokens kept free for the answer when no `max_output_tokens` is set."""

SYSTEM_PROMPT = """\
You are a competitor in opsarena, a live infrastructure challenge. You are root on your \
own Linux host (Debian, systemd as init). The host has no network access beyond its own \
loopback. You act on it only through your tools:
- bash: run a command in the host through `bash -c` ({shell}, stdin empty, \
no pager; it is killed after {timeout:g} seconds unless you pass timeout_s; long output \
shows its head and tail, about {limit} characters per stream);
- read_file / write_file: read (a part of) or replace a whole file in the host;
- done: declare that you have finished, with a short summary. Only done ends your run: a \
reply without a tool call does nothing.
A referee probes your work from outside the host and may restart your service or reboot \
the host while you work. While the host reboots, tools answer with an error for a few \
seconds: wait and try again. Messages starting with "Referee:" report what it found. \
Old tool outputs may be removed from the conversation to keep it within your context \
window; run a command again if you need its output.

The challenge brief:

{brief}"""

START_MESSAGE = "Begin. Use the tools to complete the brief, then call done."
NUDGE = (
    "You replied without calling a tool, so nothing was run. Continue with the tools; "
    "call done when you have finished the brief."
)
LENGTH_NOTE = (
    "Your last reply was cut off at the output token limit (finish_reason length), so none "
    "of its tool calls were run. Try again with a shorter reply: write large files in parts "
    "(for example write_file, then bash with cat >>)."
)
FILTER_NOTE = (
    "Your last reply was stopped by the provider's content filter (finish_reason "
    "content_filter); nothing was run. Continue with the tools."
)
EMPTY_NOTE = "Your last reply was empty: it had neither text nor a tool call. Use the tools."


# --- decisions (pure) -----------------------------------------------------------------


@dataclass
class Spent:
    """What an agent has used so far. `input_tokens` counts every prompt token;
    `fresh_input_tokens` leaves out those served from the provider's cache (what the
    input token limit counts, as the provider bills them at a fraction)."""

    turns: int = 0
    input_tokens: int = 0
    fresh_input_tokens: int = 0
    output_tokens: int = 0
    cost_microusd: int = 0
    unknown_cost_requests: int = 0

    def add(self, usage: Usage) -> None:
        self.input_tokens += usage.input_tokens
        self.fresh_input_tokens += max(usage.input_tokens - usage.cached_tokens, 0)
        self.output_tokens += usage.output_tokens
        self.cost_microusd += usage.cost_microusd or 0


def limit_reached(limits: Limits, spent: Spent) -> str | None:
    """The limit (turns, tokens, cost) `spent` has reached, in words, or None.
    Wall time is enforced by a timeout, not here."""
    if limits.turns is not None and spent.turns >= limits.turns:
        return f"turn limit ({limits.turns}) reached"
    if limits.input_tokens is not None and spent.fresh_input_tokens >= limits.input_tokens:
        return (
            f"input token limit ({limits.input_tokens}) reached ({spent.fresh_input_tokens} used)"
        )
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


def reasoning_of(message: Mapping[str, Any]) -> dict[str, Any]:
    """The reasoning fields of an assistant message, exactly as sent."""
    return {key: message[key] for key in REASONING_KEYS if message.get(key) not in (None, "")}


def assistant_message(
    message: Mapping[str, Any], calls: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    """The assistant turn to send back: content, tool calls and reasoning unchanged; None
    for an empty turn (no text, no calls), which back ends reject."""
    content = message.get("content")
    text = content if isinstance(content, str) and content.strip() else None
    if text is None and not calls:
        return None
    turn: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        turn["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": sent_arguments(call)}}
            for call in calls
        ]
    turn.update(reasoning_of(message))
    return turn


def arguments_object(arguments: str) -> bool:
    """Whether a call's arguments text is a JSON object (what chat templates need)."""
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def sent_arguments(call: Mapping[str, Any]) -> str:
    """A past call's arguments as they go back to the provider: unchanged when they are a
    JSON object, else `{}`. Providers serving open-weights models through vLLM or SGLang
    parse every past call's arguments to render the chat template and answer 400 to text
    that is not an object (single quotes, a reply cut mid-string, an array), on every
    later request: one malformed call ended the run, blamed on the arena. The model is
    told what was wrong in the call's tool result; the transcript keeps the raw text."""
    arguments = str(call["function"]["arguments"])
    return arguments if arguments_object(arguments) else "{}"


def normalise_calls(raw: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """Tool calls as they go back: every call gets an id (generated when the provider
    sent none or an empty one), a type, a name and an arguments string."""
    calls = []
    for index, call in enumerate(raw):
        raw_function = call.get("function")
        function: Mapping[str, Any] = raw_function if isinstance(raw_function, Mapping) else {}
        call_id = call.get("id")
        calls.append(
            {
                "id": call_id if isinstance(call_id, str) and call_id else f"call_t{turn}_{index}",
                "type": "function",
                "function": {
                    "name": str(function.get("name") or ""),
                    "arguments": _arguments_text(function.get("arguments")),
                },
            }
        )
    return calls


def _arguments_text(arguments: Any) -> str:
    """A call's arguments as the string the wire format wants (some providers send an
    object)."""
    if isinstance(arguments, Mapping):
        return json.dumps(arguments)
    return str(arguments or "")


def request_fields(
    *,
    max_out: int | None,
    openai: bool,
    openrouter: bool,
    temperature: float | None,
    reasoning: Reasoning | None,
    provider: ProviderRouting | None,
    extra_body: Mapping[str, Any],
) -> dict[str, Any]:
    """What goes in a request besides model, messages and tools. An output limit only when
    there is one (`max_completion_tokens` for api.openai.com, whose reasoning models refuse
    `max_tokens`); OpenRouter's `reasoning` and `provider` objects only to OpenRouter
    (elsewhere `reasoning_effort`); `extra_body` last."""
    body: dict[str, Any] = {}
    if max_out is not None:
        body["max_completion_tokens" if openai else "max_tokens"] = max_out
    if temperature is not None:
        body["temperature"] = temperature
    if reasoning is not None:
        if openrouter:
            body["reasoning"] = reasoning.model_dump(exclude_none=True)
        elif reasoning.effort is not None:
            body["reasoning_effort"] = reasoning.effort
    if provider is not None and openrouter:
        body["provider"] = provider.model_dump(exclude_none=True)
    body.update(extra_body)
    return body


def replay_messages(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rebuild the chat messages the agent sent from its transcript entries (the `entry`
    of each `agent_transcript` event, in order), before any shedding for the context
    window. Exact unless an entry was bounded."""
    messages: list[dict[str, Any]] = []
    for entry in entries:
        kind = entry.get("kind")
        if kind == "system":
            messages.append({"role": "system", "content": entry["content"]})
        elif kind in ("user", "feedback"):
            messages.append({"role": "user", "content": entry["content"]})
        elif kind == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": entry["content"]}
            message.update({k: entry[k] for k in REASONING_KEYS if k in entry})
            messages.append(message)
        elif kind == "tool_call" and messages and messages[-1]["role"] == "assistant":
            messages[-1].setdefault("tool_calls", []).append(
                {
                    "id": entry["id"],
                    "type": "function",
                    "function": {
                        "name": entry["name"],
                        "arguments": entry.get("sent_arguments", entry["arguments"]),
                    },
                }
            )
        elif kind == "tool_result":
            messages.append(
                {"role": "tool", "tool_call_id": entry["id"], "content": entry["content"]}
            )
        elif kind == "taken_out":
            take_out_reply(messages, entry["why"])
    return messages


def take_out_reply(messages: list[dict[str, Any]], why: str) -> str | None:
    """Take the last assistant turn out of `messages`, with the tool results answering its
    calls, and put in its place one user message saying what it was, what its calls ran
    and returned, and why it went (`why`: the provider's refusal). Returns that message,
    or None when there is no assistant turn to take out."""
    at = next((i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == "assistant"),
              None)  # fmt: skip
    if at is None:
        return None
    turn = messages[at]
    calls = {c["id"]: c["function"] for c in turn.get("tool_calls") or []}
    lines = [
        "Your previous reply was taken out of the conversation: the provider refused every "
        f"request that carried it ({why}). Do not repeat it as it was."
    ]
    if isinstance(turn.get("content"), str) and turn["content"]:
        lines.append(f"Its text: {bounded(turn['content'], 2000)}")
    kept = messages[:at]
    for message in messages[at + 1 :]:
        call = calls.get(message.get("tool_call_id", "")) if message["role"] == "tool" else None
        if call is None:
            kept.append(message)
            continue
        lines.append(
            f"It called {call['name']} with {bounded(str(call['arguments']), 2000)}, which "
            f"returned:\n{message['content']}"
        )
    note = "\n".join(lines)
    kept.insert(at, {"role": "user", "content": note})
    messages[:] = kept
    return note


# --- the agent ------------------------------------------------------------------------


class _ProviderFailure(Exception):
    """The API failed for good; `str()` is the terminal detail."""


class _Ended(Exception):
    """The run ends with `outcome`."""

    def __init__(self, outcome: AgentOutcome) -> None:
        super().__init__(outcome.terminal_detail)
        self.outcome = outcome


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
        max_output_tokens: int | None = None,
        bash_timeout_s: float = DEFAULT_BASH_TIMEOUT,
        request_timeout_s: float = 300.0,
        preflight_timeout_s: float = 10.0,
        max_corrections: int = 3,
        max_nudges: int = 3,
        max_context_recoveries: int = 3,
        context_window: int | None = None,
        provider: ProviderRouting | None = None,
        reasoning: Reasoning | None = None,
        temperature: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
        persistent_shell: bool = False,
        stream: bool = False,
        tool_output_limit: int = TOOL_OUTPUT_LIMIT,
        transcript_limit: int = TRANSCRIPT_FIELD_LIMIT,
        sleep: Callable[[float], Any] = asyncio.sleep,
        rand: Callable[[], float] | None = None,
        generation_lookup_delays_s: tuple[float, ...] = GENERATION_LOOKUP_DELAYS_S,
    ) -> None:
        self.model = model
        self.endpoint = endpoint
        self.limits = limits or Limits()
        self.price = price
        self.retry = retry or RetryPolicy()
        self.max_output_tokens = max_output_tokens
        self.bash_timeout_s = bash_timeout_s
        self.request_timeout_s = request_timeout_s
        self.preflight_timeout_s = preflight_timeout_s
        self.max_corrections = max_corrections
        self.max_nudges = max_nudges
        self.max_context_recoveries = max_context_recoveries
        self.context_window = context_window
        self.provider = provider
        self.reasoning = reasoning
        self.temperature = temperature
        self.extra_body = dict(extra_body or {})
        self.persistent_shell = persistent_shell
        self.stream = stream
        self.tool_output_limit = tool_output_limit
        self.transcript_limit = transcript_limit
        self.sleep = sleep
        self.rand = rand
        self.generation_lookup_delays_s = generation_lookup_delays_s
        self.facts: EndpointFacts | None = None

    @classmethod
    def from_settings(cls, model: str, settings: AgentSettings, env: Mapping[str, str]) -> LlmAgent:
        """An agent for `model` configured by `settings`; the price is the settings' own,
        else the built-in table's. Raises `AgentConfigError` (see `resolve_endpoint`)."""
        return cls(
            model,
            endpoint=resolve_endpoint(settings, env),
            limits=settings.limits,
            price=settings.price or find_price(model, builtin_prices()),
            max_output_tokens=settings.max_output_tokens,
            bash_timeout_s=settings.bash_timeout_s or DEFAULT_BASH_TIMEOUT,
            request_timeout_s=settings.request_timeout_s or 300.0,
            context_window=settings.context_window,
            provider=settings.provider,
            reasoning=settings.reasoning,
            temperature=settings.temperature,
            extra_body=settings.extra_body,
            persistent_shell=bool(settings.persistent_shell),
            stream=bool(settings.stream),
        )

    @property
    def openrouter(self) -> bool:
        return self.facts.openrouter if self.facts else self.endpoint.is_openrouter

    def window(self) -> int | None:
        """The model's context window: the settings', else OpenRouter's model list's."""
        if self.context_window is not None:
            return self.context_window
        return self.facts.context_window if self.facts else None

    async def preflight(self) -> None:
        """Check within `preflight_timeout_s` that the endpoint answers and accepts the key
        (OpenRouter: `GET /key`, and the model is in its list; elsewhere `GET /models`),
        and that a cost limit can be enforced. Raises a one-line `AgentConfigError`."""
        self.facts = await check_endpoint(self.endpoint, self.model, self.preflight_timeout_s)
        if self.limits.cost_microusd is not None and self.price is None and not self.openrouter:
            raise AgentConfigError(
                f"llm:{self.model} has a cost limit but its cost cannot be known: "
                f"{self.endpoint.base_url} reports no cost and no price is known for the model "
                f'(add [prices."{self.model}"] to the competitors file)'
            )

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        return await _Session(self, ctx).run()


def _status_message(exc: APIStatusError) -> str:
    """The provider's own error message (OpenAI's and OpenRouter's body shape), else the
    SDK's text."""
    body = exc.body
    if isinstance(body, Mapping) and body.get("message"):
        return error_text(body)
    if isinstance(body, str) and body.strip():
        return body
    return exc.message


def _status_problem(exc: APIStatusError) -> Problem:
    message = _one_line(_status_message(exc), 500)
    kind = classify_status(exc.status_code, message)
    return Problem(
        kind, f"HTTP {exc.status_code}: {message}", exc.status_code, exc.response.headers
    )


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
    chars_per_token: float = ctxwin.DEFAULT_CHARS_PER_TOKEN
    window: int | None = None
    max_out: int | None = None
    unusable: int = 0
    nudged: int = 0
    problem: str = ""
    unproven: bool = False
    """The model's last turn has not yet been in a request the provider accepted."""
    taken_out: int = 0
    """The model's turns taken out in a row because the provider refused them."""
    lookups: set[asyncio.Task[None]] = field(default_factory=set)
    """Generation lookups still running in the background (see `_count`)."""

    async def run(self) -> AgentOutcome:
        """The run, then the generation lookups it left (bounded by the match deadline), so
        their usage is reported before the agent ends; cancelled ones are cut short."""
        try:
            outcome = await self._run()
            await self._finish_lookups()
            return outcome
        finally:
            for task in self.lookups:
                task.cancel()

    async def _run(self) -> AgentOutcome:
        agent, started = self.agent, time.monotonic()
        wall_end = started + agent.limits.wall_s if agent.limits.wall_s else math.inf
        end = min(self.ctx.deadline, wall_end)
        self.window = agent.window()
        self.max_out = agent.max_output_tokens
        client = AsyncOpenAI(  # retries are ours (RetryPolicy), so the SDK must not retry too
            api_key=agent.endpoint.api_key,
            base_url=agent.endpoint.base_url,
            max_retries=0,
            timeout=agent.request_timeout_s,
        )
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
            return AgentOutcome("failed", False, bounded(str(exc), DETAIL_LIMIT), "arena")
        except _Ended as ended:
            return ended.outcome
        finally:
            await client.close()

    async def _loop(self, client: AsyncOpenAI) -> AgentOutcome:
        agent = self.agent
        shell = (
            "one session: the working directory and exported variables carry over to the "
            "next call; a call that runs past its timeout is still killed"
            if agent.persistent_shell
            else "a fresh shell each call"
        )
        prompt = SYSTEM_PROMPT.format(
            shell=shell,
            timeout=agent.bash_timeout_s,
            limit=agent.tool_output_limit,
            brief=self.ctx.brief,
        )
        await self._add({"role": "system", "content": prompt}, {"kind": "system"})
        await self._add({"role": "user", "content": START_MESSAGE}, {"kind": "user"})
        while True:
            await self._take_feedback()
            if (reached := limit_reached(agent.limits, self.spent)) is not None:
                return AgentOutcome("terminated", None, reached, "player")
            completion = await self._complete(client)
            self.spent.turns += 1
            summary = await self._take_turn(completion)
            if summary is not None:
                detail = bounded(summary, DETAIL_LIMIT) if summary else "declared done"
                return AgentOutcome("completed", True, detail)
            if self.unusable > agent.max_corrections:
                detail = (
                    f"model output unusable: {self.unusable} unusable responses in a row "
                    f"(last: {self.problem})"
                )
                return AgentOutcome("failed", False, bounded(detail, DETAIL_LIMIT), "player")
            if self.nudged > agent.max_nudges:
                detail = (
                    f"the model stopped using its tools: {self.nudged} replies in a row "
                    f"without a tool call (last: {self.problem})"
                )
                return AgentOutcome("failed", False, bounded(detail, DETAIL_LIMIT), "player")

    async def _take_turn(self, completion: Completion) -> str | None:
        """Act on one completion. Returns the `done` summary when the run is finished."""
        message, finish = completion.message, completion.finish_reason
        calls = normalise_calls(completion.tool_calls, self.spent.turns)
        served = {
            k: v
            for k, v in (
                ("finish_reason", finish),
                ("native_finish_reason", completion.native_finish_reason),
                ("provider", completion.provider),
                ("served_model", completion.model),
            )
            if v is not None
        }
        if finish in ("length", "content_filter"):
            turn = assistant_message(message, None)  # its calls are not run, so not sent
            await self._record_dropped(message, calls, served, finish)
            if turn is not None:
                await self._add(turn, {"kind": "assistant", **served, **reasoning_of(turn)})
            note = LENGTH_NOTE if finish == "length" else FILTER_NOTE
            await self._add({"role": "user", "content": note}, {"kind": "user"})
            if finish == "length":
                self._more_room(completion)
            self._unusable(f"the reply was cut (finish_reason {finish})")
            return None
        turn = assistant_message(message, calls)
        if turn is None:
            await self._record_dropped(message, calls, served, "empty")
            await self._add({"role": "user", "content": EMPTY_NOTE}, {"kind": "user"})
            self._unusable("your reply had neither text nor a tool call")
            return None
        await self._add(turn, {"kind": "assistant", **served, **reasoning_of(turn)})
        if not calls:
            self.nudged += 1
            self.problem = _one_line(str(turn["content"]), 200)
            await self._add({"role": "user", "content": NUDGE}, {"kind": "user"})
            return None
        self.nudged = 0
        return await self._run_calls(calls)

    def _unusable(self, problem: str) -> None:
        self.unusable += 1
        self.problem = problem

    def _more_room(self, completion: Completion) -> None:
        """After a `length` cut: ask for twice the output the cut reply had."""
        used = int((completion.usage or {}).get("completion_tokens") or 0)
        grown = max(2 * used, 2 * (self.max_out or 0), 4096)
        cap = (self.agent.facts.max_output_tokens if self.agent.facts else None) or grown
        if self.window is not None:
            cap = min(cap, max(self.window // 2, 1024))
        self.max_out = min(grown, cap)

    async def _run_calls(self, calls: list[dict[str, Any]]) -> str | None:
        """Run the tool calls of one response in order. Returns the done summary if `done`
        was called. A response counts as unusable only if none of its calls was usable."""
        for call in calls:
            entry = {
                "kind": "tool_call",
                "id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],  # as the model wrote them
            }
            if (sent := sent_arguments(call)) != entry["arguments"]:
                entry["sent_arguments"] = sent
            await self._record(entry)
        usable, problem = 0, ""
        for call in calls:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            try:
                args = parse_tool_arguments(name, arguments)
            except ToolCallError as exc:
                problem = str(exc)
                result = f"Error: {exc}. Call the tool again with corrected arguments."
                if sent_arguments(call) != arguments:  # the conversation shows {} instead
                    result += f" You sent: {bounded(arguments, 500)}"
            else:
                usable += 1
                if name == "done":
                    return str(args["summary"])
                result = await run_tool(
                    self.ctx.host,
                    name,
                    args,
                    bash_timeout_s=self.agent.bash_timeout_s,
                    limit=self.agent.tool_output_limit,
                    persistent=self.agent.persistent_shell,
                )
            await self._add(
                {"role": "tool", "tool_call_id": call["id"], "content": result},
                {"kind": "tool_result", "id": call["id"], "name": name},
            )
        if usable:
            self.unusable = 0
        else:
            self._unusable(problem)
        return None

    # --- requests ---------------------------------------------------------------------

    def _body(self) -> dict[str, Any]:
        agent = self.agent
        return request_fields(
            max_out=self.max_out,
            openai=agent.endpoint.is_openai,
            openrouter=agent.openrouter,
            temperature=agent.temperature,
            reasoning=agent.reasoning,
            provider=agent.provider,
            extra_body=agent.extra_body,
        )

    async def _complete(self, client: AsyncOpenAI) -> Completion:
        agent = self.agent
        attempt = context_tries = 0
        while True:
            attempt += 1
            await self._fit()
            sent = ctxwin.wire(self.messages)
            result = await self._request(client, sent)
            if isinstance(result, Completion):
                if self.unproven:
                    self.unproven, self.taken_out = False, 0
                await self._count(result.usage, result.generation_id)
                prompt = int((result.usage or {}).get("prompt_tokens") or 0)
                if prompt > 0:
                    self.chars_per_token = min(max(ctxwin.message_chars(sent) / prompt, 1.5), 6.0)
                return result
            if result.usage is not None or result.generation_id is not None:
                await self._count(result.usage, result.generation_id)
            elif result.status is None and result.why.startswith("request timed out"):
                self.spent.unknown_cost_requests += 1
                await self._warn(
                    "timeout",
                    "a request timed out and was sent again: the provider may have billed "
                    "it, and its usage is unknown (stream = true lets it be looked up)",
                )
            if result.kind == "budget":
                raise _Ended(
                    AgentOutcome(
                        "terminated",
                        None,
                        bounded(
                            f"the API key's credits are used up (HTTP 402): {result.why}",
                            DETAIL_LIMIT,
                        ),
                        "player",
                    )
                )
            if result.kind == "context":
                context_tries += 1
                if context_tries > agent.max_context_recoveries:
                    raise _Ended(
                        AgentOutcome(
                            "failed",
                            False,
                            bounded(
                                "the conversation does not fit the model's context window "
                                f"even after shedding old turns ({context_tries} context-length "
                                f"errors in a row): {result.why}",
                                DETAIL_LIMIT,
                            ),
                            "player",
                        )
                    )
                estimate = ctxwin.estimate_tokens(sent, self.chars_per_token)
                named = window_from_error(result.why)
                counted = input_tokens_from_error(result.why)
                if counted is not None and counted > estimate:  # our estimate was low
                    self.chars_per_token *= estimate / counted
                else:
                    self.chars_per_token *= 0.8
                if named is not None:
                    self.window = min(named, self.window or named)
                else:  # no number given: assume the window is a quarter below this request
                    fallback = int(estimate * 0.75) + self._reserve()
                    self.window = min(fallback, self.window or fallback)
                if self.max_out is not None:
                    self.max_out = min(self.max_out, max(self.window // 4, 256))
                await self._record({"kind": "retry", "attempt": attempt, "error": result.why,
                                    "delay_s": 0.0})  # fmt: skip
                attempt -= 1  # shedding, not a provider failure
                continue
            if result.kind == "refused" and self.unproven:
                await self._take_out(result.why)
                attempt -= 1  # the model's doing, not a provider failure
                continue
            if result.kind in ("refused", "auth"):
                raise _ProviderFailure(f"LLM API refused the request: {result.why}")
            if attempt >= agent.retry.attempts:
                raise _ProviderFailure(f"LLM API failed {attempt} times; last: {result.why}")
            if self.agent.rand is not None:
                delay = retry_delay(attempt, result.headers, agent.retry, rand=self.agent.rand)
            else:
                delay = retry_delay(attempt, result.headers, agent.retry)
            await self._record(
                {"kind": "retry", "attempt": attempt, "error": result.why, "delay_s": delay}
            )
            await self.agent.sleep(delay)

    async def _request(
        self, client: AsyncOpenAI, sent: list[dict[str, Any]]
    ) -> Completion | Problem:
        if self.agent.stream:
            return await self._stream(client, sent)
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=self.agent.model,
                messages=cast(Any, sent),
                tools=cast(Any, TOOLS),
                extra_body=self._body() or None,
            )
        except APIStatusError as exc:
            return _status_problem(exc)
        except APIConnectionError as exc:
            why = "request timed out" if isinstance(exc, APITimeoutError) else str(exc)
            return Problem("retry", why or type(exc).__name__)
        text = raw.http_response.text
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        result = read_completion(body, text)
        if isinstance(result, Problem) and result.headers is None:
            return Problem(
                result.kind,
                result.why,
                result.status,
                raw.http_response.headers,
                result.usage,
                result.generation_id,
            )
        return result

    async def _stream(
        self, client: AsyncOpenAI, sent: list[dict[str, Any]]
    ) -> Completion | Problem:
        """One streamed request: usage comes in the final chunk; an error event mid-stream
        or a stall past the request timeout is a provider failure whose generation id is
        known (so its usage can be looked up)."""
        extra = self._body()
        if not self.agent.openrouter:  # OpenRouter always sends usage; others must be asked
            extra["stream_options"] = {"include_usage": True}
        reply = StreamedReply()
        try:
            async with asyncio.timeout(self.agent.request_timeout_s):
                stream = await client.chat.completions.create(
                    model=self.agent.model,
                    messages=cast(Any, sent),
                    tools=cast(Any, TOOLS),
                    stream=True,
                    extra_body=extra,
                )
                async for chunk in stream:
                    reply.add(chunk.to_dict())
        except APIStatusError as exc:
            return _status_problem(exc)
        except (APIConnectionError, TimeoutError) as exc:
            timed_out = isinstance(exc, APITimeoutError | TimeoutError)
            why = "request timed out" if timed_out else str(exc) or type(exc).__name__
            if reply.id is not None:
                why += f" (mid-stream, generation {reply.id})"
            return Problem("retry", why, None, None, reply.usage, reply.id)
        except APIError as exc:  # an error event in the stream
            why = f"error in the stream: {error_text(exc.body) if exc.body else exc.message}"
            return Problem("retry", why, None, None, reply.usage, reply.id)
        return read_completion(reply.body())

    async def _take_out(self, why: str) -> None:
        """The provider refused a request carrying the model's newest turn, after accepting
        the conversation without it: take the turn out (its calls' results stay, as text)
        and ask again. If the provider then accepts, the refusal was the model's doing and
        counts against it (`max_corrections` in a row end the run as the player's failure);
        if it refuses again, nothing of the model's is new, and the arena failed."""
        self.unproven = False
        self.taken_out += 1
        if self.taken_out > self.agent.max_corrections:
            detail = (
                f"model output unusable: the provider refused {self.taken_out} of its replies "
                f"in a row (last: {why})"
            )
            raise _Ended(AgentOutcome("failed", False, bounded(detail, DETAIL_LIMIT), "player"))
        if take_out_reply(self.messages, why) is not None:
            await self._record({"kind": "taken_out", "why": why})

    def _reserve(self) -> int:
        if self.max_out is not None:
            return self.max_out
        return min(OUTPUT_RESERVE, (self.window or 4 * OUTPUT_RESERVE) // 4)

    async def _fit(self) -> None:
        """Shed old content before a request that would not fit the window."""
        if self.window is None:
            return
        tools = int(len(json.dumps(TOOLS)) / self.chars_per_token)
        budget = int(self.window * 0.95) - self._reserve() - tools

        def estimate(messages: list[dict[str, Any]]) -> int:
            return ctxwin.estimate_tokens(messages, self.chars_per_token)

        before = estimate(self.messages)
        shed, dropped = ctxwin.fit(self.messages, budget, estimate)
        if shed or dropped:
            await self._record(
                {
                    "kind": "context",
                    "content": f"shed {shed} old outputs and dropped {dropped} old turns to "
                    f"fit the context window ({self.window} tokens)",
                    "estimate_before": before,
                    "estimate_after": estimate(self.messages),
                    "budget": budget,
                }
            )

    async def _count(self, raw: Mapping[str, Any] | None, generation_id: str | None) -> None:
        """Count one response's usage: its own; else, on OpenRouter, its generation record,
        looked up in the background (the record appears seconds later, and the next turn
        must not wait for it); else unknown."""
        if raw is not None:
            await self._spend(usage_of(raw, self.agent.price), raw, None)
        elif generation_id is not None and self.agent.openrouter:
            task = asyncio.create_task(self._reconcile(generation_id))
            self.lookups.add(task)
            task.add_done_callback(self.lookups.discard)
        else:
            self.spent.unknown_cost_requests += 1
            await self._warn("usage", "the LLM API reported no usage: tokens and cost unknown")

    async def _reconcile(self, generation_id: str) -> None:
        """Look a generation up on OpenRouter with a bounded back-off; count its usage when
        found (later turns' limit checks see it), warn once when it never is."""
        agent = self.agent
        try:
            data = await lookup_generation(
                agent.endpoint,
                generation_id,
                agent.preflight_timeout_s,
                agent.generation_lookup_delays_s,
            )
            if data is None:
                self.spent.unknown_cost_requests += 1
                waited = sum(agent.generation_lookup_delays_s)
                await self._warn(
                    "generation",
                    f"generation {generation_id} reported no usage and OpenRouter had no record "
                    f"of it after {len(agent.generation_lookup_delays_s)} lookups over "
                    f"{waited:g}s: its tokens and cost are unknown",
                )
                return
            await self._spend(usage_of_generation(data, agent.price), None, generation_id)
        except Exception:  # accounting must never end the run; the log says why
            log.exception("%s: looking up generation %s", self.ctx.territory, generation_id)

    async def _finish_lookups(self) -> None:
        """Wait for the generation lookups still running, at most until the match deadline;
        those cut short are counted as unknown usage."""
        pending = set(self.lookups)
        if not pending:
            return
        budget = max(0.0, self.ctx.deadline - time.monotonic())
        _, unfinished = await asyncio.wait(pending, timeout=budget)
        for task in unfinished:
            task.cancel()
        if unfinished:
            self.spent.unknown_cost_requests += len(unfinished)
            await self._warn(
                "generation-cut",
                f"{len(unfinished)} generation lookup(s) were still waiting for OpenRouter's "
                "record when the match ended: their tokens and cost are unknown",
            )

    async def _spend(
        self, usage: Usage, raw: Mapping[str, Any] | None, generation_id: str | None
    ) -> None:
        """Add one response's usage to what was spent and report it."""
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
        extras: dict[str, object] = {
            k: v
            for k, v in (
                ("reasoning_tokens", usage.reasoning_tokens),
                ("cache_write_tokens", usage.cache_write_tokens),
                ("byok", usage.byok),
            )
            if v
        }
        if generation_id is not None:
            extras["generation"] = generation_id
        if extras or raw is None:
            await self._record({"kind": "usage", "from_generation": raw is None, **extras})

    # --- the conversation -------------------------------------------------------------

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
        if message["role"] == "assistant":
            self.unproven = True
        self.messages.append(message)
        await self._record({**entry, "content": message["content"]})

    async def _record_dropped(
        self,
        message: Mapping[str, Any],
        calls: list[dict[str, Any]],
        served: dict[str, Any],
        why: str,
    ) -> None:
        """A reply that is not sent back as it came (cut, filtered, empty), for the record."""
        await self._record(
            {
                "kind": "discarded",
                "why": why,
                "content": message.get("content")
                if isinstance(message.get("content"), str)
                else None,
                "tool_calls": json.dumps(calls) if calls else None,
                **served,
                **reasoning_of(message),
            }
        )

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
