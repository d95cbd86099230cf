"""The core never imports Inspect: `import opsarena` and the CLI work without the extra."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import opsarena
import opsarena.cli.main
import opsarena.match.controller
import opsarena.web.app
leaked = sorted(m for m in sys.modules if m == "inspect_ai" or m.startswith("inspect_ai."))
leaked += sorted(m for m in sys.modules if m.startswith("opsarena.integrations"))
print(",".join(leaked))
"""


def test_core_and_cli_do_not_import_inspect() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == ""


def test_the_probe_would_see_inspect() -> None:
    """The probe above can fail: importing the integration does show up."""
    done = subprocess.run(
        [sys.executable, "-c", "import opsarena.integrations.inspect\n" + PROBE],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert "inspect_ai" in done.stdout.split(",")
