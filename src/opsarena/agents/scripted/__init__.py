"""Scripted builders: fixed competitors whose verdicts are known, to calibrate the referee."""

from opsarena.agents.scripted.builders import ScriptedBuilder
from opsarena.agents.scripted.deploy import DEFAULT_PORT, DEFAULT_UNIT, ServiceTarget
from opsarena.agents.scripted.registry import get_scripted, scripted_names

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_UNIT",
    "ScriptedBuilder",
    "ServiceTarget",
    "get_scripted",
    "scripted_names",
]
