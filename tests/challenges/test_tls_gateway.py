"""tls-gateway: its pure judges, the seed's CA, and its calibration matrix on real hosts."""

from __future__ import annotations

import time

import pytest
from cryptography import x509

from opsarena.agents.base import AgentContext
from opsarena.agents.scripted import get_scripted
from opsarena.challenges import builtin_challenge
from opsarena.challenges.catalog import place_challenge
from opsarena.challenges.setup import agent_params, brief_for
from opsarena.referee.failures import table_for
from opsarena.referee.probe import HttpResponse
from tests.conftest import HostFactory
from tests.referee.conftest import EventLog, make_referee

PASS = "passed"
SEED = b"tls-calibration-seed"

MATRIX: dict[str, list[str]] = {
    "reference": [PASS] * 6,
    "tls-self-signed": ["certificate_untrusted"],
    "tls-legacy": [PASS, "old_tls_accepted"],
    "tls-no-redirect": [PASS, PASS, "no_redirect"],
    "tls-no-hsts": [PASS, PASS, PASS, "hsts_missing"],
}


def checks_module():  # type: ignore[no-untyped-def]
    import sys

    challenge = builtin_challenge("tls-gateway")
    return challenge, sys.modules[challenge.checks_module]


def test_the_ca_and_the_name_derive_from_the_seed() -> None:
    challenge, checks = checks_module()
    key, cert = checks.ca_pair(SEED)
    assert checks.ca_pair(SEED) == (key, cert)
    other_key, _ = checks.ca_pair(b"another seed")
    assert other_key != key
    parsed = x509.load_pem_x509_certificate(cert)
    assert parsed.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    name = checks.server_name(SEED)
    assert name.endswith(".arena.test") and name != checks.server_name(b"another seed")
    brief = brief_for(challenge, SEED)
    assert name in brief and "{{" not in brief
    assert agent_params(challenge, SEED)["server_name"] == name


def test_the_redirect_and_hsts_judges() -> None:
    _, checks = checks_module()

    def answer(status: int, **headers: str) -> HttpResponse:
        return HttpResponse(status, b"", 1, tuple((k.lower(), v) for k, v in headers.items()))

    good = answer(301, Location="https://gw.test/records/a")
    assert checks.judge_redirect(good, "gw.test", "/records/a") is None
    assert checks.judge_redirect(
        answer(308, Location="https://gw.test:443/records/a"), "gw.test", "/records/a"
    ) is None
    assert checks.judge_redirect(answer(200), "gw.test", "/r").startswith("no_redirect")
    assert checks.judge_redirect(
        answer(302, Location="https://gw.test/r"), "gw.test", "/r"
    ).startswith("bad_redirect")
    assert checks.judge_redirect(
        answer(301, Location="http://gw.test/r"), "gw.test", "/r"
    ).startswith("bad_redirect")
    assert checks.judge_redirect(
        answer(301, Location="https://evil.test/r"), "gw.test", "/r"
    ).startswith("bad_redirect")
    assert checks.judge_hsts("max-age=31536000; includeSubDomains", 86400) is None
    assert checks.judge_hsts(None, 86400) == "no Strict-Transport-Security header"
    assert "under" in checks.judge_hsts("max-age=60", 86400)
    assert "no max-age" in checks.judge_hsts("includeSubDomains", 86400)


def test_every_reason_its_checks_use_is_in_its_table() -> None:
    challenge, _ = checks_module()
    table = table_for(challenge)
    for outcomes in MATRIX.values():
        for outcome in outcomes:
            assert outcome == PASS or table[outcome].category == "verification_failed"


@pytest.mark.hosts
@pytest.mark.parametrize("builder", sorted(MATRIX))
async def test_tls_gateway_calibration(
    builder: str, host_factory: HostFactory, match_id: str
) -> None:
    challenge = builtin_challenge("tls-gateway")
    host = await host_factory("builder")
    await place_challenge(challenge, host, SEED)
    log = EventLog()
    referee = make_referee(challenge, log, seed=SEED)
    referee.add_territory("builder", host)
    preflight = await referee.preflight("builder")
    assert preflight.ok, preflight.detail
    assert preflight.verdict.failure_reason == "connection_refused"

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
    assert outcomes == MATRIX[builder], [d["failure_detail"] for d in log.of("attempt_result")]
    reached = zip(challenge.milestones, outcomes, strict=False)
    assert referee.points("builder") == sum(m.points for m, o in reached if o == PASS)
    assert referee.infrastructure_failures == 0
    if builder == "reference":
        summary = referee.ledger_summary("builder")
        assert summary.acknowledged > 0 and summary.verified >= summary.acknowledged
        assert summary.lost == summary.corrupted == 0
