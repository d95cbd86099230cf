"""Agent specs and settings: parse `KIND[:ARG]`, and build an `Agent` through a registry by kind.

A spec names what competes: `scripted:NAME`, `command:PROGRAM ARGS...`, `llm:MODEL` or
`human`. Settings (`AgentSettings`) carry the per-competitor knobs a competitors file or
the command line gives (model, endpoint, limits, prices). The controller only calls
`parse_agent_spec`, `build_agent` and `preflight_agent`; a new kind registers with
`register_agent_kind` and nothing else changes.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from opsarena.agents.base import Agent
from opsarena.errors import AgentSpecError


class Limits(BaseModel):
    """What one agent may spend. `None` means no limit of that kind. Reaching a limit ends
    the agent with a `terminal_detail` naming it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turns: int | None = Field(default=None, gt=0, description="model responses")
    input_tokens: int | None = Field(default=None, gt=0)
    output_tokens: int | None = Field(default=None, gt=0)
    cost_microusd: int | None = Field(default=None, gt=0)
    wall_s: float | None = Field(default=None, gt=0, description="seconds from the agent's start")


class Price(BaseModel):
    """A model's price in USD per million tokens (which is micro-USD per token).
    `cached_input_usd_per_mtok` applies to cached prompt tokens; the input price when absent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    cached_input_usd_per_mtok: float | None = Field(default=None, ge=0)


LLM_ONLY_SETTINGS = frozenset({"base_url", "api_key_env", "price", "max_tokens", "bash_timeout_s"})
COMMAND_ONLY_SETTINGS = frozenset({"env", "grace_s", "paths", "network"})


class AgentSettings(BaseModel):
    """Per-competitor settings. Which apply depends on the kind: `base_url`, `api_key_env`,
    `price`, `max_tokens` and `bash_timeout_s` are for `llm`; `env`, `grace_s`, `paths`
    (absolute paths the program may read, bound read-only into its sandbox) and `network`
    (true: the program shares the machine's network, e.g. to reach its own model API;
    default none) for `command`; `model` (the name the record shows) and `limits.wall_s`
    for every kind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    limits: Limits = Limits()
    price: Price | None = None
    max_tokens: int | None = Field(default=None, gt=0, description="output tokens per response")
    bash_timeout_s: float | None = Field(default=None, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    grace_s: float | None = Field(default=None, gt=0, description="SIGTERM to SIGKILL")
    paths: tuple[Annotated[str, Field(pattern=r"^/")], ...] = ()
    network: bool | None = None

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
        """Names of the settings given explicitly (limits counted only when non-empty)."""
        names = set(self.model_fields_set)
        if not self.limits.model_fields_set:
            names.discard("limits")
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


AgentFactory = Callable[[AgentSpec, AgentSettings, Mapping[str, str]], Agent]
"""`factory(spec, settings, env)` makes the agent or raises an `OpsArenaError`; `env` is
the environment to resolve endpoints and keys from."""


@dataclass(frozen=True)
class AgentKind:
    name: str
    factory: AgentFactory
    arg: str | None
    """What the argument is called in messages (`MODEL`), or None when the kind takes none."""
    refused_settings: frozenset[str] = frozenset()


_KINDS: dict[str, AgentKind] = {}


def register_agent_kind(
    name: str,
    factory: AgentFactory,
    *,
    arg: str | None,
    refused_settings: frozenset[str] = frozenset(),
) -> None:
    """Make `factory` the builder of agents of kind `name` (replacing an earlier one).
    `refused_settings` are settings that make no sense for the kind; giving one is an error."""
    _KINDS[name] = AgentKind(name, factory, arg, refused_settings)


def agent_kinds() -> list[str]:
    return sorted(_KINDS)


def _kind_usage() -> str:
    forms = [
        f"{k.name}:{k.arg}" if k.arg else k.name
        for k in sorted(_KINDS.values(), key=lambda k: k.name)
    ]
    return ", ".join(forms)


def parse_agent_spec(text: str) -> AgentSpec:
    """Parse `KIND[:ARG]`. Raises `AgentSpecError` (one line, naming the known kinds) for an
    unknown kind, a missing argument, or an argument given to a kind that takes none."""
    text = text.strip()
    kind, sep, arg = text.partition(":")
    arg = arg.strip()
    known = _KINDS.get(kind)
    if known is None:
        raise AgentSpecError(f"unknown agent kind {kind!r} in {text!r}: use one of {_kind_usage()}")
    if known.arg is not None and not arg:
        raise AgentSpecError(f"agent {text!r} needs {known.arg}: write {kind}:{known.arg}")
    if known.arg is None and sep:
        raise AgentSpecError(f"agent kind {kind!r} takes no argument: write just {kind}")
    if kind == "command":
        try:
            shlex.split(arg)
        except ValueError as exc:
            raise AgentSpecError(f"cannot split command {arg!r}: {exc}") from None
    return AgentSpec(kind=kind, arg=arg, text=text)


def build_agent(
    spec: AgentSpec, settings: AgentSettings | None = None, env: Mapping[str, str] | None = None
) -> Agent:
    """Make the agent `spec` names with `settings`. Raises `AgentSpecError` for a setting
    that does not apply to the kind and `AgentConfigError` when the agent cannot be
    configured (for `llm`: no endpoint or key in `env`, which defaults to `os.environ`)."""
    settings = settings or AgentSettings()
    check_settings(spec, settings)
    return _KINDS[spec.kind].factory(spec, settings, os.environ if env is None else env)


def check_settings(spec: AgentSpec, settings: AgentSettings) -> None:
    """Raise `AgentSpecError` if the kind is unknown or a setting given does not apply."""
    kind = _KINDS.get(spec.kind)
    if kind is None:
        raise AgentSpecError(f"unknown agent kind {spec.kind!r}: use one of {_kind_usage()}")
    refused = sorted(settings.explicit() & kind.refused_settings)
    if refused:
        raise AgentSpecError(
            f"setting {', '.join(refused)} does not apply to {spec.kind} agents ({spec.text})"
        )


def find_price(model: str, table: Mapping[str, Price]) -> Price | None:
    """`model`'s price: by its full name, else by the name after a provider prefix."""
    return table.get(model) or table.get(model.rsplit("/", 1)[-1])


@runtime_checkable
class Preflight(Protocol):
    async def preflight(self) -> None: ...


async def preflight_agent(agent: Agent) -> None:
    """Check, before the match starts, that `agent` can run (endpoint reachable, program
    present). Raises a one-line `AgentConfigError`; agents with nothing to check pass."""
    if isinstance(agent, Preflight):
        await agent.preflight()


def _scripted(spec: AgentSpec, settings: AgentSettings, env: Mapping[str, str]) -> Agent:
    from opsarena.agents.scripted import get_scripted

    agent: Agent = get_scripted(spec.arg)
    if settings.model:
        agent.model = settings.model
    return agent


def _command(spec: AgentSpec, settings: AgentSettings, env: Mapping[str, str]) -> Agent:
    from opsarena.agents.command import CommandAgent

    return CommandAgent.from_settings(spec.argv, settings)


def _llm(spec: AgentSpec, settings: AgentSettings, env: Mapping[str, str]) -> Agent:
    from opsarena.agents.llm import LlmAgent

    if settings.model and settings.model != spec.arg:
        raise AgentSpecError(
            f"model {settings.model!r} contradicts {spec.text!r}: an llm agent's model is its MODEL"
        )
    return LlmAgent.from_settings(spec.arg, settings, env)


def _human(spec: AgentSpec, settings: AgentSettings, env: Mapping[str, str]) -> Agent:
    from opsarena.agents.human import HumanAgent

    return HumanAgent(model=settings.model or "human")


register_agent_kind(
    "scripted", _scripted, arg="NAME", refused_settings=LLM_ONLY_SETTINGS | COMMAND_ONLY_SETTINGS
)
register_agent_kind("command", _command, arg="PROGRAM", refused_settings=LLM_ONLY_SETTINGS)
register_agent_kind("llm", _llm, arg="MODEL", refused_settings=COMMAND_ONLY_SETTINGS)
register_agent_kind(
    "human", _human, arg=None, refused_settings=LLM_ONLY_SETTINGS | COMMAND_ONLY_SETTINGS
)
