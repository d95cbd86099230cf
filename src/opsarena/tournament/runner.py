"""The tournament controller: plays every slot of the schedule, event-sourced, resumable.

Every step goes into the tournament's stream first (`record.py`); what the controller
knows is the fold of that stream. Each slot's match has an id fixed by the tournament id,
slot and attempt, so after a kill `resume` finds each match by its id: a match that
closed is recorded as it ended, one cut off is continued by `Controller.resume` (the match's
own resume), one that never logged an event is played from the start under the same id.
No slot is counted twice: an attempt that does not count (void) is replayed under a new id,
up to `retries` times.

Where a match is played is the `MatchExecutor`'s business: none (the default) plays it in
this process; `ray_exec.RayExecutor` sends it to a node of a Ray cluster. A match whose
machine went away is *lost*: void, no competitor charged, replayed with the same seed.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from opsarena.agents.registry import preflight_agent
from opsarena.agents.scripted import check_scripted
from opsarena.errors import EventLogError, MatchError, OpsArenaError, TournamentError
from opsarena.hosts import DEFAULT_DRIVER, get_driver
from opsarena.match.controller import Controller, MatchPlan
from opsarena.match.fold import fold_events
from opsarena.match.record import MatchRecord
from opsarena.store import EventStore, StoredEvent
from opsarena.tournament.outcomes import void_reason
from opsarena.tournament.record import (
    AttemptRecord,
    ControllerProcess,
    SlotMatchEnded,
    SlotMatchStarted,
    SlotRecord,
    SlotSpec,
    TournamentCreated,
    TournamentEvent,
    TournamentFinished,
    TournamentFolder,
    TournamentRecord,
    TournamentStarted,
    fold_tournament,
    seed_commitment,
    stream_id,
)
from opsarena.tournament.spec import Slot, TournamentPlan, match_seed, parse_tournament

STOP_SIGNALS = frozenset({"SIGINT", "SIGTERM"})
"""The abort reasons a match controller logs when it caught a signal meant for us all."""


@dataclass(frozen=True)
class RemoteOutcome:
    """How a match played elsewhere ended, as its executor saw it. The verdict itself is
    never taken from here: the controller folds the match's own log."""

    node: str = ""
    """Which machine played it."""
    error: str = ""
    """The `MatchError` the match raised (an agent that could not start), if any."""
    lost: str = ""
    """Why the match was lost to infrastructure (its node died), or empty."""


class MatchExecutor(Protocol):
    """Plays one attempt's match somewhere else, from the tournament's log alone."""

    async def play(self, tournament_id: str, slot: int, attempt: int) -> RemoteOutcome: ...

    async def remove_hosts(self, match_id: str) -> list[str]:
        """Remove a lost match's hosts from every node still there; their names."""
        ...


def new_tournament_id() -> str:
    """A readable, unique, host-name-safe tournament id."""
    return "tour-" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def slot_match_id(tournament_id: str, slot: int, attempt: int) -> str:
    """The match id of one attempt at one slot: `ID-SLOT`, replays `ID-SLOTrN`."""
    return f"{tournament_id}-{slot}" + (f"r{attempt - 1}" if attempt > 1 else "")


async def load_tournament_record(
    store: EventStore, tournament_id: str, *, reveal_seed: bool = False
) -> TournamentRecord:
    """The folded record of a tournament; `TournamentError` when there is none."""
    events = await store.read(stream_id(tournament_id))
    if not events:
        raise TournamentError(
            f"no tournament {tournament_id!r} in the event log: `opsarena tournament ls` lists them"
        )
    return fold_tournament(events, reveal_seed=reveal_seed)


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from its end.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # a zombie is dead, only not yet reaped
        return None
    return int(fields[19])


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def this_process() -> ControllerProcess | None:
    """This process, as `tournament_started` records it (None without /proc)."""
    ticks = _start_ticks(os.getpid())
    return None if ticks is None else ControllerProcess(
        pid=os.getpid(), start_ticks=ticks, boot_id=_boot_id()
    )  # fmt: skip


def is_alive(process: ControllerProcess) -> bool:
    """Whether that process still runs: same boot, same pid, same start time (a reused
    pid has another start time)."""
    if process.boot_id != _boot_id():
        return False
    return _start_ticks(process.pid) == process.start_ticks


async def preflight_competitors(plan: TournamentPlan) -> None:
    """Build every competitor's agent and run its preflight (the builder exists, the
    endpoint answers, the program is there) before anything is logged. Raises one
    `TournamentError` with a line per competitor that cannot play."""
    problems = []
    directories: list[str | Path | None] = [c.directory for c in plan.challenges.values()]
    for name, competitor in plan.competitors.items():
        try:
            if competitor.kind == "scripted":
                check_scripted(competitor.spec.arg, directories)
            await preflight_agent(competitor.build())
        except OpsArenaError as exc:
            problems.append(f"{plan.source}: territories.{name}.agent: {exc}")
    if problems:
        raise TournamentError("\n".join(problems))


class TournamentRunner:
    """Plays a tournament's slots, `parallel` matches at once, logging to `store`."""

    def __init__(
        self,
        store: EventStore,
        plan: TournamentPlan,
        tournament_id: str,
        *,
        parallel: int,
        driver: str = DEFAULT_DRIVER,
        executor: MatchExecutor | None = None,
    ) -> None:
        self.store = store
        self.executor = executor
        self.plan = plan
        self.tournament_id = tournament_id
        self.parallel = parallel
        self.driver = driver
        self._stream = stream_id(tournament_id)
        self._lock = asyncio.Lock()
        self._t0 = time.monotonic()
        self._t_offset_ms = 0
        self.record: TournamentRecord | None = None
        self._playing: set[Controller] = set()
        self._folder = TournamentFolder()
        self.stopped_by = ""
        """The signal that stopped the tournament (a match's controller caught it)."""

    # ---- starting ----------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        store: EventStore,
        plan: TournamentPlan,
        *,
        parallel: int,
        tournament_id: str | None = None,
        driver: str = DEFAULT_DRIVER,
        executor: MatchExecutor | None = None,
    ) -> TournamentRunner:
        """Log a new tournament of `plan`; `TournamentError` if the id is taken."""
        tournament_id = tournament_id or new_tournament_id()
        await preflight_competitors(plan)
        if await store.exists(stream_id(tournament_id)):
            raise TournamentError(f"tournament {tournament_id!r} exists already")
        self = cls(store, plan, tournament_id, parallel=parallel, driver=driver, executor=executor)
        base = Path(plan.source).parent.resolve()
        await self._emit(
            TournamentCreated(
                tournament_id=tournament_id,
                name=plan.name,
                source=plan.source,
                base_dir=str(base),
                text=plan.text,
                seed=plan.seed.hex(),
                seed_commitment=seed_commitment(plan.seed),
                retries=plan.retries,
                competitors={n: c.spec.text for n, c in plan.competitors.items()},
                slots=[SlotSpec(**s.to_json()) for s in plan.slots],
            )
        )
        return self

    @classmethod
    async def resume(
        cls,
        store: EventStore,
        tournament_id: str,
        *,
        parallel: int | None = None,
        driver: str = DEFAULT_DRIVER,
        executor: MatchExecutor | None = None,
    ) -> TournamentRunner:
        """Take up a tournament from its log (its controller was killed). The file's text
        is in the log, so the competitors and challenges are the ones it started with.
        `TournamentError` for an unknown or finished tournament."""
        record = await load_tournament_record(store, tournament_id, reveal_seed=True)
        if record.state == "finished":
            raise TournamentError(f"tournament {tournament_id} is finished already")
        if record.controller is not None and is_alive(record.controller):
            raise TournamentError(
                f"tournament {tournament_id} is being played by process "
                f"{record.controller.pid}: resume it only once that process is gone"
            )
        assert record.seed is not None
        plan = await plan_from_log(store, record)
        if [s.to_json() for s in plan.slots] != [
            {"slot": s.slot, "challenge": s.challenge, "trial": s.trial, "group": s.group}
            for s in record.slots
        ]:
            raise TournamentError(
                f"tournament {tournament_id}: its file no longer gives the same schedule "
                "(a challenge changed or is gone); it cannot be resumed"
            )
        self = cls(
            store, plan, tournament_id, parallel=parallel or record.parallel, driver=driver,
            executor=executor,
        )  # fmt: skip
        self.record = record
        last = (await store.read(self._stream, after=record.last_sequence - 1))[-1]
        self._t_offset_ms = last.t_ms
        return self

    # ---- the log ---------------------------------------------------------------------

    def _clock(self) -> int:
        return self._t_offset_ms + int((time.monotonic() - self._t0) * 1000)

    async def _emit(self, event: TournamentEvent) -> None:
        """Append one event and fold it (only it: a long tournament stays cheap)."""
        async with self._lock:
            if self._folder.last_sequence == 0:  # resumed: catch up with the log once
                for stored in await self.store.read(self._stream):
                    self._folder.apply(stored)
            seq = await self.store.append(
                self._stream, event.event_type, event.model_dump(mode="json"), self._clock()
            )
            for stored in await self.store.read(self._stream, after=seq - 1, limit=1):
                self._folder.apply(stored)
            self.record = self._folder.record(reveal_seed=True)

    def _slot(self, number: int) -> SlotRecord:
        assert self.record is not None
        return self.record.slots[number - 1]

    # ---- playing ---------------------------------------------------------------------

    async def run(self) -> TournamentRecord:
        """Play (or continue) every slot; return the finished record. A slot cut off by a
        kill goes first. Raises what a match raises that is not its own failure (an agent
        that cannot start): the tournament stays resumable."""
        assert self.record is not None
        resumed = self.record.runs > 0
        await self._emit(
            TournamentStarted(parallel=self.parallel, resumed=resumed, controller=this_process())
        )
        gate = asyncio.Semaphore(self.parallel)
        order = sorted(
            self.record.slots, key=lambda s: (s.state != "playing", s.slot)
        )  # in flight first
        todo = [s.slot for s in order if s.state in ("playing", "pending", "void")]

        async def one(number: int) -> None:
            async with gate:
                if not self.stopped_by:
                    await self._settle_slot(number)

        tasks = [asyncio.create_task(one(n), name=f"slot-{n}") for n in todo]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        if self.stopped_by:
            raise TournamentError(
                f"tournament {self.tournament_id} stopped by {self.stopped_by}: "
                f"`opsarena tournament resume {self.tournament_id}` continues it"
            )
        await self._emit(TournamentFinished())
        return fold_tournament(await self.store.read(self._stream))

    def _stop(self, why: str) -> None:
        """A match's controller caught Ctrl-C or SIGTERM (it installs the handlers while it
        runs, so only one of the running matches hears it): abort the others too, and
        start no more matches."""
        self.stopped_by = why
        for controller in self._playing:
            controller.request_abort(why)

    async def _settle_slot(self, number: int) -> None:
        """Bring one slot to a counted match, or to void with its replays used up."""
        slot = self._slot(number)
        if slot.state == "playing":
            last = slot.attempts[-1]
            await self._finish(number, last.attempt, last.match_id, cut_off=True)
        assert self.record is not None
        while self._slot(number).state in ("pending", "void") and not self.stopped_by:
            slot = self._slot(number)
            if slot.settled(self.record.retries):
                return
            attempt = len(slot.attempts) + 1
            seed_attempt = slot.next_seed_attempt()
            match_id = slot_match_id(self.tournament_id, number, attempt)
            await self._emit(
                SlotMatchStarted(
                    slot=number, attempt=attempt, match_id=match_id,
                    seed_attempt=None if seed_attempt == attempt else seed_attempt,
                )
            )  # fmt: skip
            await self._finish(number, attempt, match_id, cut_off=False)

    async def _finish(self, number: int, attempt: int, match_id: str, *, cut_off: bool) -> None:
        """Play (or, when `cut_off`, take up) the match of one attempt and log its end."""
        record: MatchRecord | None = None
        why = ""
        events = await self.store.read(match_id) if cut_off else []
        if self.executor is not None:
            await self._finish_elsewhere(number, attempt, match_id, events, cut_off=cut_off)
            return
        try:
            if events:
                record = fold_events(events)
                if record.match_state != "finished":
                    challenge = self.plan.challenges[record.challenge]
                    record = await Controller.resume(
                        self.store, record, challenge, driver=self.driver
                    )
            else:
                if cut_off:  # killed before the match logged anything: nothing of it exists
                    await get_driver(self.driver).cleanup(match_id=match_id)
                controller = Controller(self._match_plan(number, attempt, match_id), self.store)
                self._playing.add(controller)
                try:
                    record = await controller.run()
                finally:
                    self._playing.discard(controller)
                    if controller.abort_reason in STOP_SIGNALS:
                        self._stop(controller.abort_reason)
        except MatchError as exc:
            why = str(exc)
            events = await self.store.read(match_id)
            if events:
                try:
                    record = fold_events(events)
                except EventLogError:
                    record = None
        void = void_reason(record)
        if void and why:
            void = f"{void}: {why}"
        await self._emit(
            SlotMatchEnded(
                slot=number, attempt=attempt, match_id=match_id, counted=void is None,
                why=void or "",
            )
        )  # fmt: skip

    async def _finish_elsewhere(
        self,
        number: int,
        attempt: int,
        match_id: str,
        events: Sequence[StoredEvent],
        *,
        cut_off: bool,
    ) -> None:
        """The executor's version of `_finish`. A match cut off by the controller's death
        was on a node whose tasks died with the controller: unless it had closed, it is
        lost (its hosts are not on this machine to resume)."""
        assert self.executor is not None
        outcome = RemoteOutcome()
        if cut_off and events:
            if fold_events(events).match_state != "finished":
                outcome = RemoteOutcome(
                    lost="lost to infrastructure: the controller that sent it to its node died"
                )
        else:
            outcome = await self.executor.play(self.tournament_id, number, attempt)
        record: MatchRecord | None = None
        events = await self.store.read(match_id)
        if events:
            try:
                record = fold_events(events)
            except EventLogError:
                record = None
        void = void_reason(record)
        if outcome.lost:
            void = outcome.lost
            # Its hosts died with a dead node; a killed driver's left them on a live one.
            await self.executor.remove_hosts(match_id)
        elif void and outcome.error:
            void = f"{void}: {outcome.error}"
        await self._emit(
            SlotMatchEnded(
                slot=number, attempt=attempt, match_id=match_id, counted=void is None,
                why=void or "", lost=bool(outcome.lost), node=outcome.node,
            )
        )  # fmt: skip

    def _match_plan(self, number: int, attempt: int, match_id: str) -> MatchPlan:
        slot = self._slot(number)
        return slot_match_plan(self.plan, slot, slot.attempts[attempt - 1], driver=self.driver)


def slot_match_plan(
    plan: TournamentPlan, slot: SlotRecord, attempt: AttemptRecord, *, driver: str
) -> MatchPlan:
    """The match plan of one attempt at a slot, wherever it is played."""
    challenge = plan.challenges[slot.challenge]
    limits = plan.limits
    spec = Slot(slot.slot, slot.challenge, slot.trial, tuple(slot.group))
    return MatchPlan(
        challenge=challenge,
        competitors=[plan.competitors[name] for name in slot.group],
        time_limit_s=limits.time_limit_s or challenge.time_limit_s,
        drain_s=limits.drain_s,
        seed=match_seed(plan.seed, spec, attempt.seed_attempt),
        finish=limits.finish,
        driver=driver,
        match_id=attempt.match_id,
        disk_quota_mb=limits.disk_quota_mb,
        disk_inode_quota=limits.disk_inode_quota,
    )


async def plan_from_log(store: EventStore, record: TournamentRecord) -> TournamentPlan:
    """The tournament's plan rebuilt from its log (the file's text as it started), with
    its seed: `record` must be folded with `reveal_seed`."""
    assert record.seed is not None
    return parse_tournament(
        _created_text(await store.read(stream_id(record.tournament_id), limit=1)),
        record.source,
        base=Path(record.base_dir),
        seed=bytes.fromhex(record.seed),
    )


def _created_text(first: Sequence[StoredEvent]) -> str:
    data = first[0].data if first else None
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise TournamentError("the tournament log has no file text to resume from")
    return str(data["text"])
