"""What a running controller is waiting on, for an operator looking at a stuck match.

`kill -USR1 PID` of a process playing a match (`opsarena run`, a tournament, a Ray
worker) prints every unfinished asyncio task of its loop with the stack it waits in, to
the process's standard error; the match goes on undisturbed.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

STACK_LIMIT = 40
"""Frames printed per task, innermost last."""


def dump_tasks(out: TextIO | None = None) -> None:
    """Print every unfinished task of the running loop and where it waits (on the loop's
    thread, as a signal handler added with `loop.add_signal_handler` runs)."""
    out = out or sys.stderr
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    print(f"opsarena: {len(tasks)} unfinished tasks", file=out)
    for task in tasks:
        print(f"--- task {task.get_name()}", file=out)
        task.print_stack(limit=STACK_LIMIT, file=out)
    out.flush()
