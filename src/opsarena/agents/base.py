"""The `Agent` contract: one competitor acting on its own host.

An agent sees its brief, its host (through the `Host` interface only), its limits,
and the referee messages the controller forwards. It never sees the referee itself.
The controller stops an agent by cancelling `run`.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from opsarena.hosts import Host

TerminalState = Literal["completed", "failed", "terminated", "interrupted"]
FailureSource = Literal["player", "arena", "controller"]

Report = Callable[[str, dict[str, Any]], Awaitable[None]]
"""`await report(kind, data)` records something the agent did as an event
(kinds: "usage", "output", "transcript"); the controller owns the log."""


async def _no_report(kind: str, data: dict[str, Any]) -> None:
    return None


@dataclass
class AgentContext:
    """What an agent gets for one match.

    `deadline` is a `time.monotonic()` value after which the agent must have stopped
    (the controller cancels it then anyway). `feedback` receives short referee
    messages ("service-restart failed: record_missing ...") when the challenge
    enables feedback. `params` carries challenge facts a scripted agent may use
    (port, unit). `done` is set by the controller when a person declares the
    territory finished (`opsarena done MATCH TERRITORY`).
    """

    match_id: str
    territory: str
    brief: str
    host: Host
    deadline: float
    report: Report = _no_report
    feedback: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    params: dict[str, Any] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class AgentOutcome:
    """How an agent ended, in the record's words.

    `successful` is None when nobody can say (terminated, interrupted).
    `failure_source` says whose fault a non-success was.
    """

    terminal_state: TerminalState
    successful: bool | None
    terminal_detail: str = ""
    failure_source: FailureSource | None = None
    resource_units_used: int = 0


class Agent(abc.ABC):
    """A competitor. `model` is what the record shows under the agent's `model`."""

    model: str = ""

    @abc.abstractmethod
    async def run(self, ctx: AgentContext) -> AgentOutcome:
        """Act on `ctx.host` until done; return how it ended.

        Must return (or raise `asyncio.CancelledError` when cancelled) by
        `ctx.deadline`. An exception other than cancellation is recorded as a
        failure with `failure_source` "arena".
        """
