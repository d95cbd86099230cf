"""Red team, the referee's fault rounds (issue 23, item 2): a service that is durable only
while it thinks the referee is about to cut the power must not reach durable.

The fault round used to open with a recognisable signature: PUTs in a row with no GET
between (text, binary, empty, 1 MiB, an overwrite), then two PUT streams, then the fault.
A service that acknowledged after a plain write + rename with nothing fsynced, except for
15 s after that signature (then `sync()` and an fsync before each ack), scored 100 on
crash-safe-records. Each cheater here (tests/security/data/cheater_server.py) keys on
one observable feature of the referee's traffic: that signature, an empty or 1 MiB body,
two PUTs in flight at once, a PUT to an id already stored; and one that makes every
write durable as soon as the next request arrives (a `sync()` before handling it), which
traffic that goes on during the fault always rescued. The round now is seeded
traffic like write-read's (fresh records of random sizes, read-backs, GETs of old records
and of ids never written; the required kinds at seeded places inside it), and the fault
comes at a seeded moment after some of its PUTs were acknowledged: early more often than
late, sometimes not at all (a decoy round), and in half the rounds the traffic falls
silent at that acknowledgement until the fault is over. Whatever a cheater keys on, some
acknowledged writes usually come before it.

Each cheater runs on one power-cut host (one after the other, its records wiped), judged
by a fresh referee on crash-safe-records: every milestone up to the power cut passes (the
page cache keeps its files), and then `ATTEMPTS` power-cut attempts in a row all fail
with a lost or corrupted record after the power cut. Before the change the signature,
body and overwrite cheaters passed their first power-cut attempt and were durable (the
concurrent one was caught: the old opening PUTs came one at a time).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from opsarena.challenges import Challenge, builtin_challenge
from opsarena.challenges.catalog import place_challenge
from opsarena.hosts import Host, HostSpec, get_driver
from tests.conftest import TEST_IMAGE, new_match_id
from tests.referee.conftest import EventLog, make_referee

pytestmark = pytest.mark.hosts

CHEATER = Path(__file__).parent / "data" / "cheater_server.py"
UNIT = """[Unit]
Description=records service (durable only when it thinks it is watched)

[Service]
ExecStart=/usr/bin/python3 /opt/cheat/server.py --trigger {trigger}
Restart=always
RestartSec=0.1

[Install]
WantedBy=multi-user.target
"""
DEPLOY = """set -e
systemctl stop builder-app.service 2>/dev/null || true
rm -rf /var/lib/cheat
systemctl daemon-reload
systemctl enable --now builder-app.service
for i in $(seq 100); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health')" \
    2>/dev/null && break
  sleep 0.1
done
sync
"""
ATTEMPTS = 3
"""Power-cut attempts in a row that must all fail (the first runs one round, the later
ones the confirmation rounds)."""


@pytest.fixture(scope="module")
async def cut_host() -> AsyncIterator[Host]:
    driver = get_driver("podman")
    match_id = new_match_id("ru")
    try:
        host = await driver.create(
            HostSpec(match_id=match_id, territory="cheat", image=TEST_IMAGE, power_cut=True)
        )
        await host.write_file("/opt/cheat/server.py", CHEATER.read_bytes())
        yield host
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))


async def deploy(host: Host, trigger: str) -> None:
    await host.write_file(
        "/etc/systemd/system/builder-app.service", UNIT.format(trigger=trigger).encode()
    )
    result = await host.exec(DEPLOY, timeout=60)
    assert result.ok, result.stderr[-500:]


@pytest.mark.parametrize("trigger", ["signature", "body", "concurrent", "overwrite", "next"])
async def test_a_service_durable_only_when_it_thinks_it_is_watched_never_reaches_durable(
    cut_host: Host, trigger: str
) -> None:
    challenge: Challenge = builtin_challenge("crash-safe-records")
    seed = f"unpredictable-{trigger}".encode()
    await place_challenge(challenge, cut_host, seed)
    await deploy(cut_host, trigger)
    log = EventLog()
    referee = make_referee(challenge, log, seed=seed)
    referee.add_territory("cheat", cut_host)

    while (milestone := referee.first_unpassed("cheat")) is not None and milestone.id != (
        "power-cut"
    ):
        verdict = await referee.evaluate_next("cheat")
        assert verdict is not None and verdict.outcome == "passed", verdict

    cuts = []
    while len(cuts) < ATTEMPTS and (verdict := await referee.evaluate_next("cheat")) is not None:
        cuts.append(verdict)
    assert not referee.is_durable("cheat"), f"durable after {[v.evidence for v in cuts]}"
    for verdict in cuts:
        assert verdict.outcome == "failed", verdict
        assert verdict.failure_reason in ("record_missing", "record_corrupted"), verdict
        assert "after the power cut, the ledger re-read" in (verdict.failure_detail or "")
    assert referee.infrastructure_failures == 0
    summary = referee.ledger_summary("cheat")
    assert summary.lost + summary.corrupted >= ATTEMPTS
