"""The controller's end of a match: judging until the rules finish it, then
`match_finished`, the drain, the hosts released, the arena's own events checked and
`match_closed` with the seed revealed; and the same close after an abort or a bug."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Coroutine
from typing import Any

from opsarena.errors import OpsArenaError
from opsarena.match.agent_runs import AgentRuns
from opsarena.match.diagnose import dump_tasks
from opsarena.match.events import MatchClosed, MatchFinished

log = logging.getLogger(__name__)


class Closing(AgentRuns):
    """The match judged to its finish and closed, whatever happens."""

    async def _judge(self) -> None:
        """Referee, final verifications and `opsarena done` until the match is over; close."""
        referee_task = asyncio.create_task(self.referee.run(), name="referee")
        done_task = asyncio.create_task(self._watch_done(), name="watch-done")
        disk_task = asyncio.create_task(self._watch_disks(), name="watch-disks")
        try:
            reason = await self._until_finished(referee_task)
        finally:
            # No attempt may start once the match is over: stop every judging task first.
            self._judging_over = True
            stoppable = [referee_task, done_task, disk_task, *self._settlers]
            for task in stoppable:
                task.cancel()
            await asyncio.gather(*stoppable, return_exceptions=True)
        await self._close(reason, self._winner(reason))

    async def _close(self, reason: str, winner: str | None) -> None:
        if not self._finished:
            self._finished = True
            await self.emit(MatchFinished(finish_reason=reason, winner=winner))
        await self._drain(reason)
        await self._release_hosts()
        self._closed = True
        try:
            await self._check_own_events()
        except OpsArenaError as exc:  # the check must never keep the match from closing
            log.error("match %s: could not check its own events: %s", self.match_id, exc)
        legacy = not self.plan.nonce  # resumed from a log that had its seed in the open
        await self.emit(
            MatchClosed(
                seed=None if legacy else self.plan.seed.hex(),
                seed_nonce=None if legacy else self.plan.nonce.hex(),
            )
        )
        try:  # revealed now: the vault's copy has done its job
            await asyncio.to_thread(self.store.vault().discard, self.match_id)
        except OpsArenaError as exc:
            log.warning("match %s: %s", self.match_id, exc)

    async def _guarded(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` with Ctrl-C and SIGTERM turned into a clean abort; on a bug or a
        cancellation, still close the log and leave no host behind."""
        loop = asyncio.get_running_loop()
        handled: list[signal.Signals] = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, self.request_abort, signum.name)
                handled.append(signum)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGUSR1, dump_tasks)  # what it waits on
            handled.append(signal.SIGUSR1)
        try:
            await work
        except BaseException as exc:
            if not self._closed:
                self._abort_why = self._abort_why or f"controller error: {exc!r}"[:500]
                await asyncio.shield(self._close_after_error())
            raise
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)

    async def _close_after_error(self) -> None:
        try:
            await self._close("aborted", None)
        except Exception:
            log.exception("could not close match %s cleanly", self.match_id)
        finally:
            if not self.plan.keep_hosts:
                await self.driver.cleanup(match_id=self.match_id)
