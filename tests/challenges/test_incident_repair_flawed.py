"""incident-repair's flawed repairs on real hosts: each fails where its table says.

Kept apart from test_incident_repair.py (the reference on every breakage) so CI's two
`--dist loadfile` workers take one file each.
"""

from __future__ import annotations

import pytest

from opsarena.challenges import Challenge, builtin_challenge
from tests.challenges.test_incident_repair import MATRIX, judge, seed_for
from tests.conftest import HostFactory


@pytest.fixture
def challenge() -> Challenge:
    return builtin_challenge("incident-repair")


FLAWED_BREAKAGE = {
    "repair-wipe": "data-owner",
    "repair-transient": "port-held",
    "repair-collateral": "config-syntax",
    "repair-standin": "program-moved",
}
"""Each flawed builder on one breakage (the flaw does not depend on which). A builder
doing nothing (`idle`) is the preflight of every host: see PREFLIGHT in test_incident_repair.py."""


@pytest.mark.hosts
@pytest.mark.parametrize("builder", sorted(FLAWED_BREAKAGE))
async def test_flawed_repairs_fail_where_designed(
    builder: str, challenge: Challenge, host_factory: HostFactory, match_id: str
) -> None:
    seed = seed_for(challenge, FLAWED_BREAKAGE[builder])
    _, outcomes, log = await judge(challenge, builder, seed, host_factory, match_id)
    assert outcomes == MATRIX[builder], [d["failure_detail"] for d in log.of("attempt_result")]
    if builder == "repair-standin":
        # The probe passed; the kernel showed whose the port is.
        last = log.of("attempt_result")[-1]["failure_detail"]
        assert "not in records-metrics.service" in last, last
