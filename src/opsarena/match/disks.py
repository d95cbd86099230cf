"""The disk watch: every host's disk measured against its quotas while the match runs,
and frozen (read-only) when it is over them or cannot be measured. `DiskWatch` decides
from measurements alone (no I/O); `watch_disks` measures and freezes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from opsarena.errors import DiskMeasureError, HostError
from opsarena.hosts import DiskUse, Host
from opsarena.match.events import DiskQuotaExceeded, EventData

log = logging.getLogger(__name__)

DISK_CHECK_S = 1.0
"""How often each host's disk use is measured against the quota."""
DISK_BLIND_S = 60.0
"""A host the driver cannot measure (`HostUnavailableError`) for this long has its disk
frozen: a quota the arena cannot check is not left unenforced."""
DISK_PARTIAL_LIMIT = 5
"""Consecutive partial measurements (entries vanishing while counted) after which a
host's disk is frozen: a host that keeps its tree churning to hide from the count."""


@dataclass
class DiskWatch:
    """What `watch_disks` knows of every host's disk: which are frozen, which must be,
    and since when each could not be measured. Decides from measurements alone (no I/O)."""

    byte_quota: int
    inode_quota: int
    frozen: set[str] = field(default_factory=set)
    pending: dict[str, DiskQuotaExceeded] = field(default_factory=dict)
    """Hosts to freeze (the event to log once they are), freezing having failed so far."""
    last: dict[str, DiskUse] = field(default_factory=dict)
    blind_since: dict[str, float] = field(default_factory=dict)
    partial_runs: dict[str, int] = field(default_factory=dict)

    def _event(self, name: str, reason: str, detail: str) -> DiskQuotaExceeded:
        last = self.last.get(name, DiskUse(0, 0))
        return DiskQuotaExceeded(
            territory=name, used_bytes=last.bytes, quota_bytes=self.byte_quota,
            used_inodes=last.inodes, inode_quota=self.inode_quota,
            reason=reason, detail=detail,
        )  # fmt: skip

    def measured(self, name: str, use: DiskUse) -> DiskQuotaExceeded | None:
        self.last[name] = use
        self.blind_since.pop(name, None)
        runs = self.partial_runs[name] = self.partial_runs.get(name, 0) + 1 if use.partial else 0
        if use.bytes > self.byte_quota:
            detail = f"{use.bytes} bytes written, over the quota of {self.byte_quota}"
            return self._event(name, "bytes", detail)
        if use.inodes > self.inode_quota:
            detail = f"{use.inodes} inodes used, over the quota of {self.inode_quota}"
            return self._event(name, "inodes", detail)
        if runs >= DISK_PARTIAL_LIMIT:
            detail = (
                f"{runs} counts in a row were partial (entries vanished while they were "
                "counted): the disk cannot be measured"
            )
            return self._event(name, "unmeasured", detail)
        return None

    def unmeasured(self, name: str, why: str) -> DiskQuotaExceeded:
        return self._event(name, "unmeasured", f"the disk cannot be measured: {why}")

    def blind(self, name: str, why: str, now: float) -> DiskQuotaExceeded | None:
        since = self.blind_since.setdefault(name, now)
        if now - since < DISK_BLIND_S:
            return None
        detail = f"the disk could not be measured for {now - since:.0f}s: {why}"
        return self._event(name, "unmeasured", detail)


async def watch_disks(
    hosts: Callable[[], Iterable[tuple[str, Host]]],
    watch: DiskWatch,
    emit: Callable[[EventData], Awaitable[None]],
) -> None:
    """Every `DISK_CHECK_S`, freeze the disk of any host over its byte or inode quota,
    or that cannot be measured: a competitor filling its disk (or the machine's
    inodes) fails alone and never fills the machine. Fails closed: a count that
    fails or times out freezes at once (`DiskMeasureError`: the host's own tree
    decides it); a host the driver cannot look at for `DISK_BLIND_S`, or whose
    counts stay partial `DISK_PARTIAL_LIMIT` times in a row, is frozen too. A
    freeze that fails (the host is rebooting) is tried again at the next check.
    `hosts()` names the match's hosts now; `emit` logs each freeze (once). Runs until
    cancelled."""
    while True:
        checks = [
            _check_disk(name, host, watch, emit)
            for name, host in hosts()
            if name not in watch.frozen
        ]
        for failed in await asyncio.gather(*checks, return_exceptions=True):
            if isinstance(failed, Exception):  # an arena bug: the other hosts go on
                log.error("disk check failed: %r", failed)
        await asyncio.sleep(DISK_CHECK_S)


async def _check_disk(
    name: str, host: Host, watch: DiskWatch, emit: Callable[[EventData], Awaitable[None]]
) -> None:
    verdict = watch.pending.get(name)
    if verdict is None:
        try:
            use = await host.disk_use()
        except DiskMeasureError as exc:
            verdict = watch.unmeasured(name, str(exc))
        except HostError as exc:  # the driver cannot look now (a power cut, podman)
            log.debug("disk check of %s: %s", name, exc)
            verdict = watch.blind(name, str(exc), time.monotonic())
        else:
            verdict = watch.measured(name, use)
        if verdict is None:
            return
        watch.pending[name] = verdict
    try:
        await host.freeze_disk()
    except HostError as exc:  # rebooting, or gone: freeze it at the next check
        log.warning("freezing the disk of %s: %s (trying again)", name, exc)
        return
    watch.frozen.add(name)
    del watch.pending[name]
    await emit(verdict)
