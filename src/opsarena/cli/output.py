"""Printing for the CLI: one rich console for results, one for errors and progress."""

from __future__ import annotations

import sys
from typing import NoReturn

from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def fail(message: str, *, code: int = 2) -> NoReturn:
    """Print `message` on stderr and exit with `code`: one line per line of `message`
    (a file with three problems gives three lines), whitespace inside a line folded."""
    lines = [" ".join(line.split()) for line in message.splitlines() if line.strip()]
    for line in lines or ["(no message)"]:
        err_console.print(f"opsarena: error: {line}", markup=False, soft_wrap=True)
    sys.exit(code)
