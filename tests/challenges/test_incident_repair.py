"""incident-repair: its seed variants and its repair scripts (its calibration, the
reference on every breakage and each flawed repair, is in its calibration.toml, run by
tests/challenges/calibration.py)."""

from __future__ import annotations

import pytest

from opsarena.agents.scripted import builders_module
from opsarena.challenges import Challenge, builtin_challenge
from opsarena.challenges.calibrate import load_calibration
from opsarena.challenges.catalog import import_checks_file
from opsarena.referee.contract import brief_for
from opsarena.referee.failures import table_for


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


def test_every_seed_in_its_calibration_draws_the_breakage_it_says(challenge: Challenge) -> None:
    text = (challenge.directory / "calibration.toml").read_text()  # type: ignore[operator]
    for line in text.splitlines():
        if line.startswith("seeds = [") and "#" in line:
            seed, breakage = line.split('"')[1], line.split("#")[1].strip()
            assert seed_for(challenge, breakage) == seed.encode(), line
    # The reference repairs every breakage the seed can draw, one seed each.
    module = _module(challenge)
    seeds = load_calibration(challenge).expected["reference"].seeds
    assert sorted(module.breakage_of(s) for s in seeds) == sorted(module.BREAKAGES)  # type: ignore[attr-defined]


def test_only_the_transient_repair_writes_under_run(challenge: Challenge) -> None:
    repair_script = builders_module(challenge.directory).repair_script  # type: ignore[arg-type, union-attr]
    persistent = repair_script(transient=False, wipe=False, collateral=False, wait_seconds=5)
    transient = repair_script(transient=True, wipe=False, collateral=False, wait_seconds=5)
    assert "/run/systemd/system" in transient and "/run/systemd/system" not in persistent
    assert "disable --now" in persistent and "rm -rf" not in persistent
