"""Listing runc's containers, exactly, while other containers come and go.

`runc list` (1.1.x, Debian bookworm's) reads its state root, then stats each entry: a
container deleted in between (`podman rm` of any other host on the machine) makes the
whole listing fail with "stat /run/runc/ID: no such file or directory" and print
nothing. A caller that reads its empty output as "no containers" misses every one of
them, as `sweep_runtime` did under a busy test run. So a failed listing is tried
again, and when it keeps failing each entry of the root is asked for alone with
`runc state`, where a container gone meanwhile is simply not there.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from opsarena.errors import HostError
from opsarena.hosts.process import run_process

LIST_ATTEMPTS = 5
"""`runc list` attempts before asking each container alone."""


def _last_line(stderr: bytes) -> str:
    lines = stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "no error output"


def _directories(root: str) -> list[str]:
    with os.scandir(root) as entries:
        return sorted(entry.name for entry in entries if entry.is_dir())


async def runc_containers(runc: str, root: str, *, timeout: float) -> list[dict[str, Any]]:
    """The containers in runc's state `root`, each as `runc list --format json` gives
    it (`id`, `status`, `annotations`, ...). Raises `HostError` when runc cannot read
    the root at all (never an empty list in place of an error)."""
    for _attempt in range(LIST_ATTEMPTS):
        listed = await run_process(
            [runc, "--root", root, "list", "--format", "json"], timeout=timeout
        )
        if listed.returncode == 0:
            return list(json.loads(listed.stdout or b"null") or [])
    try:
        entries = await asyncio.to_thread(_directories, root)
    except FileNotFoundError:
        return []  # runc has never run a container here
    except OSError as error:
        raise HostError(f"cannot list runc's containers in {root}: {error}") from error
    rows: list[dict[str, Any]] = []
    for entry in entries:
        state = await run_process([runc, "--root", root, "state", entry], timeout=timeout)
        if state.returncode == 0:
            rows.append(json.loads(state.stdout))
        elif b"does not exist" not in state.stderr:  # else deleted since, or not made yet
            raise HostError(f"cannot read runc container {entry}: {_last_line(state.stderr)}")
    return rows
