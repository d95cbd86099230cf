"""Scripted builders: fixed competitors whose verdicts are known, to calibrate the referee.

The machinery is here; each challenge's builders are in its directory's `builders.py`."""

from opsarena.agents.scripted.builders import (
    DEFAULT_BUILDERS,
    IdleBuilder,
    RecordsServiceBuilder,
    ScriptedBuilder,
)
from opsarena.agents.scripted.deploy import DEFAULT_PORT, DEFAULT_UNIT, ServiceTarget
from opsarena.agents.scripted.registry import (
    ScriptedAgent,
    builders_module,
    challenge_builders,
    check_scripted,
    get_scripted,
    scripted_names,
)

__all__ = [
    "DEFAULT_BUILDERS",
    "DEFAULT_PORT",
    "DEFAULT_UNIT",
    "IdleBuilder",
    "RecordsServiceBuilder",
    "ScriptedAgent",
    "ScriptedBuilder",
    "ServiceTarget",
    "builders_module",
    "challenge_builders",
    "check_scripted",
    "get_scripted",
    "scripted_names",
]
