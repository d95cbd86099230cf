"""Challenge setups: the seed's variants of a challenge and what is placed on each host.

A setup is registered by name (`@register_setup`), usually from a challenge's checks
file, and named by the challenge's `setup` field. `variables(seed)` is pure: the brief's
`{{variables}}` (the same for every territory of a match, so every competitor faces the
same task and a replay is exact). `place(host, seed)` runs on each fresh host after it
is provisioned and before the preflight and the agents: it writes what the arena gives
the competitor (a CA key, a planted listener, ...) through the `Host` interface only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from opsarena.challenges.model import Challenge
from opsarena.errors import ChallengeError
from opsarena.hosts import Host


async def _place_nothing(host: Host, seed: bytes) -> None:
    return None


def _no_variables(seed: bytes) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Setup:
    """What a challenge derives from the seed and places on each host."""

    variables: Callable[[bytes], dict[str, str]] = _no_variables
    place: Callable[[Host, bytes], Awaitable[None]] = _place_nothing


_SETUPS: dict[str, Setup] = {}


def register_setup(name: str, setup: Setup) -> Setup:
    """Register `setup` under `name`. Registering another under the same name is a bug."""
    existing = _SETUPS.get(name)
    if existing is not None and existing != setup:
        raise ValueError(f"a setup named {name!r} is registered already")
    _SETUPS[name] = setup
    return setup


def setup_of(challenge: Challenge) -> Setup:
    """The setup `challenge` names (an empty one when it names none). Raises
    `ChallengeError` when it names one nobody registered."""
    if challenge.setup is None:
        return Setup()
    try:
        return _SETUPS[challenge.setup]
    except KeyError:
        known = ", ".join(sorted(_SETUPS)) or "none"
        raise ChallengeError(
            f"{challenge.name}: setup: no setup named {challenge.setup!r} (registered: {known})"
        ) from None


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
