"""zero-downtime-deploy: its pure judges, the seed's releases, and its calibration matrix
on real hosts."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest

from opsarena.challenges import builtin_challenge
from opsarena.referee.contract import agent_params, brief_for
from opsarena.referee.failures import table_for
from opsarena.referee.model import Challenge
from tests.challenges.calibration import PASS, calibrate
from tests.conftest import HostFactory

SEED = b"zdd-calibration-seed"

MATRIX: dict[str, list[str]] = {
    "reference": [PASS] * 4,
    "deploy-stop-start": [PASS, PASS, "requests_failed"],
    "deploy-fresh-data": [PASS, PASS, "record_missing"],
    "deploy-newest-only": [PASS, PASS, PASS, "wrong_version"],
    "deploy-v2-first": ["wrong_version"],
    "deploy-no-command": [PASS, PASS, "deploy_failed"],
}


def checks_module() -> tuple[Challenge, ModuleType]:
    challenge = builtin_challenge("zero-downtime-deploy")
    return challenge, sys.modules[challenge.checks_module]


def test_the_releases_derive_from_the_seed() -> None:
    challenge, checks = checks_module()
    v1, v2 = checks.versions(SEED)
    assert checks.versions(SEED) == (v1, v2) and v1 != v2
    assert [int(p) for p in v1.split(".")] < [int(p) for p in v2.split(".")]
    assert {checks.versions(bytes([n]) * 8) for n in range(20)} != {(v1, v2)}
    brief = brief_for(challenge, SEED)
    assert f"/opt/releases/{v1}/server.py" in brief and v2 in brief and "{{" not in brief
    params = agent_params(challenge, SEED)
    assert (params["v1"], params["v2"]) == (v1, v2)
    assert checks.release_of(SEED, "v2") == v2
    with pytest.raises(ValueError, match="no release role"):
        checks.release_of(SEED, "v3")


def test_percentile_and_the_load_judge() -> None:
    _, checks = checks_module()
    assert checks.percentile([], 99) is None
    assert checks.percentile([5], 99) == 5
    assert checks.percentile(list(range(1, 101)), 99) == 99
    assert checks.percentile(list(range(1, 101)), 50) == 50
    assert checks.percentile([3, 1, 2], 100) == 3

    report = checks.LoadReport(sent=10, latencies_ms=[1, 2, 3])
    assert checks.judge_load(report, "deploy 1/1") is None
    report.fail("PUT /records/a (phase connect): refused")
    report.fail("GET /version (phase connect): refused")
    reason, detail = checks.judge_load(report, "deploy 1/1")
    assert reason == "requests_failed"
    assert "2 failed" in detail and "first: PUT /records/a" in detail and "p99 3 ms" in detail
    report.lose("GET /records/b answered 404")
    reason, detail = checks.judge_load(report, "deploy 1/1")
    assert reason == "record_missing" and "GET /records/b" in detail


def test_the_version_judge() -> None:
    _, checks = checks_module()
    assert checks.judge_version(b"1.2.3\n", 200, "1.2.3") is None
    assert checks.judge_version(b"1.2.4", 200, "1.2.3") is not None
    assert checks.judge_version(b"1.2.3", 500, "1.2.3") is not None


def test_every_reason_its_matrix_uses_is_in_its_table() -> None:
    challenge, _ = checks_module()
    table = table_for(challenge)
    for outcomes in MATRIX.values():
        for outcome in outcomes:
            assert outcome == PASS or table[outcome].category == "verification_failed"


@pytest.mark.hosts
@pytest.mark.parametrize("builder", sorted(MATRIX))
async def test_zero_downtime_deploy_calibration(
    builder: str, host_factory: HostFactory, match_id: str
) -> None:
    challenge = builtin_challenge("zero-downtime-deploy")
    run = await calibrate(challenge, await host_factory("builder"), builder, SEED, match_id)
    outcomes, log, referee = run.outcomes, run.log, run.referee
    assert run.preflight_reason == "connection_refused"
    assert outcomes == MATRIX[builder], run.details()
    assert run.points_match(challenge)
    if builder == "reference":
        summary = referee.ledger_summary("builder")
        assert summary.verified >= summary.acknowledged
        assert summary.lost == summary.corrupted == 0
        evidence = [d["evidence"] for d in log.of("attempt_result") if d.get("evidence")]
        deploys = [d for e in evidence for d in e.get("deploys", [])]
        assert len(deploys) == 3
        assert all(d["failed_requests"] == 0 and d["requests"] > 25 for d in deploys)
        assert all(d["p99_ms"] is not None for d in deploys)
        # Every third request of the load is a PUT, each acknowledged (none failed).
        assert summary.acknowledged >= sum(d["requests"] // 3 for d in deploys)
