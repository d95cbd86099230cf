"""Printing for the CLI: one rich console for results, one for errors and progress."""

from __future__ import annotations

import sys
from typing import NoReturn

from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def fail(message: str, *, code: int = 2) -> NoReturn:
    """Print `message` as one line on stderr and exit with `code`."""
    first_line = " ".join(message.split())
    err_console.print(f"opsarena: error: {first_line}", markup=False, soft_wrap=True)
    sys.exit(code)
