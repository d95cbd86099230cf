"""Hostile command agents: one that prints gigabytes is capped (events and memory
bounded); one that ignores SIGTERM, with children that do too, is killed with its group
at the wall limit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import tracemalloc
from pathlib import Path

import pytest

from opsarena.agents import AgentContext
from opsarena.agents.command import CommandAgent
from opsarena.hosts import Host
from tests.agents.contexts import Events, alive, cmdline, recording_context, script
from tests.conftest import SharedHosts

pytestmark = pytest.mark.hosts

OUTPUT_LIMIT = 64 * 1024
GIB = 1024**3


def context(host: Host) -> tuple[AgentContext, Events]:
    return recording_context(host, match_id="hardening", territory=host.territory)


async def test_an_agent_printing_gigabytes_is_capped(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    host = await shared_hosts("agents")
    program = script(
        tmp_path / "loud.sh",
        """
        #!/bin/sh
        head -c 1G /dev/zero | tr '\\0' o &
        head -c 1G /dev/zero | tr '\\0' e >&2
        wait
        """,
    )
    ctx, events = context(host)
    tracemalloc.start()
    try:
        outcome = await CommandAgent([str(program)], output_limit=OUTPUT_LIMIT).run(ctx)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.terminal_state == "completed"
    for stream in ("stdout", "stderr"):
        chunks = [d["text"] for k, d in events if k == "output" and d["stream"] == stream]
        text = "".join(chunks)
        assert text.endswith(f"\n[{stream} cut after {OUTPUT_LIMIT} bytes]\n")
        assert len(text) < OUTPUT_LIMIT + 100
        # Reads come in pieces of up to 8 KiB; nothing is reported after the cut.
        assert len(chunks) <= OUTPUT_LIMIT // 1024, len(chunks)
        assert chunks[-1].endswith("cut after 65536 bytes]\n")
    assert peak < 16 * 1024 * 1024, peak  # 2 GiB went through; the arena kept a few MiB


async def test_an_agent_ignoring_sigterm_is_killed_with_its_group_at_the_wall_limit(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    host = await shared_hosts("agents")
    program = script(
        tmp_path / "stubborn.sh",
        """
        #!/bin/bash
        trap '' TERM
        for i in 1 2 3; do bash -c 'trap "" TERM; while true; do sleep 0.1; done' & done
        python3 -c 'import signal as s, time; s.signal(s.SIGTERM, s.SIG_IGN); time.sleep(999)' &
        while true; do sleep 0.1; done
        """,
    )
    grace = 0.5
    agent = CommandAgent([str(program)], grace_s=grace, wall_s=2.0)
    ctx, _ = context(host)
    started = time.monotonic()
    running = asyncio.create_task(agent.run(ctx))
    members: list[int] = []
    while len(members) < 4:  # three bash loops and the python sleeper
        assert time.monotonic() - started < 10, members
        await asyncio.sleep(0.05)
        pids = agent.cage.pids() if agent.cage is not None else []
        members = [p for p in pids if b"while true" in cmdline(p) or b"time.sleep" in cmdline(p)]
    outcome = await running
    assert (outcome.terminal_state, outcome.terminal_detail) == (
        "terminated",
        "wall time limit (2s) reached",
    )
    for _ in range(100):  # SIGKILL was sent; the kernel finishes them off
        if not alive(members):
            break
        await asyncio.sleep(0.05)
    assert alive(members) == []


async def test_output_cut_exactly_at_a_read_boundary_is_still_reported(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    """The first read ends exactly at the limit; the byte after it must still produce
    the cut notice (it once vanished: the output looked complete)."""
    host = await shared_hosts("agents")
    program = script(
        tmp_path / "edge.sh", "#!/bin/sh\nhead -c 8192 /dev/zero | tr '\\0' a\nsleep 0.3\necho b\n"
    )
    ctx, events = context(host)
    outcome = await CommandAgent([str(program)], output_limit=8192).run(ctx)
    assert outcome.terminal_state == "completed"
    text = "".join(d["text"] for k, d in events if k == "output" and d["stream"] == "stdout")
    assert text == "a" * 8192 + "\n[stdout cut after 8192 bytes]\n"


async def test_a_child_that_starts_its_own_session_is_killed_too(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    host = await shared_hosts("agents")
    program = script(tmp_path / "escape.sh", "#!/bin/sh\nsetsid sleep 999 &\nsleep 998\n")
    agent = CommandAgent([str(program)], grace_s=0.2, wall_s=1.0)
    ctx, _ = context(host)
    running = asyncio.create_task(agent.run(ctx))
    escaped: list[int] = []
    for _ in range(200):
        await asyncio.sleep(0.05)
        pids = agent.cage.pids() if agent.cage is not None else []
        escaped = [p for p in pids if cmdline(p) == b"sleep\x00999\x00"]
        if escaped:
            break
    assert escaped, "the child did not start"
    await running
    for _ in range(100):  # the cage was killed; the kernel finishes them off
        if not alive(escaped):
            break
        await asyncio.sleep(0.05)
    try:
        assert alive(escaped) == []
    finally:
        for pid in alive(escaped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
