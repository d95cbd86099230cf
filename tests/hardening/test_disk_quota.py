"""A competitor that fills its disk fails alone: the arena freezes its disk at the quota.

A host's root filesystem is an overlay on an ext4 of its own, a little larger than the
match's quotas (`hosts/disk.py`): that bounds it by construction. The controller still
measures each host's writable layer every second, bytes and inodes, and makes it
read-only past the match's disk quota or inode quota, or when it cannot be measured
(docs/RELIABILITY.md).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from opsarena.agents import Agent, AgentContext, AgentOutcome
from opsarena.agents.competitors import competitor_from_cli
from opsarena.agents.registry import register_agent_kind
from opsarena.challenges.catalog import find_challenge
from opsarena.errors import DiskMeasureError
from opsarena.hosts import DiskUse, get_driver
from opsarena.hosts import podman as podman_driver
from opsarena.match.controller import Controller, MatchPlan
from opsarena.store import SqliteEventStore
from tests.conftest import HostFactory, new_match_id

pytestmark = pytest.mark.hosts

CAP_MB = 3000
FILL = (
    f"for i in $(seq {CAP_MB // 10}); do "
    "dd if=/dev/zero of=/var/lib/fill.$i bs=1M count=10 status=none || break; done; "
    "du -sm /var/lib | cut -f1"
)


class DiskFiller(Agent):
    """Writes 10 MB files under /var until the disk refuses (or 3 GB), and reports
    how much it managed to write."""

    model = "disk-filler"

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        result = await ctx.host.exec(FILL, timeout=120)
        return AgentOutcome("completed", True, f"wrote {result.stdout.decode().strip()} MB")


register_agent_kind("test-disk-filler", lambda spec, settings, env: DiskFiller(), arg=None)


async def test_a_disk_filler_is_frozen_at_its_quota_and_its_neighbour_wins(tmp_path: Path) -> None:
    plan = MatchPlan(
        challenge=find_challenge("durable-records"),
        competitors=[
            competitor_from_cli("filler", "test-disk-filler"),
            competitor_from_cli("good", "scripted:reference"),
        ],
        time_limit_s=120,
        finish="all",
        match_id=new_match_id("m"),
        disk_quota_mb=64,
    )
    with SqliteEventStore(tmp_path / "log.db") as store:
        record = await Controller(plan, store).run()
        events = await store.read(plan.match_id)

    frozen = [e.data for e in events if e.type == "disk_quota_exceeded"]
    assert [f["territory"] for f in frozen] == ["filler"]
    assert frozen[0]["used_bytes"] > 64 * 2**20 == frozen[0]["quota_bytes"]
    written_mb = int(record.agents["filler"].terminal_detail.split()[1])  # type: ignore[union-attr]
    print(f"filler wrote {written_mb} MB before its disk froze (quota 64 MiB)")
    assert written_mb < CAP_MB / 2, "the filler was stopped well before its 3 GB"
    assert record.territories["filler"].disk_frozen_at_ms is not None
    assert record.territories["good"].durable_at_ms is not None
    assert record.winner == "good"
    assert record.territories["good"].disk_frozen_at_ms is None


INODE_QUOTA = 3000
MAX_FILES = 200_000
INODE_FILL = (
    "mkdir -p /var/lib/fill && cd /var/lib/fill && "
    f"for i in $(seq {MAX_FILES // 1000}); do "
    'seq -f "$i-%g" 1000 | xargs touch 2>/dev/null || break; done; '
    "ls -f | wc -l"
)


class InodeFiller(Agent):
    """Creates empty files (a byte quota never sees them) as fast as it can, up to
    200 000, and reports how many it made."""

    model = "inode-filler"

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        result = await ctx.host.exec(INODE_FILL, timeout=120)
        return AgentOutcome("completed", True, f"made {result.stdout.decode().strip()} files")


register_agent_kind("test-inode-filler", lambda spec, settings, env: InodeFiller(), arg=None)


async def test_an_inode_filler_and_an_unmeasurable_host_are_frozen_and_the_neighbour_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team: 200 000 empty files cost about 5 MB, far under any byte quota, but as
    many of the machine's inodes; and a host whose count fails or times out used to be
    skipped for good. Here the filler is frozen past its inode quota (3000), and `blind`,
    whose every count fails as a count past its time does, is frozen at the first one.
    Both disks are really read-only; the neighbour is untouched and wins."""
    real_disk_use = podman_driver.PodmanHost.disk_use

    async def disk_use(self: podman_driver.PodmanHost) -> DiskUse:
        if self.territory == "blind":
            raise DiskMeasureError(f"counting the disk of {self.name} (-B1) took over 30s")
        return await real_disk_use(self)

    monkeypatch.setattr(podman_driver.PodmanHost, "disk_use", disk_use)
    plan = MatchPlan(
        challenge=find_challenge("durable-records"),
        competitors=[
            competitor_from_cli("filler", "test-inode-filler"),
            competitor_from_cli("blind", "scripted:idle"),
            competitor_from_cli("good", "scripted:reference"),
        ],
        time_limit_s=120,
        finish="all",
        match_id=new_match_id("m"),
        disk_inode_quota=INODE_QUOTA,
        keep_hosts=True,
    )
    driver = get_driver("podman")
    try:
        with SqliteEventStore(tmp_path / "log.db") as store:
            record = await Controller(plan, store).run()
            events = await store.read(plan.match_id)
        frozen = {e.data["territory"]: e.data for e in events if e.type == "disk_quota_exceeded"}
        assert sorted(frozen) == ["blind", "filler"], frozen
        filler = frozen["filler"]
        assert filler["reason"] == "inodes" and filler["inode_quota"] == INODE_QUOTA
        assert filler["used_inodes"] > INODE_QUOTA
        assert filler["used_bytes"] < 64 * 2**20, "far under any byte quota"
        assert "inodes used, over the quota of 3000" in filler["detail"]
        blind = frozen["blind"]
        assert blind["reason"] == "unmeasured" and "took over 30s" in blind["detail"]
        made = int(record.agents["filler"].terminal_detail.split()[1])  # type: ignore[union-attr]
        print(f"filler made {made} files before its disk froze (inode quota {INODE_QUOTA})")
        assert made < MAX_FILES, "the filler was stopped before it made them all"
        assert "over the quota of 3000" in (record.territories["filler"].disk_frozen_detail or "")
        assert record.territories["good"].disk_frozen_at_ms is None
        assert record.winner == "good"
        for territory in ("filler", "blind"):
            host = await driver.get(driver.host_name(plan.match_id, territory))
            wrote = await host.exec("touch /var/lib/after-the-freeze", timeout=30)
            assert wrote.exit_code != 0 and b"Read-only file system" in wrote.stderr, territory
    finally:
        await asyncio.shield(driver.cleanup(match_id=plan.match_id))


async def test_disk_use_counts_inodes_and_a_count_past_its_time_is_an_error(
    host_factory: HostFactory,
) -> None:
    """The driver's side of failing closed: empty files show as inodes (and hardly as
    bytes), and a count that runs past its time raises `DiskMeasureError` (the host's
    own tree made it slow), not an error the controller would wait out."""
    host = await host_factory("many")
    before = await host.disk_use()
    made = await host.exec(
        "mkdir /var/lib/many && cd /var/lib/many && seq 100000 | xargs touch", timeout=300
    )
    assert made.ok, made.stderr
    after = await host.disk_use()
    assert after.inodes >= before.inodes + 100_000
    assert after.bytes - before.bytes < 8 * 2**20
    with pytest.raises(DiskMeasureError, match="took over"):
        await host.disk_use(within=0.001)  # below one count's time
