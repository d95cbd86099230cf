"""Hostile competitors, from inside their hosts: no way out, and no way to starve others.

Isolation is shown without sending traffic anywhere but loopback: route lookups (which
send nothing) fail for every non-loopback address, and what another host, the arena's
event log and a server on the arena's loopback hold is absent from inside a host.
Attacks (fork bomb, memory hog, filling /tmp) run in a host of their own while a full
referee judges it and a neighbour; the neighbour's attempts must stay at the cadence.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from opsarena.challenges import Challenge, builtin_challenge
from opsarena.hosts import Host
from opsarena.store import open_store
from tests.conftest import SharedHosts
from tests.hardening.hostile import (
    Attack,
    neighbour_under_attack,
    percentile,
    start_hostile_server,
)

pytestmark = pytest.mark.hosts

ATTACK_S = 8.0
WARMUP_S = 2.0
CADENCE_SLACK_S = 0.5
"""A neighbour's attempts may drift this far past the cadence during an attack."""
LOOP_LAG_BOUND_S = 0.5
"""The arena's event loop (controller and referee) may wake this late, at worst."""

FORK_BOMB = "bomb() { bomb | bomb & }; bomb; sleep 3600"  # killed, with its group, at the timeout
MEMORY_HOG = (
    "for i in $(seq 40); do python3 -c 'a = []\nwhile True: a.append(bytearray(2**24))'; "
    'echo "hog exit $?"; done'
)
TMP_FILL = 'head -c 2G /dev/zero > /tmp/fill; echo "fill exit $?"; ls -l /tmp/fill'


@pytest.fixture(scope="module")
def challenge() -> Challenge:
    return builtin_challenge("durable-records")


@pytest.fixture(scope="module")
async def neighbour(shared_hosts: SharedHosts, challenge: Challenge) -> AsyncIterator[Host]:
    """A host whose service answers at once (and fails write-read every time, so the
    referee attempts it at every cadence)."""
    host = await shared_hosts("neighbour")
    await start_hostile_server(host, {"healthy": challenge.port}, unit="builder-app")
    yield host


# ---- isolation -----------------------------------------------------------------------


async def sh(host: Host, script: str, timeout: float = 30.0) -> tuple[int, str]:
    result = await host.exec(script, timeout=timeout)
    return result.exit_code, (result.stdout + result.stderr).decode(errors="replace")


async def test_a_host_has_no_route_to_any_network(shared_hosts: SharedHosts) -> None:
    host = await shared_hosts("a")
    code, links = await sh(host, "ls /sys/class/net")
    assert (code, links.split()) == (0, ["lo"])
    code, routes = await sh(host, "ip -4 route show; ip -6 route show")
    assert (code, routes.strip()) == (0, "")
    # Route lookups only: nothing is sent. The podman bridge, private ranges, public.
    for address in ("10.88.0.1", "172.17.0.1", "192.168.1.1", "8.8.8.8", "2001:db8::1"):
        code, said = await sh(host, f"ip route get {address}")
        assert code != 0 and "Network is unreachable" in said, (address, said)


async def test_another_hosts_service_and_files_are_out_of_reach(
    shared_hosts: SharedHosts, challenge: Challenge
) -> None:
    mine, theirs = await shared_hosts("a"), await shared_hosts("b")
    marker = f"marker-{secrets.token_hex(8)}"
    assert (await theirs.exec(f"touch /root/{marker}", timeout=10)).ok
    await start_hostile_server(theirs, {"healthy": challenge.port}, unit="b-service")
    _reader, writer = await theirs.connect(challenge.port)  # it does listen, in its host
    writer.close()

    code, said = await sh(mine, f"curl -sS --max-time 3 http://127.0.0.1:{challenge.port}/")
    assert code == 7 and "Couldn't connect" in said  # host a's own loopback: nothing
    code, found = await sh(mine, f"find / -xdev -name {marker} 2>/dev/null; true", timeout=60)
    assert found.strip() == ""


async def test_the_arena_event_log_and_processes_are_invisible(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    host = await shared_hosts("a")
    db_name = f"arena-{secrets.token_hex(8)}.db"
    store = open_store(tmp_path / db_name)
    try:
        await store.append("hardening", "match_created", {"probe": True}, 0)
        _code, found = await sh(host, f"find / -xdev -name '{db_name}*' 2>/dev/null; true", 60)
        assert found.strip() == ""
        _code, mounts = await sh(host, "cat /proc/self/mountinfo")
        assert str(tmp_path) not in mounts and db_name not in mounts
        _code, pids = await sh(host, "ls /proc | grep -c '^[0-9]'")
        # Only the host's own processes: its init and a few daemons, not the machine's.
        assert int(pids.strip()) < 60
        _code, arena = await sh(
            host, f"test -e /proc/{os.getpid()}/cmdline && cat /proc/{os.getpid()}/cmdline; true"
        )
        assert "pytest" not in arena and "python" not in arena.split("\0")[0]
    finally:
        store.close()


async def test_a_server_on_the_arena_loopback_is_not_reachable(shared_hosts: SharedHosts) -> None:
    """The scoreboard (`opsarena serve`) listens on the arena's 127.0.0.1; a host's
    127.0.0.1 is its own."""
    host = await shared_hosts("a")
    accepted = 0

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_server(count, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        code, said = await sh(host, f"curl -sS --max-time 3 http://127.0.0.1:{port}/")
        assert code == 7 and "Couldn't connect" in said
        assert accepted == 0
    finally:
        server.close()
        await server.wait_closed()


# ---- attacks -------------------------------------------------------------------------


def assert_unaffected(challenge: Challenge, attack: Attack) -> None:
    assert attack.neighbour_reasons <= {None, "record_corrupted"}, attack.neighbour_reasons
    assert len(attack.intervals) >= ATTACK_S - 3, attack.intervals
    assert percentile(attack.intervals, 99) < challenge.cadence_s + CADENCE_SLACK_S, attack
    assert attack.lag.worst < LOOP_LAG_BOUND_S, attack.lag.worst
    assert attack.execs and max(attack.execs) < 5.0, attack.execs


async def test_a_fork_bomb_leaves_the_neighbour_and_the_arena_unaffected(
    shared_hosts: SharedHosts, neighbour: Host, challenge: Challenge
) -> None:
    attacker = await shared_hosts("bomb", pids_limit=512)
    attack = await neighbour_under_attack(
        attacker, neighbour, challenge, FORK_BOMB, attack_s=ATTACK_S, warmup_s=WARMUP_S
    )
    assert attack.peak_processes > 400, attack.peak_processes  # it hit the pids limit
    assert_unaffected(challenge, attack)


async def test_a_memory_hog_leaves_the_neighbour_and_the_arena_unaffected(
    shared_hosts: SharedHosts, neighbour: Host, challenge: Challenge
) -> None:
    attacker = await shared_hosts("hog", memory_mb=256)
    attack = await neighbour_under_attack(
        attacker, neighbour, challenge, MEMORY_HOG, attack_s=ATTACK_S, warmup_s=WARMUP_S
    )
    assert "hog exit 137" in attack.printed or "host error" in attack.printed, attack.printed
    assert_unaffected(challenge, attack)


async def test_filling_tmp_is_bounded_by_the_hosts_memory_and_hurts_only_that_host(
    shared_hosts: SharedHosts, neighbour: Host, challenge: Challenge
) -> None:
    """/tmp and /run are tmpfs, charged to the host's memory limit: a fill stops far
    short of its 2 GiB (the writer, or the host's whole init, is killed by the host's
    own OOM killer). The neighbour keeps its cadence."""
    attacker = await shared_hosts("filler", memory_mb=256)
    attack = await neighbour_under_attack(
        attacker, neighbour, challenge, TMP_FILL, attack_s=ATTACK_S, warmup_s=WARMUP_S
    )
    assert "fill exit 0" not in attack.printed, attack.printed
    assert_unaffected(challenge, attack)
