"""How many matches a machine may play at once, and when a tournament will be done.

Pure: the caller reads the machine (CPUs, available memory) and the log.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

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
