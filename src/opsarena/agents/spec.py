"""Agent specs and settings as data: what a competitor is (`AgentSpec`) and its knobs.

A spec names what competes: `scripted:NAME`, `command:PROGRAM ARGS...`, `llm:MODEL` or
`human`. Settings (`AgentSettings`) carry the per-competitor knobs a competitors file or
the command line gives (model, endpoint, limits, prices, routing, reasoning). This module
only describes; `opsarena.agents.registry` parses specs and builds agents by kind, so no
agent module imports anything that imports it back.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def _finite_positive(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError("must be a finite number above 0")
    return value


class Limits(BaseModel):
    """What one agent may spend. `None` means no limit of that kind. Reaching a limit ends
    the agent with a `terminal_detail` naming it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turns: int | None = Field(default=None, gt=0, description="model responses")
    input_tokens: int | None = Field(default=None, gt=0)
    output_tokens: int | None = Field(default=None, gt=0)
    cost_microusd: int | None = Field(default=None, gt=0)
    wall_s: float | None = Field(default=None, gt=0, description="seconds from the agent's start")

    _check_wall = field_validator("wall_s")(_finite_positive)


class Price(BaseModel):
    """A model's price in USD per million tokens (which is micro-USD per token).
    `cached_input_usd_per_mtok` applies to cached prompt tokens; the input price when absent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    cached_input_usd_per_mtok: float | None = Field(default=None, ge=0)


class ProviderRouting(BaseModel):
    """OpenRouter's `provider` object (its provider-routing docs): which providers may
    serve the model, in what order, and how strictly. Sent only to OpenRouter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    order: list[str] | None = Field(default=None, min_length=1)
    only: list[str] | None = Field(default=None, min_length=1)
    ignore: list[str] | None = Field(default=None, min_length=1)
    allow_fallbacks: bool | None = None
    require_parameters: bool | None = None
    quantizations: list[str] | None = Field(default=None, min_length=1)
    data_collection: Literal["allow", "deny"] | None = None
    sort: Literal["price", "throughput", "latency"] | None = None


class Reasoning(BaseModel):
    """How much the model reasons: OpenRouter's `reasoning` object (`effort` or
    `max_tokens`, not both; `exclude` hides the reasoning from the response). Elsewhere
    only `effort` is sent, as `reasoning_effort`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    exclude: bool | None = None

    @model_validator(mode="after")
    def _one_of(self) -> Reasoning:
        if self.effort is not None and self.max_tokens is not None:
            raise ValueError("give effort or max_tokens, not both")
        return self


RESERVED_BODY_KEYS = frozenset(
    {"model", "messages", "tools", "tool_choice", "stream", "stream_options", "n"}
)
"""Request fields the agent itself owns; `extra_body` may not set them."""

LLM_ONLY_SETTINGS = frozenset(
    {
        "base_url",
        "api_key_env",
        "price",
        "max_output_tokens",
        "bash_timeout_s",
        "request_timeout_s",
        "context_window",
        "provider",
        "reasoning",
        "temperature",
        "extra_body",
        "persistent_shell",
        "stream",
    }
)
COMMAND_ONLY_SETTINGS = frozenset({"env", "grace_s", "paths", "network"})
LLM_ONLY_LIMITS = frozenset(
    {"limits.turns", "limits.input_tokens", "limits.output_tokens", "limits.cost_microusd"}
)
"""Limits only a model's agent can count (`AgentSettings.explicit` names them so)."""
EVERY_LIMIT = LLM_ONLY_LIMITS | {"limits.wall_s"}


class AgentSettings(BaseModel):
    """Per-competitor settings. Which apply depends on the kind: those in
    `LLM_ONLY_SETTINGS` are for `llm`; `env`, `grace_s`, `paths` (absolute paths the
    program may read, bound read-only into its sandbox) and `network` (true: the program
    shares the machine's network, e.g. to reach its own model API; default none) for
    `command`; `model` (the name the record shows) and `limits.wall_s` for every kind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    limits: Limits = Limits()
    price: Price | None = None
    max_output_tokens: int | None = Field(
        default=None, gt=0, description="output tokens per response"
    )
    bash_timeout_s: float | None = None
    request_timeout_s: float | None = None
    context_window: int | None = Field(default=None, ge=1024, description="tokens")
    provider: ProviderRouting | None = None
    reasoning: Reasoning | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    extra_body: dict[str, Any] | None = None
    persistent_shell: bool | None = None
    stream: bool | None = None
    env: dict[str, str] = Field(default_factory=dict)
    grace_s: float | None = Field(default=None, gt=0, description="SIGTERM to SIGKILL")
    paths: tuple[Annotated[str, Field(pattern=r"^/")], ...] = ()
    network: bool | None = None

    _check_timeouts = field_validator("bash_timeout_s", "request_timeout_s")(_finite_positive)

    @field_validator("extra_body")
    @classmethod
    def _check_extra_body(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and (taken := sorted(RESERVED_BODY_KEYS & value.keys())):
            raise ValueError(f"may not set {', '.join(taken)} (the agent sets it)")
        return value

    def over(self, base: AgentSettings) -> AgentSettings:
        """These settings with every field left unset taken from `base` (limits per field)."""
        update: dict[str, object] = {
            name: getattr(base, name)
            for name in base.model_fields_set - self.model_fields_set
            if name != "limits"
        }
        limits = base.limits.model_dump(exclude_unset=True) | self.limits.model_dump(
            exclude_unset=True
        )
        update["limits"] = Limits(**limits)
        return self.model_copy(update=update)

    def explicit(self) -> frozenset[str]:
        """Names of the settings given explicitly (limits counted only when non-empty),
        and `limits.NAME` for each limit given."""
        names = set(self.model_fields_set)
        if not self.limits.model_fields_set:
            names.discard("limits")
        names |= {f"limits.{name}" for name in self.limits.model_fields_set}
        return frozenset(names)


@dataclass(frozen=True)
class AgentSpec:
    """A parsed `KIND[:ARG]`. `text` is what the user wrote."""

    kind: str
    arg: str
    text: str

    @property
    def argv(self) -> list[str]:
        """`arg` split like a shell would (for `command:PROGRAM ARGS...`)."""
        return shlex.split(self.arg)


def find_price(model: str, table: Mapping[str, Price]) -> Price | None:
    """`model`'s price: by its full name, else by the name after a provider prefix."""
    return table.get(model) or table.get(model.rsplit("/", 1)[-1])
