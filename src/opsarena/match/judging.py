"""The controller while the match runs: the standings, when the rules finish the match,
each territory's settle window after its agent ended, and the disk watch."""

from __future__ import annotations

import asyncio
import logging
import time

from opsarena.hosts import Host
from opsarena.match.core import POLL_S, Territory
from opsarena.match.disks import DiskWatch, watch_disks
from opsarena.match.events import JudgingStopped
from opsarena.match.provisioning import Provisioning
from opsarena.match.rules import Standing, finish_reason, match_winner

log = logging.getLogger(__name__)

SETTLE_ERROR_WINDOWS = 3
"""How many times referee errors may restart one territory's settle window."""


class Judging(Provisioning):
    """What the referee's state says of the match: standings, finish, settling."""

    def _standings(self) -> list[Standing]:
        standings = []
        for name, territory in self._territories.items():
            passed = [
                self.referee.milestone_state(name, m.id) for m in self.plan.challenge.milestones
            ]
            times = [m.passed_at_ms for m in passed if m.passed and m.passed_at_ms is not None]
            standings.append(
                Standing(
                    territory=name,
                    points=self.referee.points(name),
                    reached_at_ms=max(times) if times else None,
                    durable=self.referee.is_durable(name),
                    settled=territory.settled,
                )
            )
        return standings

    def _winner(self, reason: str) -> str | None:
        return match_winner(self._standings(), reason, self.referee.durable_order)

    async def _until_finished(self, referee_task: asyncio.Task[None]) -> str:
        limit_ms = int(self.plan.time_limit_s * 1000)
        while True:
            if self._abort.is_set():
                return "aborted"
            if referee_task.done() and not referee_task.cancelled():
                error = referee_task.exception()
                if error is not None:
                    log.error("the referee crashed", exc_info=error)
                    self._abort_why = f"the referee crashed: {error!r}"
                    return "aborted"
            reason = finish_reason(
                self._standings(), mode=self.plan.finish, time_up=self.clock() >= limit_ms
            )
            if reason is not None:
                return reason
            # Wake at once on an abort or a first durable deployment, else look again soon.
            wakers = [asyncio.ensure_future(self._abort.wait())]
            if self.plan.finish == "first-durable":
                wakers.append(asyncio.ensure_future(self.referee.any_durable.wait()))
            _done, pending = await asyncio.wait(
                wakers, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED
            )
            for waker in pending:
                waker.cancel()

    async def _settle(self, name: str, territory: Territory) -> None:
        """The settle window after an agent ended: the referee goes on judging the
        territory at its cadence for `settle_s`; each milestone passed, and each attempt
        that ended in a referee error (the arena's failure, not the competitor's time),
        restarts the window; at its end an attempt in flight runs to its end, then judging
        stops.
        Logs `judging_stopped` when the window expired, saying after which failure (a
        durable territory needs none: the fold stops its judging at its last pass)."""
        window = self.plan.challenge.settle_s
        passed = self._passed_count(name)
        errors = self.referee.referee_errors(name)
        extended = 0
        deadline = time.monotonic() + window
        while True:
            if self.referee.is_durable(name) or self.referee.judging_failed(name):
                # Durable: the record says so (durable_at_ms); the referee failed judging
                # the territory: it logged judging_stopped, and nothing more is judged.
                territory.settled = True
                return
            now_passed = self._passed_count(name)
            if now_passed > passed:
                passed, deadline = now_passed, time.monotonic() + window
            now_errors = self.referee.referee_errors(name)
            if now_errors > errors and extended < SETTLE_ERROR_WINDOWS:
                # An attempt the arena spoiled is not the competitor's time: a new window
                # (a few at most: a host that makes every attempt an error holds nobody).
                errors, deadline = now_errors, time.monotonic() + window
                extended += 1
            if time.monotonic() >= deadline:
                if await self.referee.stop_judging(name, unless_passed_beyond=passed):
                    break
                continue  # the attempt in flight passed a milestone: a new window
            await asyncio.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        if not self.referee.is_durable(name):
            await self.emit(
                JudgingStopped(
                    territory=name, reason="window_expired", detail=self._why_stopped(name)
                )
            )
        territory.settled = True

    def _passed_count(self, name: str) -> int:
        return sum(
            self.referee.milestone_state(name, m.id).passed for m in self.plan.challenge.milestones
        )

    def _why_stopped(self, name: str) -> str:
        window = self.plan.challenge.settle_s
        milestone = self.referee.first_unpassed(name)
        if milestone is None:
            return f"the {window:g} s settle window expired"
        last = self.referee.milestone_state(name, milestone.id).last
        if last is None or last.outcome == "passed":
            return f"the {window:g} s settle window expired before {milestone.id} was attempted"
        return (
            f"the {window:g} s settle window expired after {milestone.id} failed with "
            f"{last.failure_reason}"
        )

    async def _watch_disks(self) -> None:
        """Freeze the disk of any host over its quota or that cannot be measured
        (`match.disks.watch_disks`), until cancelled."""
        watch = DiskWatch(
            byte_quota=self.plan.disk_quota_mb * 2**20, inode_quota=self.plan.disk_inode_quota
        )

        def hosts() -> list[tuple[str, Host]]:
            return [(n, t.host) for n, t in self._territories.items() if t.host is not None]

        await watch_disks(hosts, watch, self.emit)
