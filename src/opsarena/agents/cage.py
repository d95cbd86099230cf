"""A cgroup per agent program, so that every process it starts can be found and killed.

A process group is not enough: a child that calls setsid(2) leaves it and would outlive
the agent. A cgroup is inherited by every descendant and cannot be left without
privileges, so killing what is in it ends everything the program started.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from pathlib import Path

ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"))
"""Where a cgroup of our own may be made: cgroup v2, or the v1 pids hierarchy."""

KILL_ROUNDS = 50


class ProcessCage:
    """One cgroup holding an agent program and all its descendants."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, match_id: str, territory: str) -> ProcessCage | None:
        """A new, empty cage for `territory`'s agent in `match_id`, or None when no cgroup
        hierarchy here lets us make one (not root, or a read-only /sys/fs/cgroup): callers
        then rely on process groups."""
        for root in ROOTS:
            if not (root / "cgroup.procs").exists():
                continue
            path = root / "opsarena" / f"{match_id}.{territory}.{secrets.token_hex(3)}"
            try:
                path.mkdir(parents=True)
            except OSError:
                continue
            return cls(path)
        return None

    @classmethod
    def of_match(cls, match_id: str) -> list[ProcessCage]:
        """Every cage left for `match_id`'s agents: those of a controller that died
        (SIGKILL, a crash) without removing them. Empty when there are none."""
        return [
            cls(path)
            for root in ROOTS
            if (root / "opsarena").is_dir()
            for path in sorted((root / "opsarena").glob(f"{match_id}.*"))
            if path.is_dir()
        ]

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` started inside the cage: a shell moves itself in, then execs `argv`,
        so not even the program's first instruction runs outside."""
        procs = str(self.path / "cgroup.procs")
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        return []

    def kill_all(self) -> int:
        """SIGKILL everything in the cage until it is empty (or a bounded number of
        rounds); return how many processes were killed."""
        killed = 0
        for _round in range(KILL_ROUNDS):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
            time.sleep(0.02)
        return killed

    def remove(self) -> None:
        """Kill what is left and delete the cgroup."""
        self.kill_all()
        for _attempt in range(KILL_ROUNDS):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # the last processes are still exiting
                time.sleep(0.02)
