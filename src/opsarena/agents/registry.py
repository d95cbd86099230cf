"""The agent registry: parse `KIND[:ARG]`, and build and preflight an `Agent` by its kind.

The controller only calls `parse_agent_spec`, `build_agent` and `preflight_agent`, and asks
a kind's capabilities (`runs_in_cage`, `has_done_token`), which the kind declares where
it registers. A new kind takes: its `Agent` class, a `register_agent_kind` call (here
for a built-in, or in a package's module named by an `opsarena.agents` entry point:
`Registry`), and, when it
has settings of its own, their names in `agents/spec.py` (`AgentSettings` and the
`*_ONLY_SETTINGS` sets other kinds refuse). The built-in kinds (`scripted`, `command`,
`llm`, `human`) are registered when this module is imported; it is the only module that
imports the agent implementations, and none of them imports it. Registering another
kind under a taken name is a `RegistryError`.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from opsarena.agents.base import Agent
from opsarena.agents.cage import ProcessCage
from opsarena.agents.command import CommandAgent
from opsarena.agents.human import HumanAgent
from opsarena.agents.scripted import ScriptedAgent
from opsarena.agents.spec import (
    COMMAND_ONLY_SETTINGS,
    EVERY_LIMIT,
    LLM_ONLY_LIMITS,
    LLM_ONLY_SETTINGS,
    AgentSettings,
    AgentSpec,
)
from opsarena.errors import AgentSpecError
from opsarena.registry import Registry

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
    caged: bool = False
    """Its agents run programs in a `ProcessCage` (cgroups that outlive a controller that
    was killed: a resumed match removes what they left, `remove_cages`)."""
    done_token: bool = False
    """A person plays it: the territory gets a done token (`agents.done`), and `opsarena
    done` with it ends the agent's turn."""


KINDS: Registry[AgentKind] = Registry("agent kind", "opsarena.agents")


def register_agent_kind(
    name: str,
    factory: AgentFactory,
    *,
    arg: str | None,
    refused_settings: frozenset[str] = frozenset(),
    caged: bool = False,
    done_token: bool = False,
) -> None:
    """Make `factory` the builder of agents of kind `name`; `RegistryError` when another
    kind has the name already. `refused_settings` are settings that make no sense for the
    kind; giving one is an error. `caged` and `done_token` are the kind's capabilities
    (`AgentKind`): the controller asks for them (`runs_in_cage`, `has_done_token`) and
    never names a kind."""
    KINDS.register(name, AgentKind(name, factory, arg, refused_settings, caged, done_token))


def agent_kinds() -> list[str]:
    """Every kind's name, the installed packages' included, sorted."""
    return KINDS.names()


def has_done_token(kind: str) -> bool:
    """Whether `kind` is played by a person who ends the turn with `opsarena done` and
    the territory's done token (False for an unknown kind)."""
    known = KINDS.get(kind)
    return known is not None and known.done_token


def runs_in_cage(kind: str) -> bool:
    """Whether agents of `kind` run programs in a cage (False for an unknown kind)."""
    known = KINDS.get(kind)
    return known is not None and known.caged


def remove_cages(match_id: str) -> int:
    """Remove every cage agents of `match_id` left (their processes killed first): what
    the agents of a controller that was killed left running. Blocking; returns how many."""
    cages = ProcessCage.of_match(match_id)
    for cage in cages:
        cage.remove()
    return len(cages)


def _kind_usage() -> str:
    forms = [f"{k.name}:{k.arg}" if k.arg else k.name for _, k in KINDS.items()]
    return ", ".join(forms)


def parse_agent_spec(text: str) -> AgentSpec:
    """Parse `KIND[:ARG]`. Raises `AgentSpecError` (one line, naming the known kinds) for an
    unknown kind, a missing argument, or an argument given to a kind that takes none."""
    text = text.strip()
    kind, sep, arg = text.partition(":")
    arg = arg.strip()
    known = KINDS.get(kind)
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
    kind = check_settings(spec, settings)
    return kind.factory(spec, settings, os.environ if env is None else env)


def check_settings(spec: AgentSpec, settings: AgentSettings) -> AgentKind:
    """The kind of `spec`; raise `AgentSpecError` if it is unknown or a setting given
    does not apply."""
    kind = KINDS.get(spec.kind)
    if kind is None:
        raise AgentSpecError(f"unknown agent kind {spec.kind!r}: use one of {_kind_usage()}")
    refused = sorted(settings.explicit() & kind.refused_settings)
    if refused:
        raise AgentSpecError(
            f"setting {', '.join(refused)} does not apply to {spec.kind} agents ({spec.text})"
        )
    return kind


@runtime_checkable
class Preflight(Protocol):
    async def preflight(self) -> None: ...


async def preflight_agent(agent: Agent) -> None:
    """Check, before the match starts, that `agent` can run (endpoint reachable, program
    present). Raises a one-line `AgentConfigError`; agents with nothing to check pass."""
    if isinstance(agent, Preflight):
        await agent.preflight()


def _scripted(spec: AgentSpec, settings: AgentSettings, env: Mapping[str, str]) -> Agent:
    agent: Agent = ScriptedAgent(spec.arg)
    if settings.model:
        agent.model = settings.model
    return agent


def _command(spec: AgentSpec, settings: AgentSettings, env: Mapping[str, str]) -> Agent:
    return CommandAgent.from_settings(spec.argv, settings)


def _llm(spec: AgentSpec, settings: AgentSettings, env: Mapping[str, str]) -> Agent:
    if settings.model and settings.model != spec.arg:
        raise AgentSpecError(
            f"model {settings.model!r} contradicts {spec.text!r}: an llm agent's model is its MODEL"
        )
    # Imported when an llm agent is made: the openai SDK takes most of a command's start.
    from opsarena.agents.llm import LlmAgent

    return LlmAgent.from_settings(spec.arg, settings, env)


def _human(spec: AgentSpec, settings: AgentSettings, env: Mapping[str, str]) -> Agent:
    return HumanAgent(model=settings.model or "human")


register_agent_kind(
    "scripted",
    _scripted,
    arg="NAME",
    refused_settings=LLM_ONLY_SETTINGS | COMMAND_ONLY_SETTINGS | EVERY_LIMIT,
)
register_agent_kind(
    "command",
    _command,
    arg="PROGRAM",
    refused_settings=LLM_ONLY_SETTINGS | LLM_ONLY_LIMITS,
    caged=True,
)
register_agent_kind("llm", _llm, arg="MODEL", refused_settings=COMMAND_ONLY_SETTINGS)
register_agent_kind(
    "human",
    _human,
    arg=None,
    refused_settings=LLM_ONLY_SETTINGS | COMMAND_ONLY_SETTINGS | EVERY_LIMIT,
    done_token=True,
)
