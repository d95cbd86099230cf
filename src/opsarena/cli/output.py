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


def error_lines(message: str) -> list[str]:
    """`message` as the lines `fail` prints: split at newlines only, each line passed
    through `printable` (an error may quote a host: a D-Bus error body, a systemd state,
    a failure detail, all of them competitor-controlled), then its spaces and tabs
    folded. Pure."""
    lines = [" ".join(printable(line).split()) for line in message.split("\n")]
    return [line for line in lines if line]


def fail(message: str, *, code: int = 2) -> NoReturn:
    """Print `message` on stderr and exit with `code`: one line per line of `message`
    (a file with three problems gives three lines), whitespace inside a line folded,
    control and format characters escaped (`error_lines`)."""
    for line in error_lines(message) or ["(no message)"]:
        err_console.print(f"opsarena: error: {line}", markup=False, soft_wrap=True)
    sys.exit(code)
