"""Scripted builders by name, among the builders of the challenge being played.

A challenge directory's `builders.py` lists its builders in `BUILDERS` (a tuple of
`ScriptedBuilder` classes, each with its own `name`): its `reference` oracle and its
flawed builders. `scripted:NAME` resolves NAME there; a challenge without a
`builders.py` has `DEFAULT_BUILDERS` (`reference`, `idle`). Nothing here knows any
challenge's name: the challenge's directory reaches the agent through the match's
params (`challenge_dir`, see `opsarena.referee.contract.agent_params`) or when it is
built for one challenge (`ScriptedAgent(name, directory)`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from opsarena.agents.base import Agent, AgentContext, AgentOutcome
from opsarena.agents.scripted.builders import DEFAULT_BUILDERS, ScriptedBuilder, player_failed
from opsarena.errors import UnknownBuilderError, UsageError

BUILDERS_FILE = "builders.py"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
"""A builder's name: what `scripted:NAME` may say."""


def builders_module(directory: str | Path) -> ModuleType | None:
    """The challenge directory's `builders.py`, imported once per process under a module
    name of its own (None when it has none). Raises `UsageError` when importing it fails."""
    path = Path(directory) / BUILDERS_FILE
    if not path.is_file():
        return None
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"opsarena_builders_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise UsageError(f"{path}: importing it failed: {exc!r}") from None
    return module


def challenge_builders(directory: str | Path | None) -> dict[str, type[ScriptedBuilder]]:
    """The builders of the challenge in `directory` by name (`DEFAULT_BUILDERS` when it
    is None or has no `builders.py`). Raises `UsageError` when its `BUILDERS` is not a
    tuple of `ScriptedBuilder` classes with distinct valid names."""
    module = None if directory is None else builders_module(directory)
    if module is None:
        return {builder.name: builder for builder in DEFAULT_BUILDERS}
    where = f"{Path(str(directory)) / BUILDERS_FILE}: BUILDERS"
    listed = getattr(module, "BUILDERS", None)
    if not isinstance(listed, tuple | list) or not listed:
        raise UsageError(f"{where}: must be a non-empty tuple of ScriptedBuilder classes")
    builders: dict[str, type[ScriptedBuilder]] = {}
    for builder in listed:
        if not (isinstance(builder, type) and issubclass(builder, ScriptedBuilder)):
            raise UsageError(f"{where}: {builder!r} is not a ScriptedBuilder class")
        name = getattr(builder, "name", None)
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise UsageError(f"{where}: {builder.__name__} has no valid name (got {name!r})")
        if name in builders:
            raise UsageError(f"{where}: two builders are named {name!r}")
        builders[name] = builder
    return builders


def scripted_names(directory: str | Path | None = None) -> list[str]:
    """The names of the challenge's builders, sorted."""
    return sorted(challenge_builders(directory))


def get_scripted(name: str, directory: str | Path | None = None) -> ScriptedBuilder:
    """A new builder called `name` among those of the challenge in `directory`. Raises
    `UnknownBuilderError` (one line listing the known names) for any other name."""
    builders = challenge_builders(directory)
    try:
        return builders[name]()
    except KeyError:
        raise UnknownBuilderError(
            f"unknown scripted builder {name!r}: known builders are {', '.join(sorted(builders))}"
        ) from None


def check_scripted(name: str, directories: list[str | Path | None]) -> None:
    """Raise `UnknownBuilderError` unless one of the challenges in `directories` (None:
    a challenge without builders.py) has a builder `name`: what a match or a tournament
    checks before it starts."""
    if any(name in challenge_builders(directory) for directory in directories):
        return
    known = sorted({n for directory in directories for n in challenge_builders(directory)})
    raise UnknownBuilderError(
        f"unknown scripted builder {name!r}: known builders are {', '.join(known)}"
    )


class ScriptedAgent(Agent):
    """`scripted:NAME`: the builder NAME of the challenge being played. Built for one
    challenge (`directory`) it is checked at once; built before the challenge is known it
    resolves NAME when it runs, from the match's `challenge_dir` param, and forfeits
    (a player's failure, nothing done) when that challenge has no builder NAME."""

    def __init__(self, name: str, directory: str | Path | None = None) -> None:
        if not NAME_RE.match(name):
            raise UnknownBuilderError(
                f"unknown scripted builder {name!r}: a name is 1-64 lowercase letters, "
                "digits and '-'"
            )
        self.name = name
        self.directory = directory
        self.model = f"scripted/{name}"
        if directory is not None:
            get_scripted(name, directory)

    def builder(self, params: Mapping[str, object]) -> ScriptedBuilder:
        """The builder for a match with these params. Raises `UnknownBuilderError`."""
        directory = self.directory
        if directory is None:
            given = params.get("challenge_dir")
            directory = given if isinstance(given, str) and given else None
        return get_scripted(self.name, directory)

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        try:
            builder = self.builder(ctx.params)
        except UnknownBuilderError as exc:
            challenge = ctx.params.get("challenge", "?")
            return await player_failed(ctx, f"{self.name}: {exc} (challenge {challenge})")
        return await builder.run(ctx)
