"""What a chat-completions provider's answers mean: completions, errors, usage, retries.

Pure functions over the JSON a provider sent (OpenAI's wire format with OpenRouter's
additions: `error.metadata`, `native_finish_reason`, `provider`, the reasoning fields,
`usage.cost`, `cost_details`, `is_byok`). Nothing here does I/O.
"""

from __future__ import annotations

import email.utils
import math
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Literal

from opsarena.agents.spec import Price

REASONING_KEYS = ("reasoning", "reasoning_content", "reasoning_details")
"""Fields of an assistant message that carry its reasoning; they go back unchanged."""

ProblemKind = Literal["retry", "refused", "budget", "context", "auth"]


@dataclass(frozen=True)
class RetryPolicy:
    """How transient API errors are retried. `attempts` counts the first try; a
    Retry-After (or retry-after-ms) header is honoured up to `max_retry_after_s`,
    otherwise the delay doubles from `initial_delay_s` up to `max_delay_s`, less a random
    part of up to `jitter` of it (so competitors sharing a key do not retry in step)."""

    attempts: int = 6
    initial_delay_s: float = 1.0
    max_delay_s: float = 30.0
    max_retry_after_s: float = 120.0
    jitter: float = 0.5


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
    retry: int,
    headers: Mapping[str, str] | None,
    policy: RetryPolicy,
    now: float | None = None,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retry number `retry` (1 for the first retry)."""
    asked = parse_retry_after(headers, now)
    if asked is not None:
        return min(max(asked, 0.0), policy.max_retry_after_s)
    base = float(min(policy.initial_delay_s * 2 ** (retry - 1), policy.max_delay_s))
    return base * (1.0 - policy.jitter * rand())


def is_retryable(status: int | None) -> bool:
    """Timeouts and connection failures (status None), 408, 409, 429 and 5xx are transient."""
    return status is None or status in (408, 409, 429) or status >= 500


_CONTEXT_RE = re.compile(
    r"context[ _-]?(length|window)|maximum context|too many tokens|prompt is too long|"
    r"context_length_exceeded|reduce the length",
    re.IGNORECASE,
)
_WINDOW_RE = re.compile(r"(?:maximum context length|context window|context length) is (\d+)")


def is_context_error(message: str) -> bool:
    """Whether an error message says the conversation is over the model's window."""
    return bool(_CONTEXT_RE.search(message))


_INPUT_RE = re.compile(r"(\d+) (?:tokens )?of text input|prompt is (\d+) tokens|(\d+) input tokens")


def input_tokens_from_error(message: str) -> int | None:
    """The prompt size an over-the-window error reports, if it does."""
    found = _INPUT_RE.search(message)
    if not found:
        return None
    return int(next(g for g in found.groups() if g))


def window_from_error(message: str) -> int | None:
    """The window an over-the-window error names ("maximum context length is N tokens")."""
    found = _WINDOW_RE.search(message)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Problem:
    """A request that produced no usable completion. `kind`: `retry` (transient),
    `refused` (the request will not succeed as sent), `budget` (the key's credits, HTTP
    402), `context` (over the model's window), `auth` (the key was refused)."""

    kind: ProblemKind
    why: str
    status: int | None = None
    headers: Mapping[str, str] | None = None
    usage: Mapping[str, Any] | None = None
    generation_id: str | None = None


@dataclass(frozen=True)
class Completion:
    """One usable choice of a completion, as sent."""

    message: dict[str, Any]
    finish_reason: str | None
    native_finish_reason: str | None
    usage: Mapping[str, Any] | None
    provider: str | None
    model: str | None
    generation_id: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def error_text(error: Any) -> str:
    """An error object's message with what OpenRouter adds: the provider that failed
    (`metadata.provider_name`) and its own words (`metadata.raw`)."""
    if not isinstance(error, Mapping):
        return str(error)
    message = str(error.get("message") or "no message")
    metadata = error.get("metadata")
    if isinstance(metadata, Mapping):
        if provider := metadata.get("provider_name"):
            message += f" (provider {provider})"
        raw = metadata.get("raw")
        if raw:
            message += f": {raw if isinstance(raw, str) else repr(raw)}"
    return message


def classify_status(status: int, message: str) -> ProblemKind:
    """What an HTTP error status means for the run."""
    if status == 402:
        return "budget"
    if status in (401, 403) and not is_context_error(message):
        return "auth" if status == 401 else "refused"
    if status in (400, 413, 422) and is_context_error(message):
        return "context"
    return "retry" if is_retryable(status) else "refused"


def read_completion(body: Any, text: str = "") -> Completion | Problem:
    """Read a 200 response's body (`text` is the raw body, for messages). A 200 can still
    carry an error (OpenRouter: "any error occurred while the LLM is producing the output
    will be emitted in the response body"), no choices, or `finish_reason` "error"."""
    if not isinstance(body, Mapping):
        shown = " ".join(text.split())[:200]
        return Problem("retry", f"the API answered with a body that is not JSON: {shown!r}")
    generation_id = body.get("id") if isinstance(body.get("id"), str) else None
    usage = body.get("usage") if isinstance(body.get("usage"), Mapping) else None
    if body.get("error") is not None:
        error = body["error"]
        code = error.get("code") if isinstance(error, Mapping) else None
        status = code if isinstance(code, int) and not isinstance(code, bool) else None
        why = f"error in a 200 response (code {code}): {error_text(error)}"
        kind = classify_status(status, why) if status is not None else "retry"
        if kind in ("refused", "auth") and status not in (400, 401, 403):
            kind = "retry"
        return Problem(kind, why, status, None, usage, generation_id)
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return Problem(
            "retry", "the API answered with no choices", None, None, usage, generation_id
        )
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, Mapping):
        return Problem("retry", "the API's choice has no message", None, None, usage, generation_id)
    finish = choice.get("finish_reason")
    native = choice.get("native_finish_reason")
    if finish == "error" or (isinstance(choice.get("error"), Mapping)):
        why = "the provider failed while generating (finish_reason error"
        why += f", native {native})" if native else ")"
        if isinstance(choice.get("error"), Mapping):
            why += f": {error_text(choice['error'])}"
        return Problem("retry", why, None, None, usage, generation_id)
    calls = message.get("tool_calls")
    return Completion(
        message=dict(message),
        finish_reason=finish if isinstance(finish, str) else None,
        native_finish_reason=native if isinstance(native, str) else None,
        usage=usage,
        provider=body.get("provider") if isinstance(body.get("provider"), str) else None,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        generation_id=generation_id,
        tool_calls=[dict(c) for c in calls if isinstance(c, Mapping)]
        if isinstance(calls, list)
        else [],
    )


# --- usage and cost ---------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """One response's usage. `cost_microusd` is None when neither the provider nor a price
    says what it cost. With BYOK (`is_byok`) the provider's bill is added to OpenRouter's."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost_microusd: int | None
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    byok: bool = False


def _microusd(value: Decimal) -> int:
    return int(value.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def _usd(value: Any) -> Decimal | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return Decimal(str(value)) if value >= 0 else None
    return None


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


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
    `cost` (USD, as OpenRouter reports it; plus `cost_details.upstream_inference_cost`
    when `is_byok`, which OpenRouter's cost leaves out) when present, else priced, else None."""
    input_tokens = _count(raw.get("prompt_tokens"))
    output_tokens = _count(raw.get("completion_tokens"))
    details = raw.get("prompt_tokens_details")
    details = details if isinstance(details, Mapping) else {}
    out_details = raw.get("completion_tokens_details")
    out_details = out_details if isinstance(out_details, Mapping) else {}
    cached = _count(details.get("cached_tokens"))
    byok = raw.get("is_byok") is True
    cost: int | None = None
    if (reported := _usd(raw.get("cost"))) is not None:
        total = reported
        cost_details = raw.get("cost_details")
        if byok and isinstance(cost_details, Mapping):
            total += _usd(cost_details.get("upstream_inference_cost")) or Decimal(0)
        cost = _microusd(total * 1_000_000)
    if cost is None and price is not None:
        cost = priced_cost_microusd(input_tokens, output_tokens, cached, price)
    return Usage(
        input_tokens,
        output_tokens,
        cached,
        cost,
        reasoning_tokens=_count(out_details.get("reasoning_tokens")),
        cache_write_tokens=_count(details.get("cache_write_tokens")),
        byok=byok,
    )


def usage_of_generation(data: Mapping[str, Any], price: Price | None) -> Usage:
    """Usage from OpenRouter's `GET /generation` record (`total_cost` in USD, plus
    `upstream_inference_cost` for BYOK)."""
    raw: dict[str, Any] = {
        "prompt_tokens": data.get("native_tokens_prompt") or data.get("tokens_prompt"),
        "completion_tokens": data.get("native_tokens_completion") or data.get("tokens_completion"),
        "prompt_tokens_details": {"cached_tokens": data.get("native_tokens_cached")},
        "completion_tokens_details": {"reasoning_tokens": data.get("native_tokens_reasoning")},
        "cost": data.get("total_cost"),
        "is_byok": data.get("is_byok"),
        "cost_details": {"upstream_inference_cost": data.get("upstream_inference_cost")},
    }
    return usage_of(raw, price)


# --- streaming --------------------------------------------------------------------------


@dataclass
class StreamedReply:
    """A streamed response put back together, chunk by chunk (`add`), into the body a
    non-streamed response would have had (`body`)."""

    id: str | None = None
    model: str | None = None
    provider: str | None = None
    content: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    native_finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None

    def add(self, chunk: Mapping[str, Any]) -> None:
        for key in ("id", "model", "provider"):
            if isinstance(chunk.get(key), str) and getattr(self, key) is None:
                setattr(self, key, chunk[key])
        if isinstance(chunk.get("usage"), Mapping):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            if choice.get("native_finish_reason"):
                self.native_finish_reason = choice["native_finish_reason"]
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                self._delta(delta)

    def _delta(self, delta: Mapping[str, Any]) -> None:
        if isinstance(delta.get("content"), str):
            self.content += delta["content"]
        for key in ("reasoning", "reasoning_content"):
            if isinstance(delta.get(key), str):
                self.fields[key] = self.fields.get(key, "") + delta[key]
        for detail in delta.get("reasoning_details") or []:
            details = self.fields.setdefault("reasoning_details", [])
            last = details[-1] if details else None
            if (
                isinstance(last, dict)
                and isinstance(detail, Mapping)
                and last.get("index") == detail.get("index")
                and last.get("type") == detail.get("type")
                and isinstance(detail.get("text"), str)
            ):
                last["text"] = str(last.get("text") or "") + detail["text"]
                last.update({k: v for k, v in detail.items() if k != "text" and v is not None})
            else:
                details.append(dict(detail) if isinstance(detail, Mapping) else detail)
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, Mapping):
                continue
            slot = self.calls.setdefault(
                int(call.get("index") or 0),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if call.get("id"):
                slot["id"] = call["id"]
            function = call.get("function")
            if isinstance(function, Mapping):
                if function.get("name"):
                    slot["function"]["name"] = function["name"]
                if isinstance(function.get("arguments"), str):
                    slot["function"]["arguments"] += function["arguments"]

    def body(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        message.update(self.fields)
        body: dict[str, Any] = {
            "id": self.id,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": self.finish_reason,
                    "native_finish_reason": self.native_finish_reason,
                }
            ],
        }
        if self.provider is not None:
            body["provider"] = self.provider
        if self.usage is not None:
            body["usage"] = self.usage
        return body
