"""How many matches a machine may play at once, how many territories a worker node
holds and what it lacks, and when a tournament will be done.

Pure: the caller reads the machine (CPUs, available memory, podman) and the log.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MEMORY_SHARE = 0.8
"""The share of available memory the hosts of running matches may claim at their limits."""


def machine_parallel(
    requested: int,
    *,
    territories_per_match: int,
    cpus: int,
    memory_available_mb: int,
    host_memory_mb: int,
) -> int:
    """Matches at once: what was asked, at most one per CPU (each match's controller,
    referee and host boots are CPU-bound bursts), and no more than the available memory
    holds with every host at its memory limit. Never less than 1."""
    per_match_mb = max(1, territories_per_match * host_memory_mb)
    by_memory = int(memory_available_mb * MEMORY_SHARE) // per_match_mb
    return max(1, min(requested, max(1, cpus), by_memory))


def eta_s(
    finished_s: Sequence[float],
    *,
    pending: int,
    running_elapsed_s: Sequence[float],
    parallel: int,
) -> float | None:
    """Seconds until the last match ends, estimated from the median finished match:
    the pending matches' work plus what the running ones have left, over `parallel`
    lanes. None until a match has finished."""
    if not finished_s:
        return None
    typical = statistics.median(finished_s)
    left = pending * typical + sum(max(0.0, typical - e) for e in running_elapsed_s)
    return left / max(1, parallel)


TERRITORIES_PER_CORE = 8
"""Territories one core holds with the referee's cadence kept (docs/SCALE.md, measured)."""

CGROUP_CONTROLLERS = ("cpu", "memory", "pids")
"""The cgroup controllers a host's limits need."""


@dataclass(frozen=True)
class NodeFacts:
    """What `opsarena worker check` read of a machine."""

    podman: str | None
    """podman's version, None when it is not there or does not answer."""
    runc: bool
    image: str
    image_present: bool
    cgroups: str
    """`v2` (unified), `hybrid` (v1 controllers beside a v2 tree: runc needed) or `none`."""
    cgroup_controllers: frozenset[str]
    """The controllers available (v2's list, or v1's mounted hierarchies)."""
    cpus: int
    memory_available_mb: int
    host_memory_mb: int


def node_territories(facts: NodeFacts) -> int:
    """Territories the node holds: `TERRITORIES_PER_CORE` per core, and no more than the
    available memory holds with every host at its memory limit."""
    by_memory = int(facts.memory_available_mb * MEMORY_SHARE) // max(1, facts.host_memory_mb)
    return max(0, min(facts.cpus * TERRITORIES_PER_CORE, by_memory))


def node_problems(facts: NodeFacts) -> list[str]:
    """What keeps the node from hosting territories, one line each; empty when usable."""
    problems = []
    if facts.podman is None:
        problems.append("podman: missing or not answering (apt-get install podman)")
    if not facts.runc:
        problems.append("runc: missing (apt-get install runc)")
    if facts.podman is not None and not facts.image_present:
        problems.append(f"image {facts.image}: not built (opsarena image build)")
    if facts.cgroups == "none":
        problems.append("cgroups: none mounted at /sys/fs/cgroup")
    else:
        absent = [c for c in CGROUP_CONTROLLERS if c not in facts.cgroup_controllers]
        if absent:
            problems.append(f"cgroups ({facts.cgroups}): controllers {', '.join(absent)} missing")
    if node_territories(facts) < 1:
        problems.append(
            f"memory: {facts.memory_available_mb} MiB available holds no host of "
            f"{facts.host_memory_mb} MiB"
        )
    return problems
