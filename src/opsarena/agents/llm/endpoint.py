"""Where an llm agent's API is, and what it says about itself: key, model list, generations.

OpenRouter is told apart by asking: `GET /key` answers 401 for a bad key and reports the
key's remaining limit (its `GET /models` needs no key, so it proves nothing about one);
any other server is checked with an authenticated `GET /models`. OpenRouter's public
model list gives the model's context window; `GET /generation?id=` gives the usage of a
response the agent could not use (asked again with a back-off: OpenRouter records a
generation's stats seconds after it ended). The built-in price table lives here too.
"""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from opsarena.agents.spec import AgentSettings, Price
from opsarena.errors import AgentConfigError

ENV_BASE_URL = ("OPSARENA_LLM_BASE_URL", "OPENAI_BASE_URL")
ENV_API_KEY = ("OPSARENA_LLM_API_KEY", "OPENAI_API_KEY")
DEFAULT_BASE_URL = "https://api.openai.com/v1"


@dataclass(frozen=True)
class Endpoint:
    """Where an llm agent's API is, and where its key came from (for messages).
    `openrouter` is what the URL suggests; the preflight finds out for sure."""

    base_url: str
    api_key: str
    key_source: str
    openrouter: bool | None = None

    @property
    def is_openrouter(self) -> bool:
        if self.openrouter is not None:
            return self.openrouter
        host = urlsplit(self.base_url).hostname or ""
        return host == "openrouter.ai" or host.endswith(".openrouter.ai")

    @property
    def is_openai(self) -> bool:
        return (urlsplit(self.base_url).hostname or "") == "api.openai.com"


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


@dataclass(frozen=True)
class EndpointFacts:
    """What the preflight learnt. `remaining_usd` is the key's limit left (None: none)."""

    openrouter: bool
    context_window: int | None = None
    max_output_tokens: int | None = None
    remaining_usd: float | None = None


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return _one_line(response.text)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return _one_line(str(error["message"]))
    return _one_line(response.text)


async def check_endpoint(endpoint: Endpoint, model: str, timeout: float) -> EndpointFacts:
    """Check that the endpoint answers and accepts the key, and learn about `model`.
    Raises a one-line `AgentConfigError`."""
    url = endpoint.base_url.rstrip("/")
    auth = {"Authorization": f"Bearer {endpoint.api_key}"}
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            key = await http.get(f"{url}/key", headers=auth)
            if key.status_code in (401, 403):
                raise AgentConfigError(
                    f"LLM endpoint {url} refused the key from {endpoint.key_source} "
                    f"(HTTP {key.status_code}): check the key"
                )
            data = _data(key)
            if key.status_code == 200 and data is not None:
                return await _openrouter_facts(http, url, model, data, endpoint)
            models = await http.get(f"{url}/models", headers=auth)
    except httpx.TimeoutException:
        raise AgentConfigError(
            f"LLM endpoint {url} is not reachable (timed out): check OPSARENA_LLM_BASE_URL "
            "or base_url"
        ) from None
    except httpx.HTTPError as exc:
        raise AgentConfigError(
            f"LLM endpoint {url} is not reachable ({_one_line(str(exc)) or type(exc).__name__}):"
            " check OPSARENA_LLM_BASE_URL or base_url"
        ) from None
    if models.status_code in (401, 403):
        raise AgentConfigError(
            f"LLM endpoint {url} refused the key from {endpoint.key_source} "
            f"(HTTP {models.status_code}): check the key"
        )
    if models.status_code not in (200, 404):  # a 404 still proves it reachable
        raise AgentConfigError(
            f"LLM endpoint {url} answered HTTP {models.status_code} to GET /models: "
            f"{_message(models)}"
        )
    return EndpointFacts(openrouter=False)


def _data(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    data = body.get("data") if isinstance(body, dict) else None
    return data if isinstance(data, dict) else None


async def _openrouter_facts(
    http: httpx.AsyncClient, url: str, model: str, key: dict[str, Any], endpoint: Endpoint
) -> EndpointFacts:
    remaining = key.get("limit_remaining")
    remaining_usd = float(remaining) if isinstance(remaining, int | float) else None
    if remaining_usd is not None and remaining_usd <= 0:
        raise AgentConfigError(
            f"the key from {endpoint.key_source} has no credit left on {url} "
            f"(limit_remaining {remaining}): raise its limit or add credits"
        )
    listing = await http.get(f"{url}/models")
    if listing.status_code != 200:
        raise AgentConfigError(
            f"LLM endpoint {url} answered HTTP {listing.status_code} to GET /models: "
            f"{_message(listing)}"
        )
    try:
        entries = listing.json().get("data") or []
    except (ValueError, AttributeError):
        entries = []
    listed = (
        {e.get("id"): e for e in entries if isinstance(e, dict)}
        if isinstance(entries, list)
        else {}
    )
    # Routing shortcuts (`:nitro`, `:floor`, `:online`) are not listed as models of their own.
    for name in (model, model.rsplit(":", 1)[0]):
        entry = listed.get(name)
        if entry is not None:
            return _model_facts(entry, remaining_usd)
    raise AgentConfigError(f"model {model!r} is not in {url}/models: check the model name")


def _model_facts(entry: dict[str, Any], remaining_usd: float | None) -> EndpointFacts:
    top_raw = entry.get("top_provider")
    top: dict[str, Any] = top_raw if isinstance(top_raw, dict) else {}
    windows = [
        w
        for w in (entry.get("context_length"), top.get("context_length"))
        if isinstance(w, int) and w > 0
    ]  # the smaller: routing may pick a provider other than the top one
    output = top.get("max_completion_tokens")
    return EndpointFacts(
        openrouter=True,
        context_window=min(windows) if windows else None,
        max_output_tokens=int(output) if isinstance(output, int) else None,
        remaining_usd=remaining_usd,
    )


GENERATION_LOOKUP_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0)
"""Seconds to wait before each lookup of a generation's record: OpenRouter answers 404
until it has recorded a generation's stats, a few seconds after the generation ended."""


async def lookup_generation(
    endpoint: Endpoint,
    generation_id: str,
    timeout: float,
    delays_s: Sequence[float] = GENERATION_LOOKUP_DELAYS_S,
    *,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> dict[str, Any] | None:
    """OpenRouter's record of one generation (`GET /generation?id=`: its usage and cost),
    asked after each delay of `delays_s` in turn while the answer is 404 (not recorded
    yet), 408, 429, a 5xx or no answer; None when it never came, or at once on an answer
    that asking again cannot change (400, 401, 403, a body without `data`)."""
    url = endpoint.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {endpoint.api_key}"}
    async with httpx.AsyncClient(timeout=timeout) as http:
        for delay in delays_s:
            await sleep(delay)
            try:
                response = await http.get(
                    f"{url}/generation", params={"id": generation_id}, headers=headers
                )
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                return _data(response)
            if response.status_code not in (404, 408, 429) and response.status_code < 500:
                return None
    return None
