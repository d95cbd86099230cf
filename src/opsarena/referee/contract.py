"""The engine's contract with checks and setups: what a check is given, what it returns,
and the registries where checks and setups are found by name.

A check is `async def check(host: Host, ctx: CheckContext) -> Verdict`. It acts only
through the `Host` interface and injects faults only through `ctx.inject_fault`, so the
referee sees (and records) every fault. Checks register by name with `@register_check`
(the `CHECKS` registry, entry point group `opsarena.checks`); a challenge names them in
its milestones and may ship its own in `checks_module`.

A setup is registered by name (`register_setup`), usually from a challenge's checks
file, and named by the challenge's `setup` field. `variables(seed)` is pure: the brief's
`{{variables}}` (the same for every territory of a match, so every competitor faces the
same task and a replay is exact). `place(host, seed)` runs on each fresh host after it
is provisioned and before the preflight and the agents: it writes what the arena gives
the competitor (a CA key, a planted listener, ...) through the `Host` interface only.

This module is the engine's: workloads and challenges import it, it imports neither.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from opsarena.errors import ChallengeError
from opsarena.hosts import Host
from opsarena.ledger import Ledger, Pending
from opsarena.referee.model import Challenge, Milestone
from opsarena.registry import Registry

Outcome = Literal["passed", "failed", "referee_error"]
FaultKind = str
"""A registered fault's name (`opsarena.referee.nemesis`): "restart", "reboot", ..."""

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
"""`await ctx.inject_fault(name)` performs the registered fault `name`, records it, and
returns its duration in ms; it re-raises the host's error when the fault failed."""


async def _no_faults(kind: FaultKind) -> int:
    raise RuntimeError(f"this context cannot inject faults (asked for {kind})")


@dataclass(frozen=True)
class CheckContext:
    """What a check knows about the attempt it judges.

    `attempt` counts from 1 per territory and milestone (0 in a preflight). `seed` is
    the match seed (a workload derives every id and value from it, so a replay uses the
    same ones); `ledger` is the territory's durability ledger and `pending` the update
    this attempt builds (None outside a referee: a check then works on a throw-away one).
    """

    challenge: Challenge
    milestone: Milestone
    territory: str
    attempt: int
    inject_fault: InjectFault = field(default=_no_faults)
    seed: bytes = b""
    ledger: Ledger | None = None
    pending: Pending | None = None


Check = Callable[[Host, CheckContext], Awaitable[Verdict]]

CHECKS: Registry[Check] = Registry("check", "opsarena.checks")
"""Every check by name (an installed package adds its own through `opsarena.checks`)."""


DEFAULT_FAULTS: Registry[str] = Registry("check's default fault", "opsarena.checks")
"""The fault a check injects when its milestone names none (`fault`), by check name."""


def register_check(name: str, *, fault: str | None = None) -> Callable[[Check], Check]:
    """Decorator: register `check` under `name`; `fault` is the registered fault
    (`opsarena.referee.nemesis`) it injects when its milestone names none. Another
    check under the same name is a `RegistryError`."""

    def register(check: Check) -> Check:
        CHECKS.register(name, check)
        if fault is not None:
            DEFAULT_FAULTS.register(name, fault)
        return check

    return register


def default_fault(check: str) -> str | None:
    """The fault the check `check` injects when its milestone names none, if any."""
    return DEFAULT_FAULTS.get(check)


def check_names() -> list[str]:
    """Names of every registered check, sorted."""
    return CHECKS.names()


def load_checks_module(module: str | None) -> None:
    """Import `module` (when one is named) so its checks register. Raises
    `ChallengeError` if it cannot be imported."""
    if module is None:
        return
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
        if m.check not in CHECKS
    ]


def get_check(name: str) -> Check:
    """The check registered as `name`; raises `ChallengeError` when there is none."""
    check = CHECKS.get(name)
    if check is None:
        raise ChallengeError(
            f"no check named {name!r}; registered: {', '.join(check_names()) or 'none'}"
        )
    return check


async def _place_nothing(host: Host, seed: bytes) -> None:
    return None


def _no_variables(seed: bytes) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Setup:
    """What a challenge derives from the seed and places on each host."""

    variables: Callable[[bytes], dict[str, str]] = _no_variables
    place: Callable[[Host, bytes], Awaitable[None]] = _place_nothing


SETUPS: Registry[Setup] = Registry("setup", "opsarena.checks")
"""Every setup by name (registered by checks modules, so the same entry point group)."""


def register_setup(name: str, setup: Setup) -> Setup:
    """Register `setup` under `name`. Another setup under the same name is a
    `RegistryError`."""
    return SETUPS.register(name, setup)


def setup_of(challenge: Challenge) -> Setup:
    """The setup `challenge` names (an empty one when it names none). Raises
    `ChallengeError` when it names one nobody registered."""
    if challenge.setup is None:
        return Setup()
    setup = SETUPS.get(challenge.setup)
    if setup is None:
        known = ", ".join(SETUPS.names()) or "none"
        raise ChallengeError(
            f"{challenge.name}: setup: no setup named {challenge.setup!r} (registered: {known})"
        )
    return setup


def brief_for(challenge: Challenge, seed: bytes) -> str:
    """The brief a competitor reads in the match keyed by `seed`."""
    return challenge.render_brief(setup_of(challenge).variables(seed))


def agent_params(challenge: Challenge, seed: bytes) -> dict[str, object]:
    """The challenge facts an agent's `params` carry: port, unit, the challenge's name,
    the brief's variables (what the brief tells every competitor anyway), and the
    challenge's directory when it has one (where `scripted:NAME` finds its builders)."""
    params: dict[str, object] = {
        **setup_of(challenge).variables(seed),
        "port": challenge.port,
        "unit": challenge.unit,
        "challenge": challenge.name,
    }
    if challenge.directory is not None:
        params["challenge_dir"] = str(challenge.directory)
    return params


def setup_problems(challenge: Challenge) -> list[str]:
    """One line per problem with the challenge's setup and the brief's variables."""
    try:
        setup = setup_of(challenge)
    except ChallengeError as exc:
        return [str(exc).removeprefix(f"{challenge.name}: ")]
    provided = setup.variables(b"\0" * 32)
    return [
        f"brief: {{{{{name}}}}} is not provided by the setup "
        f"({challenge.setup or 'none'}: {', '.join(sorted(provided)) or 'no variables'})"
        for name in challenge.brief_variables()
        if name not in provided
    ]
