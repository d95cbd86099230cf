"""zero-downtime-deploy: its pure judges and the seed's releases (its calibration is in
its calibration.toml, run by tests/challenges/calibration.py)."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest

from opsarena.challenges import builtin_challenge
from opsarena.referee.contract import agent_params, brief_for
from opsarena.referee.model import Challenge

SEED = b"zdd-calibration-seed"


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
