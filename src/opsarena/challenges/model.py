"""The challenge file format: pydantic models for a challenge and its ordered milestones.

A challenge is a TOML file (stdlib `tomllib`) validated by `Challenge`. Unknown keys
are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"
CHECK_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
UNIT_PATTERN = r"^[A-Za-z0-9:_.@\\-]+\.service$"

BUILTIN_CHECKS_MODULE = "opsarena.referee.checks"
"""The module whose import registers the referee's own checks (`health`, `write-read`,
`restart-durability`, `reboot-durability`)."""

Seconds = Annotated[float, Field(gt=0, le=3600)]


class Milestone(BaseModel):
    """One step of a challenge: the check that proves it, and that check's bounds.

    `connect_timeout_s` bounds opening a connection, `read_timeout_s` bounds one whole
    request (sending it and reading the complete response). A response whose header
    block exceeds `max_header_bytes`, or whose body exceeds `max_body_bytes`, fails the
    check (the referee stops reading at the limit). `ready_budget_s` is how long the
    service has, after a fault (restart, reboot), to answer its health check again.
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


class Challenge(BaseModel):
    """A whole challenge, as a competitor and the referee see it.

    `brief` is everything a competitor reads; `cadence_s` is how often the referee
    evaluates each territory's first unpassed milestone; with `feedback`, each failed
    attempt reaches the competitor's agent as a short message (its reason and detail).
    `checks_module` is imported before the milestones' checks are looked up, so a
    challenge may register checks of its own (it defaults to the referee's built-in
    checks).
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
    feedback: bool = True
    checks_module: Annotated[str, Field(pattern=MODULE_PATTERN)] = BUILTIN_CHECKS_MODULE
    faults: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = []
    """Faults beyond restart and reboot that the milestones inject (`service-crash`,
    `power-cut`): the host driver must support each (else the match is refused before
    it starts), and `power-cut` gives every host a disk that can lose power."""
    milestones: Annotated[list[Milestone], Field(min_length=1)]

    @field_validator("brief")
    @classmethod
    def _brief_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @model_validator(mode="after")
    def _milestone_ids_unique(self) -> Challenge:
        seen: set[str] = set()
        for milestone in self.milestones:
            if milestone.id in seen:
                raise ValueError(f"milestone id {milestone.id!r} appears twice")
            seen.add(milestone.id)
        return self

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
