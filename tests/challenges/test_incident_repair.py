"""incident-repair: its seed variants, its setup on a real host, and its calibration matrix.

The reference repairs every breakage the seed can draw (one host per breakage); each
flawed builder fails at the milestone and with the reason its module's table says
(test_incident_repair_flawed.py: a file of its own, so CI's loadfile workers share them).
"""

from __future__ import annotations

import pytest

from opsarena.agents.scripted.incident import repair_script
from opsarena.challenges import Challenge, builtin_challenge
from opsarena.challenges.catalog import import_checks_file
from opsarena.referee.contract import brief_for
from opsarena.referee.failures import table_for
from tests.challenges.calibration import PASS, calibrate
from tests.conftest import HostFactory
from tests.referee.conftest import EventLog

MATRIX: dict[str, list[str]] = {
    "reference": [PASS] * 5,
    "repair-wipe": [PASS, "seeded_record_lost"],
    "repair-transient": [PASS, PASS, PASS, "not_ready_after_fault"],
    "repair-collateral": [PASS, PASS, PASS, PASS, "collateral_damage"],
    "repair-standin": [PASS, PASS, PASS, PASS, "collateral_damage"],
}
"""builder -> the outcome of each milestone it reaches, in order (as for durable-records)."""


@pytest.fixture
def challenge() -> Challenge:
    return builtin_challenge("incident-repair")


def _module(challenge: Challenge) -> object:
    import sys

    assert challenge.directory is not None and challenge.checks_file is not None
    return sys.modules[import_checks_file(challenge.directory, challenge.checks_file)]


def seed_for(challenge: Challenge, breakage: str) -> bytes:
    """The first seed `incident-<n>` that draws `breakage`."""
    breakage_of = _module(challenge).breakage_of  # type: ignore[attr-defined]
    for n in range(1000):
        seed = f"incident-{n}".encode()
        if breakage_of(seed) == breakage:
            return seed
    raise AssertionError(f"no seed draws {breakage}")


def test_every_breakage_is_drawn_and_the_draw_is_the_seeds(challenge: Challenge) -> None:
    module = _module(challenge)
    breakages = module.BREAKAGES  # type: ignore[attr-defined]
    drawn = {module.breakage_of(f"s{n}".encode()) for n in range(200)}  # type: ignore[attr-defined]
    assert drawn == set(breakages) and len(breakages) >= 5
    assert module.breakage_of(b"one seed") == module.breakage_of(b"one seed")  # type: ignore[attr-defined]


def test_seeded_records_follow_the_seed_and_the_territory(challenge: Challenge) -> None:
    seeded = _module(challenge).seeded_records  # type: ignore[attr-defined]
    first = seeded(b"seed-a", "alice")
    assert first == seeded(b"seed-a", "alice")
    assert [v for _, _, v in first] != [v for _, _, v in seeded(b"seed-b", "alice")]
    assert [i for _, i, _ in first] != [i for _, i, _ in seeded(b"seed-a", "bob")]
    assert len({i for _, i, _ in first}) == len(first) == 12
    assert b"" in [v for _, _, v in first] and bytes(range(256)) in [
        bytes(sorted(v)) for _, _, v in first
    ]


def test_the_brief_names_the_seeded_count_and_the_table_has_the_added_reasons(
    challenge: Challenge,
) -> None:
    assert "holds 12 records" in brief_for(challenge, b"any seed")
    table = table_for(challenge)
    assert table["seeded_record_lost"].category == "verification_failed"
    assert table["collateral_damage"].category == "verification_failed"


def test_only_the_transient_repair_writes_under_run() -> None:
    persistent = repair_script(transient=False, wipe=False, collateral=False, wait_seconds=5)
    transient = repair_script(transient=True, wipe=False, collateral=False, wait_seconds=5)
    assert "/run/systemd/system" in transient and "/run/systemd/system" not in persistent
    assert "disable --now" in persistent and "rm -rf" not in persistent


PREFLIGHT = {
    "program-moved": "connection_refused",
    "data-owner": "connection_refused",
    "port-held": "bad_status",
    "config-syntax": "connection_refused",
    "user-missing": "connection_refused",
}
"""How each fresh host fails service-up before anyone acted (the legacy socket answers
503 for `port-held`; for the rest nothing listens)."""


async def judge(
    challenge: Challenge, builder: str, seed: bytes, host_factory: HostFactory, match_id: str
) -> tuple[str, list[str], EventLog]:
    """The preflight's failure reason, each milestone's outcome, and the events."""
    host = await host_factory("builder")
    run = await calibrate(challenge, host, builder, seed, match_id)
    assert run.points_match(challenge)
    return run.preflight_reason or "", run.outcomes, run.log


@pytest.mark.hosts
@pytest.mark.parametrize(
    "breakage", ["program-moved", "data-owner", "port-held", "config-syntax", "user-missing"]
)
async def test_reference_repairs_every_breakage(
    breakage: str, challenge: Challenge, host_factory: HostFactory, match_id: str
) -> None:
    preflight, outcomes, log = await judge(
        challenge, "reference", seed_for(challenge, breakage), host_factory, match_id
    )
    assert preflight == PREFLIGHT[breakage]
    assert outcomes == MATRIX["reference"], [d["failure_detail"] for d in log.of("attempt_result")]
    intact = [d for d in log.of("attempt_result") if d.get("milestone") == "records-intact"]
    assert intact and intact[-1]["evidence"]["seeded"] == 12
