"""The controller before the match starts and after it ends: `match_created`, every host
provisioned in parallel with the challenge placed on it, the referee's preflight, and the
hosts removed (or kept) at the close."""

from __future__ import annotations

import asyncio
import logging
import time

from opsarena.agents.registry import preflight_agent
from opsarena.agents.throttle import ThrottledHost
from opsarena.challenges.catalog import challenge_source, place_challenge
from opsarena.errors import HostError, MatchError, OpsArenaError
from opsarena.hosts import Host, HostSpec
from opsarena.hosts.disk import disk_for_quota
from opsarena.match.commitment import seed_commitment
from opsarena.match.core import ControllerBase, Territory
from opsarena.match.events import (
    HostFailed,
    HostProvisioned,
    HostProvisioning,
    HostState,
    MatchCreated,
    MilestoneSpec,
    Preflight,
    TerritorySpec,
)
from opsarena.referee.nemesis import missing_faults, needs_power_cut_disk

log = logging.getLogger(__name__)


class Provisioning(ControllerBase):
    """Agents built and checked, hosts made and checked, hosts released."""

    async def prepare(self) -> None:
        """Refuse a challenge whose faults the driver lacks, build every agent and run its
        preflight (endpoint reachable, program found) before anything is made. Raises a
        one-line `OpsArenaError`. Idempotent."""
        if self._territories:
            return
        lacking = missing_faults(self.plan.challenge, self.driver.faults, self.plan.driver)
        if lacking is not None:
            raise MatchError(lacking)
        built = {c.territory: Territory(c, c.build()) for c in self.plan.competitors}
        for territory in built.values():
            assert territory.agent is not None
            await preflight_agent(territory.agent)
        self._territories = built

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

    def host_spec(self, territory: str) -> HostSpec:
        """What the host of `territory` is made as: the challenge's image, a disk bounded
        by the quotas, and a disk that can lose power only when a fault of the challenge
        needs one (`referee.nemesis.needs_power_cut_disk`)."""
        # The disk holds the quotas and a little more (the watch still sees a host go
        # over): what a host can write is bounded by construction (hosts/disk.py).
        disk_mb, inodes = disk_for_quota(self.plan.disk_quota_mb, self.plan.disk_inode_quota)
        return HostSpec(
            match_id=self.match_id,
            territory=territory,
            image=self._image,
            power_cut=needs_power_cut_disk(self.plan.challenge),
            disk_mb=disk_mb,
            disk_inodes=inodes,
        )

    async def _provision_one(self, name: str) -> str | None:
        await self.emit(HostProvisioning(territory=name))
        spec = self.host_spec(name)
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
        if self.plan.challenge.packages:
            await self.driver.prepare_image(self._image, tuple(self.plan.challenge.packages))
        problems = await asyncio.gather(*(self._provision_one(n) for n in names))
        failures = [p for p in problems if p]
        if failures:
            return failures[0]
        if self._abort.is_set():
            return f"match aborted before it started ({self._abort_why})"
        problems = await asyncio.gather(*(self._preflight_one(n) for n in names))
        failures = [p for p in problems if p]
        return failures[0] if failures else None

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
