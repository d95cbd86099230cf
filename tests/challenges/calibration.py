"""Every built-in challenge's calibration (its calibration.toml) on real hosts, through
the shared harness (`opsarena.challenges.calibrate`, what `opsarena challenges
calibrate` runs).

Each (challenge, builder, seed) run is one test. CI gives each test file to one worker
(`--dist loadfile`), so the runs are dealt round-robin over `SHARDS` files
(test_calibration_<n>.py), as the per-challenge matrix files were spread before: a new
challenge's rows join them without a new file.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from opsarena.challenges import builtin_challenge, builtin_names
from opsarena.challenges.calibrate import (
    CalibrationPlan,
    HostMaker,
    calibration_jobs,
    load_calibration,
    run_jobs,
)
from opsarena.hosts import FAULT_POWER_CUT, Host, HostSpec, get_driver
from opsarena.referee.nemesis import faults_needed
from tests.conftest import TEST_IMAGE, new_match_id

SHARDS = 4


def all_jobs() -> list[tuple[str, str, int]]:
    """(challenge, builder, seed index) of every built-in challenge's calibration."""
    jobs = []
    for name in builtin_names():
        plan = load_calibration(builtin_challenge(name))
        for builder, expected in plan.expected.items():
            jobs += [(name, builder, i) for i in range(max(1, len(expected.seeds)))]
    return jobs


def fresh_hosts(plan: CalibrationPlan) -> HostMaker:
    """Fresh hosts of the test image, each in a match id the leak check knows."""

    @contextlib.asynccontextmanager
    async def make_host(label: str) -> AsyncIterator[tuple[Host, str]]:
        driver = get_driver("podman")
        match_id = new_match_id("cal")
        spec = HostSpec(
            match_id=match_id, territory="builder", image=TEST_IMAGE,
            power_cut=FAULT_POWER_CUT in faults_needed(plan.challenge),
        )  # fmt: skip
        try:
            yield await driver.create(spec), match_id
        finally:
            await asyncio.shield(driver.cleanup(match_id=match_id))

    return make_host


def calibration_test(shard: int) -> Callable[..., Coroutine[Any, Any, None]]:
    """The test of every `SHARDS`-th run, from `shard`."""
    mine = all_jobs()[shard::SHARDS]

    @pytest.mark.hosts
    @pytest.mark.parametrize(("challenge", "builder", "seed_index"), mine)
    async def test_calibration(challenge: str, builder: str, seed_index: int) -> None:
        plan = load_calibration(builtin_challenge(challenge))
        expected, seed = calibration_jobs(plan, [builder])[seed_index]
        (measured,) = await run_jobs(plan, [(expected, seed)], fresh_hosts(plan))
        details = measured.run.details() if measured.run else []
        assert measured.ok, (measured.line(), details)

    return test_calibration
