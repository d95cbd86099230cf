"""Tournament matches as Ray tasks, each on a node with free `opsarena_territory` units.

The driver (`opsarena tournament run --ray`) keeps the tournament's state in the shared
PostgreSQL log, never in Ray: a task gets only the log's URL, the tournament id, the slot
and the attempt, reads the plan (the file's text as it started, and the seed) from the log,
and plays the whole match (controller, referee, hosts) on the node it landed on, writing
the match's events to the same log. The task's return value says only where it ran and
whether it raised; the verdict is the fold of the match's own log.

A node that dies mid-match fails its task with a Ray error (`NodeDiedError`,
`WorkerCrashedError`, ...): the runner records that attempt as lost to infrastructure and
replays it with the same seed. Ray is an optional extra (`opsarena[ray]`): the core never
imports this module, and it imports Ray only when an executor is made.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import socket
import sys
from types import ModuleType
from typing import Any

from opsarena.errors import MatchError, UsageError
from opsarena.match.controller import Controller
from opsarena.store import open_store
from opsarena.tournament.runner import (
    STOP_SIGNALS,
    RemoteOutcome,
    load_tournament_record,
    plan_from_log,
    slot_match_plan,
)

RESOURCE = "opsarena_territory"
"""The custom resource a worker node declares, one unit per territory it can hold."""

LOST_ERRORS = (
    "NodeDiedError",
    "WorkerCrashedError",
    "LocalRayletDiedError",
    "ObjectLostError",
    "OwnerDiedError",
    "TaskUnschedulableError",
)
"""Ray's errors that mean the machine (or its worker process) went away, not the match."""


def import_ray() -> ModuleType:
    """Ray, or a `UsageError` saying how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise UsageError(
            "--ray needs Ray, which is not installed: pip install 'opsarena[ray]'"
        ) from None


def play_on_node(
    db: str, tournament_id: str, slot: int, attempt: int, driver: str
) -> dict[str, str]:
    """The body of a match's Ray task: play that attempt here, from the log alone."""
    return asyncio.run(_play(db, tournament_id, slot, attempt, driver))


def restore_priority() -> str:
    """Ray starts its worker processes at niceness 15 (its `worker_niceness`, so the
    raylet wins the CPU). A match must not run there: its controller, its referee and the
    hosts it starts (they inherit the niceness) would wait behind every other program of a
    busy node, and a starved referee misjudges (a probe answered late, a settle window
    that closes before the host was ever scheduled). Back to 0, as Ray does for its own
    job supervisors; Linux keeps a niceness per thread, and every thread and process the
    match starts later inherits this one's. Returns "" when done, else why not (lowering a
    niceness needs CAP_SYS_NICE or a raised RLIMIT_NICE: start the node's raylet with
    `RAY_worker_niceness=0` instead)."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if current <= 0:
        return ""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except PermissionError:
        return (
            f"this worker runs at niceness {current} and may not lower it: start the node "
            "with RAY_worker_niceness=0 in ray start's environment"
        )
    return ""


async def _play(
    db: str, tournament_id: str, slot: int, attempt: int, driver: str
) -> dict[str, str]:
    node = f"{socket.gethostname()}/{_ray_node_id()}"
    stuck = restore_priority()
    if stuck:
        print(f"opsarena: warning: {stuck}", file=sys.stderr, flush=True)
    with open_store(db) as store:
        record = await load_tournament_record(store, tournament_id, reveal_seed=True)
        plan = await plan_from_log(store, record)
        slot_record = record.slots[slot - 1]
        match_plan = slot_match_plan(
            plan, slot_record, slot_record.attempts[attempt - 1], driver=driver
        )
        controller = Controller(match_plan, store)
        try:
            await controller.run()
        except MatchError as exc:
            return {"node": node, "error": str(exc)[:500], "lost": ""}
    lost = ""
    if controller.abort_reason in STOP_SIGNALS:  # the node is being shut down under it
        lost = f"lost to infrastructure: its worker on {node} got {controller.abort_reason}"
    return {"node": node, "error": "", "lost": lost}


def remove_on_node(match_id: str, driver: str) -> list[str]:
    """The body of a clean-up task pinned to one node: that match's hosts there, removed
    by the driver's own labels (never a program of the hosts)."""
    from opsarena.hosts import get_driver

    restore_priority()
    return asyncio.run(get_driver(driver).cleanup(match_id=match_id))


def _ray_node_id() -> str:
    ray = importlib.import_module("ray")
    try:
        return str(ray.get_runtime_context().get_node_id())[:12]
    except Exception:  # not in a Ray worker (a direct call): the pid says enough
        return f"pid{os.getpid()}"


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def connect(address: str) -> ModuleType:
    """Ray, connected to the cluster at `address` (`auto`: the one on this machine).
    `UsageError` in one line when there is none. A loopback address keeps this process on
    loopback too: Ray would otherwise replace 127.0.0.1 by the machine's outward address
    (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` is Ray's switch for "this node's IP is the
    loopback one"; it is read when Ray is imported)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address.rpartition(":")[0] in LOOPBACK:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = import_ray()
    if not ray.is_initialized():
        try:
            ray.init(
                address=address,
                log_to_driver=False,
                configure_logging=False,
                namespace="opsarena",
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UsageError(f"--ray {address}: no Ray cluster to join ({first})") from None
    return ray


def cluster_territories(ray: ModuleType) -> int:
    """The `opsarena_territory` units every live node declares together."""
    return int(ray.cluster_resources().get(RESOURCE, 0))


class RayExecutor:
    """Sends each match to the Ray cluster `ray` is connected to, as a task that holds
    `territories` units of `opsarena_territory` (and no CPU: the territories are the
    node's capacity) while the match runs. Ray itself never retries a task: a lost match
    is replayed by the runner under a new match id, so the log says it was lost."""

    def __init__(self, ray: ModuleType, db: str, *, territories: int, driver: str) -> None:
        self._ray = ray
        self.db = db
        self.territories = territories
        self.driver = driver
        self._task: Any = ray.remote(play_on_node)
        self._remove: Any = ray.remote(remove_on_node)
        lost = tuple(getattr(ray.exceptions, name) for name in LOST_ERRORS
                     if hasattr(ray.exceptions, name))  # fmt: skip
        self._lost: tuple[type[BaseException], ...] = lost

    def check_capacity(self) -> int:
        """The cluster's territory units; `UsageError` when no node can hold a match."""
        units = cluster_territories(self._ray)
        largest = max(
            (int(n.get("Resources", {}).get(RESOURCE, 0)) for n in self._ray.nodes()
             if n.get("Alive")),
            default=0,
        )  # fmt: skip
        if largest < self.territories:
            raise UsageError(
                f"no node of the Ray cluster holds {self.territories} {RESOURCE} units for a "
                f"match (the cluster has {units}): start workers with "
                f"ray start --address HEAD:6379 --resources='{{\"{RESOURCE}\": 16}}'"
            )
        return units

    async def remove_hosts(self, match_id: str) -> list[str]:
        """Run the clean-up of `match_id`'s hosts on every live node that declares
        territories (a lost match's node is unknown, or gone). Errors of one node (it died
        meanwhile) are skipped: its hosts died with it."""
        strategy = importlib.import_module("ray.util.scheduling_strategies")
        refs = [
            self._remove.options(
                num_cpus=0, max_retries=0,
                scheduling_strategy=strategy.NodeAffinitySchedulingStrategy(
                    node_id=n["NodeID"], soft=False
                ),
            ).remote(match_id, self.driver)
            for n in self._ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get(RESOURCE)
        ]  # fmt: skip
        removed: list[str] = []
        for ref in refs:
            try:
                removed += await ref
            except self._ray.exceptions.RayError:
                continue
        return removed

    async def play(self, tournament_id: str, slot: int, attempt: int) -> RemoteOutcome:
        ref = self._task.options(
            resources={RESOURCE: self.territories},
            num_cpus=0,
            max_retries=0,
            retry_exceptions=False,
            name=f"opsarena match {tournament_id} slot {slot} attempt {attempt}",
        ).remote(self.db, tournament_id, slot, attempt, self.driver)
        try:
            result = await ref
        except asyncio.CancelledError:
            self._ray.cancel(ref)  # a KeyboardInterrupt there: its controller aborts cleanly
            raise
        except self._lost as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            return RemoteOutcome(lost=f"lost to infrastructure: {type(exc).__name__}: {first}")
        return RemoteOutcome(
            node=str(result.get("node", "")),
            error=str(result.get("error", "")),
            lost=str(result.get("lost", "")),
        )
