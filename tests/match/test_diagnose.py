"""`kill -USR1` on a process playing a match prints what each of its tasks waits on."""

from __future__ import annotations

import asyncio
import io

from opsarena.match.diagnose import dump_tasks


async def test_every_waiting_task_is_printed_with_where_it_waits() -> None:
    never = asyncio.Event()

    async def stuck_somewhere() -> None:
        await never.wait()

    task = asyncio.create_task(stuck_somewhere(), name="watch-done")
    await asyncio.sleep(0)
    out = io.StringIO()
    try:
        dump_tasks(out)
    finally:
        task.cancel()
    text = out.getvalue()
    assert "unfinished tasks" in text
    assert "--- task watch-done" in text
    assert "in stuck_somewhere" in text and "await never.wait()" in text
