"""hardened-service: its pure judges of kernel facts, and its calibration matrix on real
hosts."""

from __future__ import annotations

import sys
import time
from types import ModuleType

import pytest

from opsarena.agents.base import AgentContext
from opsarena.agents.scripted import get_scripted
from opsarena.challenges import builtin_challenge
from opsarena.challenges.catalog import place_challenge
from opsarena.challenges.setup import agent_params, brief_for
from opsarena.referee.failures import table_for
from tests.conftest import HostFactory
from tests.referee.conftest import EventLog, make_referee

PASS = "passed"
SEED = b"hardened-calibration-seed"

MATRIX: dict[str, list[str]] = {
    "reference": [PASS] * 6,
    "hardened-root": [PASS, PASS, "service_runs_as_root"],
    "hardened-planted-left": [PASS, PASS, PASS, "unexpected_listener"],
    "hardened-writable": [PASS, PASS, PASS, PASS, "writable_outside_data"],
    "hardened-stopped-only": [PASS, PASS, PASS, PASS, PASS, "unexpected_listener"],
}


def checks() -> ModuleType:
    return sys.modules[builtin_challenge("hardened-service").checks_module]


def test_the_socket_table_and_uid_map_are_read_as_the_kernel_writes_them() -> None:
    m = checks()
    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode\n"
        "   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999 "
        "0 4242 1 0000000000000000 100 0 0 10 0\n"
        "   1: 0100007F:1F90 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000   999 "
        "0 4343 1 0000000000000000 20 4 30 10 -1\n"
    )
    assert m.parse_tcp_table(table) == [(8080, 4242)]  # the established row is not a listener
    assert m.host_uid(100999, "         0     100000      65536\n") == 999
    assert m.host_uid(5, "         0     100000      65536\n") == -1
    assert m.host_uid(999, "         0          0 4294967295\n") == 999


def test_the_judges() -> None:
    m = checks()
    assert m.judge_user(((10, "python3", 999),), 8080) is None
    assert m.judge_user(((10, "python3", 0),), 8080)[0] == "service_runs_as_root"
    assert m.judge_user(((10, "python3", 65534),), 8080)[0] == "service_user_not_dedicated"
    assert m.judge_user(((1, "a", 998), (2, "b", 999)), 8080)[0] == "service_user_not_dedicated"
    assert m.judge_user((), 8080)[0] == "service_not_running"
    only = [m.Listener(8080, 1, ((10, "python3", 999),))]
    assert m.judge_others(only, {8080}) is None
    planted = [*only, m.Listener(9123, 2, ((11, "python3", 0),))]
    assert "port 9123 held by pid 11 python3 uid 0" in m.judge_others(planted, {8080})
    mountinfo = (
        "22 1 0:40 / / rw,relatime shared:1 - overlay overlay rw,lowerdir=/x\n"
        "23 22 0:41 / /proc rw,nosuid - proc proc rw\n"
        "24 22 0:42 / /tmp rw,nosuid - tmpfs tmpfs rw\n"
        "27 22 0:40 /etc/hosts /etc/hosts rw - ext4 /dev/sda rw\n"
    )
    assert m.memory_mounts(mountinfo) == ["/proc", "/tmp"]
    gids = frozenset({999})
    assert m.writable_by(0o755, 999, 999, 999, gids)  # its own
    assert not m.writable_by(0o555, 999, 0, 999, gids)  # its own, but read-only
    assert m.writable_by(0o1777, 0, 0, 999, gids)  # world-writable (/var/tmp)
    assert not m.writable_by(0o775, 0, 0, 999, gids)
    assert m.writable_by(0o775, 0, 999, 999, gids)  # its group's
    assert not m.writable_by(0o757, 0, 999, 999, gids)  # group class decides, not other
    assert not m.permitted(0o700, 0, 0, 999, gids, 1)  # a root-only directory: not reached
    assert m.permitted(0o755, 0, 0, 999, gids, 1)
    assert m.write_capabilities("0000000000000000") == []
    assert m.write_capabilities("0000000000000002") == ["CAP_DAC_OVERRIDE"]
    assert "CAP_SYS_ADMIN" in m.write_capabilities("000001ffffffffff")
    assert 9000 <= m.planted_port(SEED) < 9900


def test_every_reason_its_matrix_names_is_in_its_table() -> None:
    table = table_for(builtin_challenge("hardened-service"))
    for outcomes in MATRIX.values():
        for outcome in outcomes:
            assert outcome == PASS or table[outcome].category == "verification_failed"


@pytest.mark.hosts
@pytest.mark.parametrize("builder", sorted(MATRIX))
async def test_hardened_service_calibration(
    builder: str, host_factory: HostFactory, match_id: str
) -> None:
    challenge = builtin_challenge("hardened-service")
    host = await host_factory("builder")
    await place_challenge(challenge, host, SEED)
    log = EventLog()
    referee = make_referee(challenge, log, seed=SEED)
    referee.add_territory("builder", host)
    preflight = await referee.preflight("builder")
    assert preflight.ok, preflight.detail

    context = AgentContext(
        match_id=match_id, territory="builder", brief=brief_for(challenge, SEED), host=host,
        deadline=time.monotonic() + 120, params=agent_params(challenge, SEED),
    )  # fmt: skip
    outcome = await get_scripted(builder).run(context)
    assert outcome.successful, outcome.terminal_detail

    outcomes: list[str] = []
    while (verdict := await referee.evaluate_next("builder")) is not None:
        assert verdict.outcome != "referee_error", verdict
        if verdict.outcome == "failed":
            assert verdict.failure_detail
            outcomes.append(verdict.failure_reason or "")
            break
        outcomes.append(PASS)
    assert outcomes == MATRIX[builder], [
        (d["failure_detail"] or "")[-600:] for d in log.of("attempt_result")
    ]
    reached = zip(challenge.milestones, outcomes, strict=False)
    assert referee.points("builder") == sum(m.points for m, o in reached if o == PASS)
    assert referee.infrastructure_failures == 0
