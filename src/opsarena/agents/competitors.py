"""The competitors file: which agent plays each territory, with its settings, written once.

    challenge = "durable-records"          # optional; --challenge on the command line wins

    [llm]                                  # settings every llm competitor starts from
    base_url = "https://openrouter.ai/api/v1"
    api_key_env = "OPENROUTER_API_KEY"
    limits = { turns = 80, wall_s = 1200 }

    [prices."my-lab/my-model"]             # extends the built-in price table
    input_usd_per_mtok = 0.5
    output_usd_per_mtok = 1.5

    [territories.builder-one]
    agent = "llm:deepseek/deepseek-v4-flash-0731"   # or command:..., scripted:NAME, human
    name = "deepseek-builder"              # the agent's name in the record (default: territory)
    limits = { cost_microusd = 500000 }    # merged field by field over [llm].limits

A territory takes every `AgentSettings` field. Errors: `CompetitorsFileError`, one line
per problem, each naming the file and the field.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opsarena.agents.base import Agent
from opsarena.agents.registry import build_agent, check_settings, parse_agent_spec
from opsarena.agents.spec import AgentSettings, AgentSpec, Price, find_price
from opsarena.errors import AgentSpecError, CompetitorsFileError

TERRITORY_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
AGENT_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class TerritoryEntry(AgentSettings):
    """One `[territories.NAME]` table: the agent spec, its name, and its settings."""

    agent: str
    name: str | None = Field(default=None, pattern=AGENT_NAME_RE)

    def settings(self) -> AgentSettings:
        given = self.model_dump(exclude={"agent", "name"}, exclude_unset=True)
        return AgentSettings(**given)


class CompetitorsFile(BaseModel):
    """A competitors file as written."""

    model_config = ConfigDict(extra="forbid")

    challenge: str | None = None
    llm: AgentSettings = AgentSettings()
    prices: dict[str, Price] = Field(default_factory=dict)
    territories: dict[str, TerritoryEntry] = Field(min_length=1)


@dataclass(frozen=True)
class Competitor:
    """One territory's agent, ready to build. `settings` are final (defaults merged)."""

    territory: str
    name: str
    spec: AgentSpec
    settings: AgentSettings

    @property
    def kind(self) -> str:
        return self.spec.kind

    def build(self, env: Mapping[str, str] | None = None) -> Agent:
        """The agent (see `build_agent` for the errors)."""
        return build_agent(self.spec, self.settings, env)


@dataclass(frozen=True)
class Competitors:
    """A loaded competitors file, territories in the file's order."""

    source: str
    challenge: str | None
    competitors: list[Competitor]


def competitor_from_cli(territory: str, agent: str) -> Competitor:
    """The competitor of `--builder TERRITORY=AGENT`, with default settings. Raises
    `AgentSpecError` for a bad territory name or agent spec."""
    if not TERRITORY_RE.match(territory):
        raise AgentSpecError(
            f"territory {territory!r} is not valid: use 1-40 lowercase letters, digits and '-'"
        )
    spec = parse_agent_spec(agent)
    return Competitor(territory, territory, spec, AgentSettings())


def load_competitors(path: str | Path) -> Competitors:
    """Read and check the competitors file at `path`. Raises `CompetitorsFileError`."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CompetitorsFileError(f"competitors file {path} does not exist") from None
    except OSError as exc:
        raise CompetitorsFileError(f"cannot read competitors file {path}: {exc.strerror}") from None
    return parse_competitors(text, str(path))


def parse_competitors(text: str, source: str) -> Competitors:
    """Check a competitors file's `text` (`source` names it in messages). Every problem
    found is reported, one line each, in one `CompetitorsFileError`."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CompetitorsFileError(f"{source}: not valid TOML: {exc}") from None
    return check_competitors(raw, source)


def check_competitors(raw: Mapping[str, Any], source: str) -> Competitors:
    """Check a competitors file already read as TOML (or the same tables inside another
    file, such as a tournament file). Raises `CompetitorsFileError` like `parse_competitors`."""
    try:
        parsed = CompetitorsFile.model_validate(raw)
    except ValidationError as exc:
        raise CompetitorsFileError(
            "\n".join(f"{source}: {_where(err['loc'])}: {_what(err)}" for err in exc.errors())
        ) from None
    problems: list[str] = []
    competitors: list[Competitor] = []
    names: dict[str, str] = {}
    for territory, entry in parsed.territories.items():
        where = f"{source}: territories.{territory}"
        if not TERRITORY_RE.match(territory):
            problems.append(f"{where}: not a valid territory name (1-40 of a-z, 0-9, '-')")
        name = entry.name or territory
        if name in names:
            problems.append(f"{where}.name: {name!r} is also the agent of {names[name]}")
        names[name] = territory
        try:
            spec = parse_agent_spec(entry.agent)
        except AgentSpecError as exc:
            problems.append(f"{where}.agent: {exc}")
            continue
        settings = entry.settings()
        if spec.kind == "llm":
            settings = settings.over(parsed.llm)
            if settings.price is None and (price := find_price(spec.arg, parsed.prices)):
                settings = settings.model_copy(update={"price": price})
        try:
            check_settings(spec, settings)
        except AgentSpecError as exc:
            problems.append(f"{where}: {exc}")
            continue
        competitors.append(Competitor(territory, name, spec, settings))
    if problems:
        raise CompetitorsFileError("\n".join(problems))
    return Competitors(source, parsed.challenge, competitors)


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _what(error: Mapping[str, Any]) -> str:
    message = str(error["msg"])
    value = error.get("input")
    if error.get("type") not in ("missing", "extra_forbidden") and not isinstance(value, dict):
        message += f" (got {value!r})"
    return message
