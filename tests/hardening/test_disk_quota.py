"""A competitor that fills its disk fails alone: the arena freezes its disk at the quota.

A host's root filesystem is an overlay on the machine's own disk, with no size limit
podman can set on ext4. The controller measures each host's writable layer every
second and makes it read-only past the match's disk quota (docs/RELIABILITY.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opsarena.agents import Agent, AgentContext, AgentOutcome
from opsarena.agents.competitors import competitor_from_cli
from opsarena.agents.registry import register_agent_kind
from opsarena.challenges.catalog import find_challenge
from opsarena.match.controller import Controller, MatchPlan
from opsarena.store import SqliteEventStore
from tests.conftest import new_match_id

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
