"""Inspect AI integration: the `opsarena` sandbox provider and the `opsarena/<challenge>` tasks.

Needs the `inspect` extra (`pip install opsarena[inspect]`). Inspect finds both
through the `inspect_ai` entry point (`_registry.py`); import this package only
where Inspect is installed.
"""

from opsarena.integrations.inspect.sandbox import (
    OpsarenaSandboxConfig,
    OpsarenaSandboxEnvironment,
)

__all__ = ["OpsarenaSandboxConfig", "OpsarenaSandboxEnvironment"]
