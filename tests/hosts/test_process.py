"""`run_process`, the drivers' way of running the arena's own programs (podman, du)."""

from __future__ import annotations

import time

from opsarena.hosts.process import run_process


async def test_a_program_past_its_timeout_is_killed_and_reported_with_its_output() -> None:
    """A program holding its stdout open past the timeout is a timed-out result, with
    what it wrote so far: not a `CancelledError` out of the caller (which once stopped
    the controller's disk watch for every host when one `du` ran long)."""
    started = time.monotonic()
    result = await run_process(["sh", "-c", "echo partial; sleep 30"], timeout=0.3)
    assert result.timed_out and result.returncode is None
    assert result.stdout == b"partial\n"
    assert time.monotonic() - started < 5
