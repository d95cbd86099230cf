"""backup-restore: its pure judges and its brief (its calibration is in its
calibration.toml, run by tests/challenges/calibration.py)."""

from __future__ import annotations

import sys
from types import ModuleType

from opsarena.challenges import builtin_challenge
from opsarena.referee.contract import brief_for
from opsarena.referee.model import Challenge
from opsarena.referee.nemesis import missing_faults

SEED = b"backup-calibration-seed"


def checks_module() -> tuple[Challenge, ModuleType]:
    challenge = builtin_challenge("backup-restore")
    return challenge, sys.modules[challenge.checks_module]


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
