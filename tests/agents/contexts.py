"""What agent tests share: a context that records what the agent reports, executable
scripts, and the live members of a process group."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path
from typing import Any

from opsarena.agents import AgentContext
from opsarena.hosts import Host

Events = list[tuple[str, dict[str, Any]]]

BRIEF = "Deploy a durable records service on port 8080."


def recording_context(
    host: Host,
    *,
    brief: str = BRIEF,
    deadline_s: float = 300.0,
    match_id: str = "m1",
    territory: str = "builder-one",
) -> tuple[AgentContext, Events]:
    """An `AgentContext` on `host` whose `report` appends `(kind, data)` to the list
    returned beside it."""
    events: Events = []

    async def report(kind: str, data: dict[str, Any]) -> None:
        events.append((kind, data))

    ctx = AgentContext(
        match_id=match_id,
        territory=territory,
        brief=brief,
        host=host,
        deadline=time.monotonic() + deadline_s,
        report=report,
    )
    return ctx, events


def script(path: Path, body: str) -> Path:
    """Write `body` (dedented) to `path` as an executable script."""
    path.write_text(textwrap.dedent(body).lstrip())
    path.chmod(0o755)
    return path


def live_members(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            members.append(int(entry))
    return members


def cmdline(pid: int) -> bytes:
    """`pid`'s command line (NUL-separated), empty when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pids: list[int]) -> list[int]:
    """Those of `pids` that are still running (not gone, not zombies)."""
    living = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z":
            living.append(pid)
    return living
