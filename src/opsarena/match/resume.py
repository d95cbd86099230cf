"""The controller resumed: a match whose controller was killed goes on from its log
(`opsarena resume`), or is closed as aborted when it cannot."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from opsarena.agents.competitors import Competitor
from opsarena.agents.spec import AgentSettings, AgentSpec
from opsarena.errors import MatchError, OpsArenaError
from opsarena.hosts import Host, HostInfo
from opsarena.hosts.registry import DEFAULT_DRIVER
from opsarena.match.closing import Closing
from opsarena.match.commitment import reveal_problem
from opsarena.match.core import Territory
from opsarena.match.events import (
    HostFailed,
    HostState,
    LedgerUpdated,
    LogTampered,
    MatchResumed,
    parse_data,
)
from opsarena.match.plan import resumed_plan
from opsarena.match.record import MatchRecord
from opsarena.referee.model import Challenge
from opsarena.store import EventStore, chain_problems


class Resuming(Closing):
    """`Controller.resume` and `Controller.repair_log`."""

    @classmethod
    async def resume(
        cls,
        store: EventStore,
        record: MatchRecord,
        challenge: Challenge,
        *,
        driver: str = DEFAULT_DRIVER,
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
            self._territories[name] = Territory(
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
