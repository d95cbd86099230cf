"""The challenge file format: pydantic models for a challenge and its ordered milestones.

A challenge is a directory holding `challenge.toml` (stdlib `tomllib`), validated by
`Challenge`, beside its optional checks file and `files/` tree (see
`opsarena.challenges.catalog` and docs/CHALLENGES.md). Unknown keys are errors, so a
typo never silently falls back to a default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"
CHECK_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
UNIT_PATTERN = r"^[A-Za-z0-9:_.@\\-]+\.service$"
ANY_UNIT_PATTERN = r"^[A-Za-z0-9:_.@\\-]+\.(service|socket|timer|path|mount)$"
REASON_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
PACKAGE_PATTERN = r"^[a-z0-9][a-z0-9+.-]{0,99}$"
VARIABLE_PATTERN = r"\{\{([a-z_][a-z0-9_]*)\}\}"
"""A placeholder in a brief (`{{server_name}}`), filled from the challenge's setup."""

T = TypeVar("T")
Seconds = Annotated[float, Field(gt=0, le=3600)]
ParamValue = str | int | float | bool | list[str] | list[int]
"""A value of one per-milestone check parameter (`[milestones.params]`)."""


class Milestone(BaseModel):
    """One step of a challenge: the check that proves it, and that check's bounds.

    `connect_timeout_s` bounds opening a connection, `read_timeout_s` bounds one whole
    request (sending it and reading the complete response). A response whose header
    block exceeds `max_header_bytes`, or whose body exceeds `max_body_bytes`, fails the
    check (the referee stops reading at the limit). `ready_budget_s` is how long the
    service has, after a fault (restart, reboot), to answer its health check again.
    `fault` names the registered fault (`opsarena.referee.nemesis`) a durability check
    injects; without it the default its check declared (`register_check(name,
    fault=...)`: the records workload's `restart-durability` restarts,
    `reboot-durability` reboots). `params` are the check's own parameters for this
    milestone (a check reads them with `ctx.milestone.params`; the check documents them).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(pattern=NAME_PATTERN)]
    title: Annotated[str, Field(min_length=1, max_length=200)]
    points: Annotated[int, Field(ge=0, le=1000)]
    check: Annotated[str, Field(pattern=CHECK_PATTERN)]
    connect_timeout_s: Seconds = 2.0
    read_timeout_s: Seconds = 5.0
    ready_budget_s: Seconds = 15.0
    max_header_bytes: Annotated[int, Field(ge=1024, le=1024 * 1024)] = 16 * 1024
    max_body_bytes: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = 2 * 1024 * 1024
    fault: Annotated[str, Field(pattern=NAME_PATTERN)] | None = None
    params: dict[Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]{0,63}$")], ParamValue] = {}

    def param(self, name: str, default: T) -> T:
        """The parameter `name` when set and of `default`'s type, else `default`."""
        value = self.params.get(name, default)
        return value if isinstance(value, type(default)) else default


class Challenge(BaseModel):
    """A whole challenge, as a competitor and the referee see it.

    `brief` is everything a competitor reads; `cadence_s` is how often the referee
    evaluates each territory's first unpassed milestone; `settle_s` is how long a
    territory is still judged (at the cadence) after its agent ended, restarted by every
    milestone passed in that window; with `feedback`, each failed
    attempt reaches the competitor's agent as a short message (its reason and detail).
    `checks_module` is imported before the milestones' checks are looked up, so a
    challenge may register checks of its own or use a workload's (the loader,
    `opsarena.challenges.catalog`, names the records workload's checks when a file names
    neither a module nor a checks file).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    title: Annotated[str, Field(min_length=1, max_length=200)]
    brief: Annotated[str, Field(min_length=1)]
    image: Annotated[str, Field(min_length=1)]
    port: Annotated[int, Field(ge=1, le=65535)]
    unit: Annotated[str, Field(pattern=UNIT_PATTERN)]
    time_limit_s: Annotated[int, Field(ge=10, le=24 * 3600)]
    cadence_s: Annotated[float, Field(ge=0.1, le=60)] = 1.0
    settle_s: Annotated[float, Field(ge=0, le=3600)] = 30.0
    feedback: bool = True
    checks_module: Annotated[str, Field(pattern=MODULE_PATTERN)] | None = None
    checks_file: Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.py$")] | None = None
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = []
    units: list[Annotated[str, Field(pattern=ANY_UNIT_PATTERN)]] = []
    packages: list[Annotated[str, Field(pattern=PACKAGE_PATTERN)]] = []
    setup: Annotated[str, Field(pattern=NAME_PATTERN)] | None = None
    failure_reasons: dict[
        Annotated[str, Field(pattern=REASON_PATTERN)], Annotated[str, Field(min_length=1)]
    ] = {}
    milestones: Annotated[list[Milestone], Field(min_length=1)]
    _directory: Path | None = PrivateAttr(default=None)
    _origin: Path | None = PrivateAttr(default=None)

    @property
    def directory(self) -> Path | None:
        """The challenge directory it was loaded from (None for a lone file or text)."""
        return self._directory

    @property
    def origin(self) -> Path | None:
        """The directory or lone file it was loaded from (None for text)."""
        return self._origin

    def attach_origin(self, origin: Path, *, directory: bool) -> None:
        """Remember where this challenge was loaded from (done by the loader)."""
        self._origin = origin
        self._directory = origin if directory else None

    @field_validator("brief")
    @classmethod
    def _brief_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @model_validator(mode="after")
    def _ports_and_units(self) -> Challenge:
        if self.ports and self.port not in self.ports:
            raise ValueError(f"ports must include port {self.port}")
        if self.units and self.unit not in self.units:
            raise ValueError(f"units must include unit {self.unit!r}")
        if len(set(self.ports)) != len(self.ports) or len(set(self.units)) != len(self.units):
            raise ValueError("ports and units must not repeat")
        return self

    @model_validator(mode="after")
    def _milestone_ids_unique(self) -> Challenge:
        seen: set[str] = set()
        for milestone in self.milestones:
            if milestone.id in seen:
                raise ValueError(f"milestone id {milestone.id!r} appears twice")
            seen.add(milestone.id)
        return self

    @property
    def all_ports(self) -> list[int]:
        """Every port of the deployment (`ports`, or just `port`)."""
        return list(self.ports) or [self.port]

    @property
    def all_units(self) -> list[str]:
        """Every unit of the deployment (`units`, or just `unit`)."""
        return list(self.units) or [self.unit]

    def brief_variables(self) -> list[str]:
        """The `{{variables}}` the brief uses, each once, in order."""
        found: list[str] = []
        for name in re.findall(VARIABLE_PATTERN, self.brief):
            if name not in found:
                found.append(name)
        return found

    def render_brief(self, variables: dict[str, str]) -> str:
        """The brief with each `{{variable}}` replaced; a missing one is a `KeyError`."""
        return re.sub(VARIABLE_PATTERN, lambda m: variables[m.group(1)], self.brief)

    @property
    def total_points(self) -> int:
        return sum(m.points for m in self.milestones)

    def milestone(self, milestone_id: str) -> Milestone:
        """The milestone called `milestone_id`; raises `KeyError`."""
        for milestone in self.milestones:
            if milestone.id == milestone_id:
                return milestone
        raise KeyError(milestone_id)


def is_valid_name(name: str) -> bool:
    """Whether `name` is a valid challenge name."""
    return re.match(NAME_PATTERN, name) is not None
