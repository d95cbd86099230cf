"""Printing for the CLI: one rich console for results, one for errors and progress."""

from __future__ import annotations

import sys
import unicodedata
from typing import NoReturn

from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def printable(text: str) -> str:
    """`text` safe for a terminal: control and format characters (ESC, BEL, bidi overrides,
    ...) other than newline and tab shown as `\\xNN` / `\\uNNNN`, so a competitor's
    string (agent output, a territory name, a failure detail) can never drive the
    operator's terminal."""
    out = []
    for char in text:
        if char in "\n\t" or unicodedata.category(char) not in ("Cc", "Cf"):
            out.append(char)
        elif ord(char) <= 0xFF:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(f"\\u{ord(char):04x}")
    return "".join(out)


def fail(message: str, *, code: int = 2) -> NoReturn:
    """Print `message` on stderr and exit with `code`: one line per line of `message`
    (a file with three problems gives three lines), whitespace inside a line folded."""
    lines = [" ".join(line.split()) for line in message.splitlines() if line.strip()]
    for line in lines or ["(no message)"]:
        err_console.print(f"opsarena: error: {line}", markup=False, soft_wrap=True)
    sys.exit(code)
