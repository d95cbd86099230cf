"""backup-restore: its pure judges, its brief, and its calibration matrix on real hosts."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest

from opsarena.challenges import builtin_challenge
from opsarena.referee.contract import brief_for
from opsarena.referee.failures import table_for
from opsarena.referee.model import Challenge
from opsarena.referee.nemesis import missing_faults
from tests.challenges.calibration import PASS, calibrate
from tests.conftest import HostFactory

SEED = b"backup-calibration-seed"
FAST_RPO_S = 5.0
"""The calibration runs with a shorter recovery point (and write window) than the brief's
10 s: the reference's backups every 2 s meet either, and CI saves a minute a loss."""

MATRIX: dict[str, list[str]] = {
    "reference": [PASS] * 5,
    "backup-once": [PASS, PASS, "record_missing"],
    "backup-in-datadir": [PASS, PASS, "record_missing"],
    "backup-not-enabled": [PASS, PASS, PASS, PASS, "record_missing"],
    "stores-elsewhere": [PASS, PASS, "loss_not_effective"],
    "restore-broken": [PASS, PASS, "restore_failed"],
}


def checks_module() -> tuple[Challenge, ModuleType]:
    challenge = builtin_challenge("backup-restore")
    return challenge, sys.modules[challenge.checks_module]


def fast(challenge: Challenge) -> Challenge:
    milestones = [
        m.model_copy(update={"params": {**m.params, "rpo_s": FAST_RPO_S, "write_s": 7.0}})
        if m.check == "disk-loss-restore"
        else m
        for m in challenge.milestones
    ]
    return challenge.model_copy(update={"milestones": milestones})


def test_the_brief_states_what_the_milestones_check() -> None:
    challenge, _ = checks_module()
    brief = brief_for(challenge, SEED)
    for m in challenge.milestones:
        if m.check != "disk-loss-restore":
            continue
        assert f"{m.param('rpo_s', 0.0):g} seconds" in brief
        assert f"for {m.param('write_s', 0.0):g} s" in brief
        assert str(m.param("restore_command", "")) in brief
        assert str(m.param("path", "")) in brief
        assert f"within {m.param('restore_timeout_s', 0.0):g} s" in brief
    assert missing_faults(challenge, {"disk-loss", "reboot"}, "podman") is None


def test_the_disk_loss_fault_needs_a_path() -> None:
    challenge, _ = checks_module()
    broken = challenge.model_copy(
        update={
            "milestones": [
                m.model_copy(update={"params": {}}) if m.fault == "disk-loss" else m
                for m in challenge.milestones
            ]
        }
    )
    problem = missing_faults(broken, {"disk-loss", "reboot"}, "podman")
    assert problem is not None and "params.path" in problem


def test_the_measured_rpo_and_what_may_be_lost() -> None:
    _, checks = checks_module()
    acks = [("a", 100.0), ("b", 101.0), ("c", 102.0), ("d", 109.5)]
    assert checks.measured_rpo_ms(acks, {"a", "b", "c", "d"}, 110.0) == 500
    assert checks.measured_rpo_ms(acks, {"a", "b", "d"}, 110.0) == 9000  # c lost: b counts
    assert checks.measured_rpo_ms(acks, {"b", "c", "d"}, 110.0) is None  # the oldest lost
    assert checks.forgiven_ids(acks, 110.0, 10.0) == {"b", "c", "d"}
    assert checks.forgiven_ids(acks, 110.0, 1.0) == {"d"}


def test_every_reason_its_matrix_uses_is_in_its_table() -> None:
    challenge, _ = checks_module()
    table = table_for(challenge)
    for outcomes in MATRIX.values():
        for outcome in outcomes:
            assert outcome == PASS or table[outcome].category == "verification_failed"


@pytest.mark.hosts
@pytest.mark.parametrize("builder", sorted(MATRIX))
async def test_backup_restore_calibration(
    builder: str, host_factory: HostFactory, match_id: str
) -> None:
    challenge = fast(builtin_challenge("backup-restore"))
    run = await calibrate(challenge, await host_factory("builder"), builder, SEED, match_id)
    outcomes, details, log, referee = run.outcomes, run.details(10**6), run.log, run.referee
    assert outcomes == MATRIX[builder], details
    assert run.points_match(challenge)
    if outcomes[-1] == "record_missing":
        assert "measured RPO" in (details[-1] or "")
    if builder == "reference":
        losses = [d["evidence"] for d in log.of("milestone_passed") if "disk-loss" in d["evidence"]]
        assert len(losses) == 2
        for evidence in losses:
            assert evidence["measured_rpo_ms"] is not None
            assert evidence["measured_rpo_ms"] <= FAST_RPO_S * 1000
            assert evidence["restore_ms"] > 0 and evidence["written"] >= 20
        summary = referee.ledger_summary("builder")
        assert summary.lost == summary.corrupted == summary.stale == 0
