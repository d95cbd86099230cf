"""What a test run left behind: hosts, id reservations, runtime containers, power-cut
disks, their servers and agent cgroups of the match ids this process's tests made.

`tests/conftest.py` checks at the end of each session (each xdist worker is one) and
fails loudly naming what it found, after removing it: a test that leaks must be fixed
(fixtures with finalisers), not hidden by the next run's cleanup. Only this process's
match ids are looked at, so other workers' and other people's hosts never count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterable

from opsarena.agents.cage import ProcessCage, _cage_bases, hierarchies
from opsarena.hosts import get_driver
from opsarena.hosts.podman import LABEL_IDS_MATCH, LABEL_MATCH, RUNC_ROOT
from opsarena.hosts.powerdisk import all_disks
from opsarena.hosts.runc import runc_containers

MATCH_IDS: set[str] = set()
"""Every match id `tests.conftest.new_match_id` gave in this process."""


def _owner(name: str, ids: set[str]) -> str | None:
    """The match of `ids` whose host `name` (`opsarena-MATCH-TERRITORY`) is, if any."""
    return next((m for m in ids if name.startswith(f"opsarena-{m}-")), None)


def _podman_leftovers(ids: set[str]) -> list[tuple[str, str]]:
    listed = subprocess.run(
        ["podman", "ps", "--all", "--format", "json"],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    found = []
    for row in json.loads(listed.stdout or "[]"):
        labels = row.get("Labels") or {}
        match_id = labels.get(LABEL_MATCH) or labels.get(LABEL_IDS_MATCH)
        if match_id in ids:
            found.append((match_id, f"container:{row['Names'][0]}"))
    return found


def _disk_servers(ids: set[str]) -> list[tuple[str, str]]:
    """Power-cut disk servers still running for a host of `ids` (their disk may be gone):
    `python -m opsarena.hosts.diskserver DISK/backing.img ...`."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = cmdline.read().decode(errors="replace").split("\0")
            backing = argv[argv.index("opsarena.hosts.diskserver") + 1]
            host = os.path.basename(os.path.dirname(backing))
            match_id = _owner(host, ids)
            if match_id is not None:
                found.append((match_id, f"disk-server:{pid}:{host}"))
    return found


def _cage_names() -> list[str]:
    names = []
    with contextlib.suppress(OSError):
        for hierarchy in hierarchies():
            for base in _cage_bases(hierarchy):
                with contextlib.suppress(OSError):
                    names += [path.name for path in base.iterdir() if path.is_dir()]
    return names


def leftovers(ids: Iterable[str]) -> dict[str, list[str]]:
    """What is left of the matches `ids`: {match id: [`kind:name`, ...]}, only those
    with something left."""
    wanted = set(ids)
    if not wanted:
        return {}
    found = _podman_leftovers(wanted)
    runc = shutil.which("runc")
    rows = asyncio.run(runc_containers(runc, RUNC_ROOT, timeout=60)) if runc else []
    for row in rows:
        match_id = (row.get("annotations") or {}).get(LABEL_MATCH)
        if match_id in wanted:
            found.append((match_id, f"runc:{row['id']}"))
    found += [(d.match_id, f"disk:{d.dir.name}") for d in all_disks() if d.match_id in wanted]
    found += _disk_servers(wanted)
    for name in _cage_names():
        if name.split(".", 1)[0] in wanted:
            found.append((name.split(".", 1)[0], f"cgroup:{name}"))
    by_match: dict[str, list[str]] = {}
    for match_id, thing in found:
        by_match.setdefault(match_id, []).append(thing)
    return {match_id: sorted(set(things)) for match_id, things in sorted(by_match.items())}


def remove(ids: Iterable[str]) -> None:
    """Remove everything of the matches `ids` (what `leftovers` names)."""
    wanted = set(ids)
    driver = get_driver("podman")
    for match_id in sorted(wanted):
        with contextlib.suppress(Exception):
            asyncio.run(driver.cleanup(match_id=match_id))
        for cage in ProcessCage.of_match(match_id):
            with contextlib.suppress(OSError):
                cage.remove()
    for _match_id, thing in _disk_servers(wanted):
        with contextlib.suppress(OSError):
            os.kill(int(thing.split(":")[1]), signal.SIGKILL)
