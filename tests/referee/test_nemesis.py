"""Faults as registered objects: names, the driver's declaration, refusal at match start."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from opsarena import hosts
from opsarena.agents.competitors import competitor_from_cli
from opsarena.challenges import builtin_challenge
from opsarena.errors import MatchError
from opsarena.hosts import get_driver
from opsarena.match.controller import Controller, MatchPlan
from opsarena.referee.model import Milestone
from opsarena.referee.nemesis import (
    fault_names,
    faults_needed,
    get_fault,
    missing_faults,
    needs_power_cut_disk,
)
from opsarena.store import SqliteEventStore
from tests.faults import BROWNOUT


def test_restart_and_reboot_are_registered_and_name_their_host_method() -> None:
    assert {"restart", "reboot"} <= set(fault_names())
    for name in ("restart", "reboot"):
        fault = get_fault(name)
        assert fault.name == name
        assert callable(getattr(hosts.Host, fault.host_method))


def test_durable_records_needs_restart_and_reboot_and_podman_offers_them() -> None:
    challenge = builtin_challenge("durable-records")
    assert faults_needed(challenge) == ["restart", "reboot"]
    assert missing_faults(challenge, get_driver("podman").faults, "podman") is None


def with_fault(fault: str) -> object:
    challenge = builtin_challenge("durable-records")
    extra = Milestone(id="chaos", title="t", points=5, check="fault-durability", fault=fault)
    return challenge.model_copy(update={"milestones": [*challenge.milestones, extra]})


def test_hosts_get_a_power_cut_disk_when_a_fault_of_the_challenge_declares_it(
    tmp_path: Path,
) -> None:
    """The capability decides, not the fault's name: a plug-in fault that declares it
    gets the disk as the built-in power cut does; the controller's hosts follow it."""
    assert needs_power_cut_disk(with_fault(BROWNOUT))  # type: ignore[arg-type]
    assert needs_power_cut_disk(with_fault("power-cut"))  # type: ignore[arg-type]
    assert not needs_power_cut_disk(with_fault("crash"))  # type: ignore[arg-type]
    assert not needs_power_cut_disk(with_fault("partition"))  # type: ignore[arg-type]
    for fault, disk in ((BROWNOUT, True), ("reboot", False)):
        plan = MatchPlan(
            challenge=with_fault(fault),  # type: ignore[arg-type]
            competitors=[competitor_from_cli("a", "scripted:idle")],
            time_limit_s=60.0,
        )
        with SqliteEventStore(tmp_path / "log.db") as store:
            assert Controller(plan, store).host_spec("a").power_cut is disk


def test_a_missing_or_unknown_fault_is_one_line() -> None:
    lacking = missing_faults(with_fault("reboot"), {"restart"}, "toy")  # type: ignore[arg-type]
    assert lacking == (
        "challenge 'durable-records' needs the faults reboot, which the host driver 'toy' "
        "does not support (it offers: restart)"
    )
    unknown = missing_faults(with_fault("partition"), {"restart", "reboot"}, "podman")  # type: ignore[arg-type]
    assert unknown is not None and "unknown faults partition" in unknown
    assert "\n" not in unknown


def test_a_match_needing_an_unsupported_fault_is_refused_before_anything_is_made(
    tmp_path: Path,
) -> None:
    plan = MatchPlan(
        challenge=with_fault("partition"),  # type: ignore[arg-type]
        competitors=[competitor_from_cli("a", "scripted:idle")],
        time_limit_s=60,
    )
    with SqliteEventStore(tmp_path / "log.db") as store:
        with pytest.raises(MatchError, match="unknown faults partition"):
            asyncio.run(Controller(plan, store).run())
        assert asyncio.run(store.read(plan.match_id)) == []


def test_the_cli_refuses_it_with_one_line_and_exit_2(tmp_path: Path) -> None:
    source = (Path(__file__).resolve().parents[2] / "src/opsarena/challenges/builtin"
              / "durable-records" / "challenge.toml").read_text()  # fmt: skip
    source += '\n[[milestones]]\nid = "chaos"\ntitle = "t"\npoints = 5\n'
    source += 'check = "fault-durability"\nfault = "partition"\n'
    path = tmp_path / "chaos.toml"
    path.write_text(source.replace('name = "durable-records"', 'name = "chaos"'))
    result = subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", "run", "--quiet", "--db",
         str(tmp_path / "log.db"), "--challenge", str(path), "--builder", "a=scripted:idle"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "unknown faults partition" in lines[0]
