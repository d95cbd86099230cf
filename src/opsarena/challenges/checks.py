"""The check registry: named async functions that judge one milestone on one host.

A check is `async def check(host: Host, ctx: CheckContext) -> Verdict`. It acts only
through the `Host` interface and injects faults only through `ctx.inject_fault`, so the
referee sees (and records) every fault. Checks register by name with `@register_check`;
a challenge names them in its milestones and may ship its own in `checks_module`.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from opsarena.challenges.model import Challenge, Milestone
from opsarena.errors import ChallengeError
from opsarena.hosts import Host

Outcome = Literal["passed", "failed", "referee_error"]
FaultKind = Literal["restart", "reboot", "crash", "power-cut"]

VERIFICATION_FAILED = "verification_failed"
"""`failure_category` of a failure that is the competitor's (the seed record's word)."""
REFEREE_ERROR = "referee_error"
"""`failure_category` of a failure that is the arena's: never scored, counted, retried."""


@dataclass(frozen=True)
class Verdict:
    """How one attempt at a milestone ended: exactly one of three outcomes.

    `passed` carries `evidence`; `failed` (the competitor's fault) and `referee_error`
    (ours) carry a `failure_reason` from the referee's failure table and a
    `failure_detail` a competitor can act on.
    """

    outcome: Outcome
    evidence: dict[str, Any] | None = None
    failure_reason: str | None = None
    failure_detail: str | None = None

    @classmethod
    def passed(cls, evidence: dict[str, Any]) -> Verdict:
        return cls("passed", evidence=evidence)

    @classmethod
    def failed(cls, reason: str, detail: str) -> Verdict:
        return cls("failed", failure_reason=reason, failure_detail=detail)

    @classmethod
    def referee_error(cls, reason: str, detail: str) -> Verdict:
        return cls("referee_error", failure_reason=reason, failure_detail=detail)

    @property
    def failure_category(self) -> str | None:
        if self.outcome == "failed":
            return VERIFICATION_FAILED
        if self.outcome == "referee_error":
            return REFEREE_ERROR
        return None


InjectFault = Callable[[FaultKind], Awaitable[int]]
"""`await ctx.inject_fault("restart" | "reboot")` performs the fault, records it, and
returns its duration in ms; it re-raises the host's error when the fault failed."""


async def _no_faults(kind: FaultKind) -> int:
    raise RuntimeError(f"this context cannot inject faults (asked for {kind})")


@dataclass(frozen=True)
class CheckContext:
    """What a check knows about the attempt it judges.

    `record_id` and `record_value` are this attempt's fresh record (derived from the
    match seed, so a replay uses the same ones). `attempt` counts from 1 per territory
    and milestone (0 in a preflight).
    """

    challenge: Challenge
    milestone: Milestone
    territory: str
    attempt: int
    record_id: str
    record_value: str
    inject_fault: InjectFault = field(default=_no_faults)


Check = Callable[[Host, CheckContext], Awaitable[Verdict]]

_CHECKS: dict[str, Check] = {}


def register_check(name: str) -> Callable[[Check], Check]:
    """Decorator: register `check` under `name`. Registering a name twice is a bug."""

    def register(check: Check) -> Check:
        existing = _CHECKS.get(name)
        if existing is not None and existing is not check:
            raise ValueError(f"a check named {name!r} is registered already")
        _CHECKS[name] = check
        return check

    return register


def check_names() -> list[str]:
    """Names of every registered check, sorted."""
    return sorted(_CHECKS)


def load_checks_module(module: str) -> None:
    """Import `module` so its checks register. Raises `ChallengeError` if it cannot be
    imported."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ChallengeError(f"checks module {module!r} cannot be imported: {exc}") from exc


def unknown_checks(challenge: Challenge) -> list[str]:
    """One problem line per milestone whose check is not registered (after importing the
    challenge's `checks_module`)."""
    load_checks_module(challenge.checks_module)
    return [
        f"milestones[{index}].check: no check named {m.check!r} "
        f"(registered: {', '.join(check_names()) or 'none'})"
        for index, m in enumerate(challenge.milestones)
        if m.check not in _CHECKS
    ]


def get_check(name: str) -> Check:
    """The check registered as `name`; raises `ChallengeError` when there is none."""
    try:
        return _CHECKS[name]
    except KeyError:
        raise ChallengeError(
            f"no check named {name!r}; registered: {', '.join(check_names()) or 'none'}"
        ) from None
