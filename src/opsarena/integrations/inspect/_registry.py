"""What Inspect's `inspect_ai` entry point loads: registers the sandbox provider and tasks.

Inspect imports this module (never opsarena's core) when it looks for `opsarena`
extensions; importing it registers `sandbox="opsarena"` and the `opsarena/*` tasks.
"""

from opsarena.integrations.inspect.sandbox import OpsarenaSandboxEnvironment
from opsarena.integrations.inspect.tasks import TASKS

__all__ = ["TASKS", "OpsarenaSandboxEnvironment"]
