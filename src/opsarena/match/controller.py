"""The controller: runs one match from provisioning to the closed record.

It provisions every host in parallel, runs the referee's preflight, starts every
agent at the same instant (the match clock starts then), lets the referee judge,
finishes by the rules in `match.rules`, drains the agents and removes the hosts.
Everything it learns goes into the event log first; the record is `fold_events` of
that log, never state held here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from opsarena.agents import Agent, AgentContext, AgentOutcome
from opsarena.agents.cage import ProcessCage
from opsarena.agents.clip import clip, clip_all
from opsarena.agents.competitors import Competitor
from opsarena.agents.human import done_token, operator_key, proof_holds
from opsarena.agents.registry import preflight_agent
from opsarena.agents.spec import AgentSettings, AgentSpec
from opsarena.agents.throttle import ThrottledHost
from opsarena.challenges.catalog import challenge_source, place_challenge
from opsarena.errors import (
    DiskMeasureError,
    HostError,
    LogTamperedError,
    MatchError,
    OpsArenaError,
)
from opsarena.hosts import (
    FAULT_POWER_CUT,
    DiskUse,
    Host,
    HostDriver,
    HostInfo,
    HostSpec,
    get_driver,
)
from opsarena.hosts.disk import disk_for_quota
from opsarena.hosts.image import build_image, image_for
from opsarena.match.commitment import new_nonce, reveal_problem, seed_commitment
from opsarena.match.diagnose import dump_tasks
from opsarena.match.events import (
    AgentEnded,
    AgentOutput,
    AgentStarted,
    AgentTranscript,
    AgentUsage,
    CompetitorDone,
    DiskQuotaExceeded,
    EventData,
    HostFailed,
    HostProvisioned,
    HostProvisioning,
    HostState,
    JudgingStopped,
    LedgerUpdated,
    LogTampered,
    MatchClosed,
    MatchCreated,
    MatchFinished,
    MatchResumed,
    MatchStarted,
    MilestoneSpec,
    Preflight,
    TerritorySpec,
    parse_data,
)
from opsarena.match.fold import fold_events
from opsarena.match.record import MatchRecord
from opsarena.match.rules import FinishMode, Standing, finish_reason, match_winner
from opsarena.referee.contract import agent_params, brief_for
from opsarena.referee.feedback import feedback_message
from opsarena.referee.model import Challenge
from opsarena.referee.nemesis import faults_needed, missing_faults
from opsarena.referee.referee import Referee
from opsarena.store import EventStore, chain_problems, content_digest, encode_event_data

log = logging.getLogger(__name__)

MAX_OUTPUT_BYTES = 16 * 1024
"""Longest `agent_output` chunk kept as one event (bytes of UTF-8); longer text is
clipped (`agents.clip`)."""
ENTRY_FIELD_BYTES = 32 * 1024
"""Longest string kept in an `agent_transcript` entry (bytes of UTF-8; `agents.clip`):
the llm agent's fields (at most 32 Ki characters) mostly pass whole. The gate clips a
command agent's commands and paths tighter (`agents.clip.CLIP_BYTES`)."""
DEFAULT_LOG_BUDGET_MB = 64
"""Bytes (MiB) of events one agent may add to a match's log (`MatchPlan.log_budget_mb`):
its output, transcript and usage. Past it they are counted, not stored."""

POLL_S = 0.1
"""How often the controller looks at the standings while the match runs."""
DISK_CHECK_S = 1.0
"""How often each host's disk use is measured against the quota."""
DEFAULT_INODE_QUOTA = 100_000
"""Inodes a host may create on its disk before it freezes (`MatchPlan.disk_inode_quota`):
empty files cost the machine's inodes and almost no bytes. A fresh host has used a few
hundred; the image it is built on holds about 25 000 (not counted)."""
DISK_BLIND_S = 60.0
"""A host the driver cannot measure (`HostUnavailableError`) for this long has its disk
frozen: a quota the arena cannot check is not left unenforced."""
DISK_PARTIAL_LIMIT = 5
"""Consecutive partial measurements (entries vanishing while counted) after which a
host's disk is frozen: a host that keeps its tree churning to hide from the count."""


def new_match_id() -> str:
    """A readable, unique, host-name-safe match id: UTC time plus 4 random hex digits."""
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


@dataclass
class MatchPlan:
    """Everything a match needs before it starts.

    `time_limit_s` counts from the match clock's start; `drain_s` is how long agents get
    to stop after the finish before they are terminated.
    """

    challenge: Challenge
    competitors: list[Competitor]
    time_limit_s: float
    drain_s: float = 5.0
    seed: bytes = field(default_factory=lambda: secrets.token_bytes(16))
    """Secret until the match closes: only its commitment is logged at the start."""
    nonce: bytes = field(default_factory=new_nonce)
    """The seed commitment's nonce (`match.commitment`), revealed with the seed."""
    finish: FinishMode = "first-durable"
    keep_hosts: bool = False
    driver: str = "podman"
    match_id: str = field(default_factory=new_match_id)
    provision_timeout_s: float = 120.0
    disk_quota_mb: int = 2048
    """Past this much written to its disk, a host's disk becomes read-only."""
    disk_inode_quota: int = DEFAULT_INODE_QUOTA
    """Past this many inodes created on its disk, likewise."""
    log_budget_mb: int = DEFAULT_LOG_BUDGET_MB
    """Bytes (MiB) of events each agent may add to the log; past them its events are
    counted (`agent_ended`'s `log_events_dropped`, `log_bytes_dropped`), not stored."""
    done_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    """Derives each human territory's done token (`agents.human.done_token`); held only
    by this process, never logged."""

    def done_token(self, territory: str) -> str:
        """The token `opsarena done` must prove for `territory` (printed for its person)."""
        return done_token(self.done_key, self.match_id, territory)


def resumed_plan(
    record: MatchRecord, challenge: Challenge, seed: bytes, nonce: bytes, *, driver: str
) -> MatchPlan:
    """The plan a resumed match goes on with: its limits, finish rule and quotas as its
    `match_created` logged them (quotas missing from older logs: the defaults)."""
    plan = MatchPlan(
        challenge=challenge,
        competitors=[],
        time_limit_s=record.time_limit_s,
        drain_s=record.drain_s,
        seed=seed,
        nonce=nonce,
        finish=record.finish_mode,  # type: ignore[arg-type]
        driver=driver,
        match_id=record.match_id,
    )
    if record.disk_quota_mb is not None:
        plan.disk_quota_mb = record.disk_quota_mb
    if record.disk_inode_quota is not None:
        plan.disk_inode_quota = record.disk_inode_quota
    return plan


@dataclass
class _DiskWatch:
    """What `Controller._watch_disks` knows of every host's disk: which are frozen, which
    must be, and since when each could not be measured. Decides from measurements alone
    (no I/O)."""

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


@dataclass
class _Territory:
    competitor: Competitor
    agent: Agent | None
    host: Host | None = None
    handle: ThrottledHost | None = None
    """The competitor's own handle on `host` (what its agent acts through)."""
    ctx: AgentContext | None = None
    task: asyncio.Task[None] | None = None
    ended: bool = False
    settled: bool = False
    stop_outcome: AgentOutcome | None = None
    log_bytes: int = 0
    """Bytes of events this territory's agent has added to the log."""
    log_events_dropped: int = 0
    log_bytes_dropped: int = 0


SETTLE_ERROR_WINDOWS = 3
"""How many times referee errors may restart one territory's settle window."""


class Controller:
    """Runs the match of `plan`, logging to `store`. Views follow the match by reading
    the log (`store.follow`), so they see other processes' events too."""

    def __init__(self, plan: MatchPlan, store: EventStore) -> None:
        if not plan.competitors:
            raise MatchError("a match needs at least one competitor")
        names = [c.territory for c in plan.competitors]
        if len(set(names)) != len(names):
            duplicate = next(n for n in names if names.count(n) > 1)
            raise MatchError(f"territory {duplicate!r} is given twice")
        self._setup(plan, store)

    def _setup(self, plan: MatchPlan, store: EventStore) -> None:
        self.plan = plan
        self.store = store
        self.match_id = plan.match_id
        self.driver: HostDriver = get_driver(plan.driver)
        self._lock = asyncio.Lock()
        self._started_at: float | None = None
        self._clock_offset_ms = 0
        self._abort = asyncio.Event()
        self._abort_why = ""
        self._image = (
            image_for(plan.challenge.packages, plan.challenge.image)
            if plan.challenge.packages
            else plan.challenge.image
        )
        self._territories: dict[str, _Territory] = {}
        self._closed = False
        self._finished = False
        self._judging_over = False
        self._settlers: list[asyncio.Task[None]] = []
        self._appended: dict[int, str] = {}
        self.referee = Referee(
            plan.challenge, seed=plan.seed, emit=self._referee_emit, clock=self.clock
        )

    # ---- the log -----------------------------------------------------------------

    def clock(self) -> int:
        """Milliseconds on the match clock (0 until the match starts)."""
        if self._started_at is None:
            return 0
        return self._clock_offset_ms + int((time.monotonic() - self._started_at) * 1000)

    async def _append(self, event_type: str, data: dict[str, Any]) -> None:
        async with self._lock:  # one at a time, so t_ms never goes back as seq goes up
            t_ms = self.clock()
            try:
                seq = await self.store.append(self.match_id, event_type, data, t_ms)
            except LogTamperedError as exc:
                # Rows the arena never appended sit where it writes: set them aside (kept
                # as evidence), say so in the log, and go on; a second refusal is raised.
                log.error("match %s: %s", self.match_id, exc)
                await self._quarantine(str(exc))
                t_ms = self.clock()
                seq = await self.store.append(self.match_id, event_type, data, t_ms)
            # What it wrote, remembered (32 bytes an event) to be checked at the close:
            # an edit that also redoes the chain is still found then.
            self._appended[seq] = content_digest(event_type, t_ms, data)

    async def _check_own_events(self) -> None:
        """Before the close: log `log_tampered` (`altered`) if any event this controller
        appended no longer reads as it wrote it."""
        if not self._appended:
            return
        audit = await self.store.audit(self.match_id)
        stored = {e.seq: e for e in audit.events if e.seq <= audit.last_seq}
        altered = sorted(
            seq
            for seq, digest in self._appended.items()
            if seq not in stored
            or content_digest(stored[seq].type, stored[seq].t_ms, stored[seq].data) != digest
        )
        if altered:
            shown = ", ".join(str(seq) for seq in altered[:20])
            why = f"events the arena appended were altered or removed: seq {shown}"
            log.error("match %s: %s", self.match_id, why)
            await self.emit(
                LogTampered(
                    kind="altered",
                    first_seq=altered[0],
                    rows=len(altered),
                    seqs=altered,
                    detail=why[:1000],
                )
            )

    async def _quarantine(self, why: str) -> None:
        """Move the log's forged tail aside and log `log_tampered` (inside the lock)."""
        moved = await self.store.quarantine_tail(self.match_id, why)
        if moved is None:
            return
        event = LogTampered(first_seq=moved.first_seq, rows=moved.rows, detail=why[:1000])
        await self.store.append(
            self.match_id, event.event_type, event.model_dump(mode="json"), self.clock()
        )

    async def emit(self, event: EventData) -> None:
        """Append one typed event to the log (durably)."""
        await self._append(event.event_type, event.model_dump(mode="json"))

    async def _referee_emit(self, event_type: str, data: dict[str, Any]) -> None:
        # The referee's events are typed like every other: validated against their model
        # (a bad one is a bug, raised here) and logged with every field of it.
        await self.emit(parse_data(event_type, data))
        if (
            event_type == "attempt_result"
            and data.get("verdict") == "failed"
            and self.plan.challenge.feedback
        ):
            territory = self._territories.get(str(data.get("territory")))
            if territory is not None and territory.ctx is not None and not territory.ended:
                territory.ctx.feedback.put_nowait(feedback_message(data))

    # ---- running ---------------------------------------------------------------------

    def request_abort(self, why: str) -> None:
        """End the match as `aborted` (Ctrl-C, SIGTERM); safe to call from a signal handler."""
        self._abort_why = why
        self._abort.set()

    @property
    def abort_reason(self) -> str:
        """Why the match was asked to abort (`SIGINT`, `SIGTERM`, ...); empty if it was not."""
        return self._abort_why

    async def run(self) -> MatchRecord:
        """Run the whole match and return its final record.

        Raises `MatchError` (after closing the log and removing the hosts) when hosts
        could not be provisioned or the preflight refused the match; `OpsArenaError`
        from an agent that cannot start (its configuration) before anything is made.
        """
        await self.prepare()

        async def whole_match() -> None:
            await self._create()
            failure = await self._provision_and_preflight()
            if failure is not None:
                await self._close("aborted", None)
                raise MatchError(failure)
            await self._play()

        await self._guarded(whole_match())
        return await self.record()

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

    async def prepare(self) -> None:
        """Refuse a challenge whose faults the driver lacks, build every agent and run its
        preflight (endpoint reachable, program found) before anything is made. Raises a
        one-line `OpsArenaError`. Idempotent."""
        if self._territories:
            return
        lacking = missing_faults(self.plan.challenge, self.driver.faults, self.plan.driver)
        if lacking is not None:
            raise MatchError(lacking)
        built = {c.territory: _Territory(c, c.build()) for c in self.plan.competitors}
        for territory in built.values():
            assert territory.agent is not None
            await preflight_agent(territory.agent)
        self._territories = built

    async def record(self) -> MatchRecord:
        """The match's record as the log has it now."""
        return fold_events(await self.store.read(self.match_id))

    async def _create(self) -> None:
        plan = self.plan
        # The seed is kept where only the arena reads it, so `opsarena resume` can go on;
        # the log gets the commitment, and the seed only when the match closes.
        secret = {"seed": plan.seed.hex(), "nonce": plan.nonce.hex()}
        await asyncio.to_thread(self.store.vault().put, self.match_id, secret)
        await self.emit(
            MatchCreated(
                match_id=self.match_id,
                challenge=plan.challenge.name,
                challenge_title=plan.challenge.title,
                challenge_source=challenge_source(plan.challenge),
                seed_commitment=seed_commitment(self.match_id, plan.nonce, plan.seed),
                finish_mode=plan.finish,
                time_limit_s=plan.time_limit_s,
                drain_s=plan.drain_s,
                disk_quota_mb=plan.disk_quota_mb,
                disk_inode_quota=plan.disk_inode_quota,
                milestones=[
                    MilestoneSpec(id=m.id, points=m.points, title=m.title)
                    for m in plan.challenge.milestones
                ],
                territories={
                    name: TerritorySpec(
                        agent=t.competitor.name,
                        model=(t.agent.model if t.agent else "") or t.competitor.spec.text,
                        kind=t.competitor.kind,
                    )
                    for name, t in self._territories.items()
                },
            )
        )

    async def _provision_one(self, name: str) -> str | None:
        await self.emit(HostProvisioning(territory=name))
        challenge = self.plan.challenge
        # The disk holds the quotas and a little more (the watch still sees a host go
        # over): what a host can write is bounded by construction (hosts/disk.py).
        disk_mb, inodes = disk_for_quota(self.plan.disk_quota_mb, self.plan.disk_inode_quota)
        spec = HostSpec(
            match_id=self.match_id,
            territory=name,
            image=self._image,
            # Only a challenge that cuts the power pays for a disk that can lose it.
            power_cut=FAULT_POWER_CUT in faults_needed(challenge),
            disk_mb=disk_mb,
            disk_inodes=inodes,
        )
        started = time.monotonic()
        try:
            host = await self.driver.create(spec, boot_timeout=self.plan.provision_timeout_s)
        except OpsArenaError as exc:
            await self.emit(HostFailed(territory=name, error=str(exc)))
            return f"host for {name} could not be provisioned: {exc}"
        self._territories[name].host = host
        try:
            await place_challenge(self.plan.challenge, host, self.plan.seed)
        except OpsArenaError as exc:
            await self.emit(HostFailed(territory=name, error=f"placing the challenge: {exc}"))
            return f"the challenge could not be placed on {name}'s host: {exc}"
        await self.emit(
            HostProvisioned(
                territory=name,
                host=host.name,
                provision_ms=int((time.monotonic() - started) * 1000),
            )
        )
        territory = self._territories[name]
        # The competitor's own handle on its host: capped, and held by the referee during
        # fault attempts (see ThrottledHost).
        territory.handle = ThrottledHost(host)
        self.referee.add_territory(name, host, hold=territory.handle.held)
        return None

    async def _preflight_one(self, name: str) -> str | None:
        result = await self.referee.preflight(name)
        await self.emit(Preflight(territory=name, ok=result.ok, detail=result.detail))
        return None if result.ok else f"preflight refused the match for {name}: {result.detail}"

    async def _provision_and_preflight(self) -> str | None:
        """Provision every host in parallel, then preflight each; the first problem, if any."""
        names = list(self._territories)
        if self.plan.challenge.packages and self.plan.driver == "podman":
            # Built once per recipe and cached (a label on the image), like the default.
            await build_image(self._image, extra=tuple(self.plan.challenge.packages))
        problems = await asyncio.gather(*(self._provision_one(n) for n in names))
        failures = [p for p in problems if p]
        if failures:
            return failures[0]
        if self._abort.is_set():
            return f"match aborted before it started ({self._abort_why})"
        problems = await asyncio.gather(*(self._preflight_one(n) for n in names))
        failures = [p for p in problems if p]
        return failures[0] if failures else None

    async def _play(self) -> None:
        plan = self.plan
        await self.emit(MatchStarted())
        self._started_at = time.monotonic()
        deadline = self._started_at + plan.time_limit_s
        for name, territory in self._territories.items():
            assert territory.host is not None
            territory.ctx = AgentContext(
                match_id=self.match_id,
                territory=name,
                brief=brief_for(plan.challenge, plan.seed),
                host=territory.handle or ThrottledHost(territory.host),
                deadline=deadline,
                report=self._reporter(territory),
                params=agent_params(plan.challenge, plan.seed),
            )
        for territory in self._territories.values():
            territory.task = asyncio.create_task(
                self._run_agent(territory), name=f"agent-{territory.competitor.territory}"
            )
        await self._judge()

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

    # ---- agents ----------------------------------------------------------------------

    def _reporter(self, territory: _Territory) -> Callable[[str, dict[str, Any]], Any]:
        agent_name = territory.competitor.name

        async def report(kind: str, data: dict[str, Any]) -> None:
            event: EventData
            if kind == "usage":
                event = AgentUsage(agent=agent_name, **data)
            elif kind == "output":
                text = clip(str(data.get("text", "")), MAX_OUTPUT_BYTES)
                stream = "stderr" if data.get("stream") == "stderr" else "stdout"
                event = AgentOutput(agent=agent_name, stream=stream, text=text)
            elif kind == "transcript":
                entry = clip_all(dict(data.get("entry", data)), ENTRY_FIELD_BYTES)
                event = AgentTranscript(agent=agent_name, entry=entry)
            else:
                log.warning("agent %s reported an unknown kind %r", agent_name, kind)
                return
            await self._budgeted(territory, event)

        return report

    async def _budgeted(self, territory: _Territory, event: EventData) -> None:
        """Log an agent's `event` while its agent is within its log budget; past it,
        count the event and its bytes instead (once, a last transcript entry says so).
        Raises what the store raises (the gate then refuses the request it was for)."""
        data = event.model_dump(mode="json")
        size = len(encode_event_data(event.event_type, data).encode())
        budget = self.plan.log_budget_mb * 1024 * 1024
        if territory.log_bytes + size > budget:
            if not territory.log_events_dropped:
                log.warning(
                    "agent %s: its log budget (%d MiB) is spent: its events are counted, "
                    "not stored",
                    territory.competitor.name,
                    self.plan.log_budget_mb,
                )
                entry = {
                    "kind": "log_budget_spent",
                    "budget_bytes": budget,
                    "content": "the agent's log budget is spent: its further events are "
                    "counted (agent_ended), not stored",
                }
                await self.emit(AgentTranscript(agent=territory.competitor.name, entry=entry))
            territory.log_events_dropped += 1
            territory.log_bytes_dropped += size
            return
        territory.log_bytes += size
        await self._append(event.event_type, data)

    async def _run_agent(self, territory: _Territory) -> None:
        name = territory.competitor.territory
        assert territory.ctx is not None
        assert territory.agent is not None
        # A stop that lands while agent_started is being logged must still end with
        # agent_ended after it (the log never closes on an agent left running): the
        # append runs to its end whatever happens to this task.
        started = asyncio.ensure_future(
            self.emit(AgentStarted(agent=territory.competitor.name, territory=name))
        )
        try:
            await asyncio.shield(started)
            outcome = await territory.agent.run(territory.ctx)
        except asyncio.CancelledError:
            await started
            outcome = territory.stop_outcome or AgentOutcome(
                "terminated", None, "stopped by the controller", "controller"
            )
        except Exception as exc:  # an agent's bug must not end the match
            log.exception("agent %s crashed", territory.competitor.name)
            outcome = AgentOutcome("failed", False, f"the agent crashed: {exc!r}"[:1000], "arena")
        territory.ended = True
        await self.emit(
            AgentEnded(
                agent=territory.competitor.name,
                terminal_state=outcome.terminal_state,
                successful=outcome.successful,
                terminal_detail=outcome.terminal_detail or None,
                failure_source=outcome.failure_source,
                log_events_dropped=territory.log_events_dropped,
                log_bytes_dropped=territory.log_bytes_dropped,
            )
        )
        if self._started_at is not None and not self._judging_over:
            # Judged in its own task: the drain waits for agents, never for the referee.
            self._settlers.append(asyncio.create_task(self._settle(name, territory)))

    async def _settle(self, name: str, territory: _Territory) -> None:
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

    async def _watch_done(self) -> None:
        """Answer `done_requested` events (`opsarena done`, another process): when the
        proof holds (the territory's done token, or the operator key) and the territory
        is a person's, log `competitor_done` and tell its agent. Any other request is
        refused, with a line in the arena's log and nothing in the match's."""
        operator = await asyncio.to_thread(operator_key, True)
        summary = await self.store.summary(self.match_id)
        after = summary.last_seq if summary else 0
        async for event in self.store.follow(self.match_id, after=after, poll_s=0.25):
            if event.type != "done_requested":
                continue
            if not event.link().hash_ok():  # a row that was not appended as it reads now
                log.warning("match %s seq %d fails its hash: ignored", self.match_id, event.seq)
                continue
            name = str(event.data.get("territory"))
            territory = self._territories.get(name)
            if territory is None or territory.ctx is None or territory.ctx.done.is_set():
                continue
            if territory.competitor.kind != "human":
                log.warning("refused opsarena done for %s: not a person's territory", name)
                continue
            kind, proof = event.data.get("proof_kind"), event.data.get("proof")
            secret = self.plan.done_token(name) if kind == "token" else operator
            if kind not in ("token", "operator") or secret is None:
                log.warning("refused opsarena done for %s: no such proof", name)
                continue
            if not proof_holds(proof, secret, self.match_id, name):
                log.warning("refused opsarena done for %s: the proof does not hold", name)
                continue
            by = str(event.data.get("by") or "a person")
            if kind == "operator":
                by = f"{by} (operator)"
            await self.emit(CompetitorDone(territory=name, by=by))
            territory.ctx.params["done_by"] = by
            territory.ctx.done.set()

    async def _watch_disks(self) -> None:
        """Every `DISK_CHECK_S`, freeze the disk of any host over its byte or inode quota,
        or that cannot be measured: a competitor filling its disk (or the machine's
        inodes) fails alone and never fills the machine. Fails closed: a count that
        fails or times out freezes at once (`DiskMeasureError`: the host's own tree
        decides it); a host the driver cannot look at for `DISK_BLIND_S`, or whose
        counts stay partial `DISK_PARTIAL_LIMIT` times in a row, is frozen too. A
        freeze that fails (the host is rebooting) is tried again at the next check."""
        watch = _DiskWatch(
            byte_quota=self.plan.disk_quota_mb * 2**20, inode_quota=self.plan.disk_inode_quota
        )
        while True:
            checks = [
                self._check_disk(name, territory.host, watch)
                for name, territory in self._territories.items()
                if territory.host is not None and name not in watch.frozen
            ]
            for failed in await asyncio.gather(*checks, return_exceptions=True):
                if isinstance(failed, Exception):  # an arena bug: the other hosts go on
                    log.error("disk check failed: %r", failed)
            await asyncio.sleep(DISK_CHECK_S)

    async def _check_disk(self, name: str, host: Host, watch: _DiskWatch) -> None:
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
        await self.emit(verdict)

    async def _drain(self, reason: str) -> None:
        running = [
            t for t in self._territories.values() if t.task is not None and not t.task.done()
        ]
        if not running:
            return
        tasks = [t.task for t in running if t.task is not None]
        if reason != "aborted":
            await asyncio.wait(tasks, timeout=self.plan.drain_s)
        detail = (
            f"match aborted ({self._abort_why})"
            if reason == "aborted"
            else "post-match drain deadline expired"
        )
        for territory in running:
            if territory.task is not None and not territory.task.done():
                territory.stop_outcome = AgentOutcome("terminated", None, detail, "controller")
                territory.task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- resuming after the controller was killed --------------------------------------

    @classmethod
    async def resume(
        cls,
        store: EventStore,
        record: MatchRecord,
        challenge: Challenge,
        *,
        driver: str = "podman",
    ) -> MatchRecord:
        """Continue `record`'s unfinished match from its log (a controller died).

        With every host still there, the referee takes up where it stopped (attempts and
        passed milestones restored, the match clock going on from the last event) and the
        match finishes by its rules. Agents cannot be resumed (their process and state
        died with the controller): each that was running ends `interrupted` with a
        `terminal_detail` saying so, and its territory gets its final verification.
        When a host is gone, or the match had not started, the match is aborted and
        counted as an infrastructure failure. Raises `MatchError` for a closed match.
        """
        if record.match_state == "finished":
            raise MatchError(f"match {record.match_id} is finished already: opsarena show it")
        seed, nonce = await cls._vaulted_seed(store, record)
        plan = resumed_plan(record, challenge, seed, nonce, driver=driver)
        self = cls.__new__(cls)
        self._setup(plan, store)
        for name, territory in record.territories.items():
            agent = record.agents[territory.agent]
            spec = AgentSpec(agent.kind, "", agent.kind)
            self._territories[name] = _Territory(
                Competitor(name, territory.agent, spec, AgentSettings()), None
            )
            self._territories[name].ended = not agent.running
        await self.emit(MatchResumed())
        await self._guarded(self._resume(record))
        return await self.record()

    @staticmethod
    async def _vaulted_seed(store: EventStore, record: MatchRecord) -> tuple[bytes, bytes]:
        """The seed and nonce of `record`'s match from the vault, checked against the
        commitment; a log from before commitments has its seed in the record."""
        if record.seed_commitment is None and record.seed is not None:
            return bytes.fromhex(record.seed), b""
        vault = store.vault()
        secret = await asyncio.to_thread(vault.get, record.match_id)
        if secret is None:
            raise MatchError(
                f"match {record.match_id}: its seed is not in the vault {vault.where}, "
                "so the referee cannot go on; it cannot be resumed"
            )
        problem = reveal_problem(
            record.match_id,
            record.seed_commitment or "",
            secret.get("seed", ""),
            secret.get("nonce", ""),
        )
        if problem is not None:
            raise MatchError(f"match {record.match_id}: the vault's seed is wrong: {problem}")
        return bytes.fromhex(secret["seed"]), bytes.fromhex(secret["nonce"])

    @staticmethod
    async def repair_log(store: EventStore, match_id: str) -> None:
        """Before resuming: move a forged tail of the log aside (logging `log_tampered`)
        and refuse, with `MatchError` naming the first bad seq, a log whose chain is
        broken below events the arena appended after it (the record cannot be trusted)."""
        moved = await store.quarantine_tail(match_id, "found by opsarena resume")
        if moved is not None:
            summary = await store.summary(match_id)
            event = LogTampered(
                first_seq=moved.first_seq,
                rows=moved.rows,
                detail=f"rows from seq {moved.first_seq} were not appended by the arena",
            )
            await store.append(
                match_id,
                event.event_type,
                event.model_dump(mode="json"),
                summary.last_t_ms if summary else 0,
            )
        audit = await store.audit(match_id)
        problems = chain_problems([e.link() for e in audit.events], last_seq=audit.last_seq)
        if problems:
            first = problems[0]
            raise MatchError(
                f"match {match_id}: the event log is broken at seq {first.seq} ({first.what}), "
                f"below events appended after it; the record cannot be trusted, so it is not "
                f"resumed: opsarena verify {match_id}"
            )

    async def _resume(self, record: MatchRecord) -> None:
        self._clock_offset_ms = record.elapsed_ms
        self._started_at = time.monotonic() if record.started_at is not None else None
        why = "the controller was killed; the agent could not be resumed"
        hosts = {info.territory: info for info in await self.driver.list(match_id=self.match_id)}
        if record.match_state in ("finishing", "draining") or record.finish_reason:
            await self._finish_draining(record, hosts, why)
            return
        lost = []
        for name, territory in self._territories.items():
            info = hosts.get(name)
            if record.territories[name].state == "pending":
                continue  # never provisioned: closing makes it "not-provisioned"
            if info is None or record.territories[name].state in ("provisioning", "failed"):
                lost.append(name)
                continue
            territory.host = await self.driver.get(info.name)
        ready = await asyncio.gather(
            *(
                self._ready_again(n, t.host, rebooting=record.territories[n].state == "rebooting")
                for n, t in self._territories.items()
                if t.host
            ),
        )
        lost += [name for name in ready if name]
        for name, territory in self._territories.items():
            # Killed mid-reboot: the log says "rebooting"; the host is up again now.
            if (
                name not in lost
                and territory.host
                and record.territories[name].state == "rebooting"
            ):
                await self.emit(HostState(territory=name, state="ready"))
        if record.started_at is None or lost:
            self._abort_why = (
                f"hosts lost while the controller was down: {', '.join(sorted(lost))}"
                if lost
                else "the controller was killed before the match started"
            )
            for name in lost:
                state = record.territories[name].state
                if state == "provisioning":
                    error = "the controller was killed while it provisioned this host"
                    await self.emit(HostFailed(territory=name, error=error))
                elif state not in ("failed", "removed", "lost"):
                    await self.emit(HostState(territory=name, state="lost"))
                self._territories[name].host = None
            await self._end_agents(record, "interrupted", why, "arena")
            await self._close("aborted", None)
            # A host half-made when the controller died is in no territory: remove it too.
            await self.driver.cleanup(match_id=self.match_id)
            return
        for name, territory in self._territories.items():
            assert territory.host is not None
            self.referee.add_territory(name, territory.host)
            for milestone_id, milestone in record.territories[name].milestones.items():
                self.referee.restore(
                    name,
                    milestone_id,
                    attempts=milestone.attempts,
                    passed=milestone.passed,
                    points=milestone.points,
                    evidence=milestone.evidence,
                    passed_at_ms=milestone.passed_at_ms,
                )
        updates: dict[str, list[Any]] = {}
        for event in await self.store.read(self.match_id):
            if event.type == "ledger_update":
                data = parse_data(event.type, event.data)
                assert isinstance(data, LedgerUpdated)
                updates.setdefault(data.territory, []).append(data.to_update())
        for name, territory_updates in updates.items():
            if name in self._territories:
                self.referee.restore_ledger(name, territory_updates)
        await self._end_agents(record, "interrupted", why, "arena")
        for name, territory in self._territories.items():
            territory.ended = True
            self._settlers.append(asyncio.create_task(self._settle(name, territory)))
        await self._judge()

    async def _finish_draining(
        self, record: MatchRecord, hosts: dict[str, HostInfo], why: str
    ) -> None:
        """The winner was decided before the controller died: end the agents, remove
        every host the log still shows up, and close with the logged verdict."""
        self._finished = True
        await self._end_agents(record, "terminated", why, "controller")
        for name, territory in self._territories.items():
            if record.territories[name].state not in ("ready", "rebooting"):
                continue
            info = hosts.get(name)
            if info is None:  # gone without a logged removal
                await self.emit(HostState(territory=name, state="lost"))
            else:
                territory.host = await self.driver.get(info.name)
        await self._close(record.finish_reason or "aborted", record.winner)
        # A container the log had already let go of (lost, say) is removed too.
        await self.driver.cleanup(match_id=self.match_id)

    async def _ready_again(self, name: str, host: Host | None, *, rebooting: bool) -> str | None:
        """None when `host` is ready within 60 s; else `name` (it is lost). A host the log
        says the referee was rebooting (a fault the killed controller cut off midway may
        have left it stopped) is brought back first."""
        assert host is not None
        try:
            if rebooting:
                await host.boot_again(60.0)
            else:
                await host.wait_ready(60.0)
        except OpsArenaError:
            return name
        return None

    async def _end_agents(self, record: MatchRecord, state: str, detail: str, source: str) -> None:
        """Log the end of every agent still running in `record`, after killing whatever
        the dead controller's agent programs left running (their cgroups outlive it)."""
        for cage in await asyncio.to_thread(ProcessCage.of_match, self.match_id):
            await asyncio.to_thread(cage.remove)
        for agent_name, agent in record.agents.items():
            if agent.running:
                await self.emit(
                    AgentEnded(
                        agent=agent_name,
                        terminal_state=state,
                        successful=None,
                        terminal_detail=detail,
                        failure_source=source,
                    )
                )

    # ---- the end -----------------------------------------------------------------------

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

    async def _release_hosts(self) -> None:
        async def release(name: str, host: Host) -> None:
            if self.plan.keep_hosts:
                await self.emit(HostState(territory=name, state="kept"))
                return
            try:
                await self.driver.remove(host.name)
            except HostError as exc:
                log.warning("could not remove %s: %s", host.name, exc)
                await self.emit(HostState(territory=name, state="lost"))
                return
            await self.emit(HostState(territory=name, state="removed"))

        await asyncio.gather(
            *(release(n, t.host) for n, t in self._territories.items() if t.host is not None)
        )
