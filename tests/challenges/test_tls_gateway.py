"""tls-gateway: its pure judges and the seed's CA (its calibration is in its
calibration.toml, run by tests/challenges/calibration.py)."""

from __future__ import annotations

from cryptography import x509

from opsarena.challenges import builtin_challenge
from opsarena.referee.contract import agent_params, brief_for
from opsarena.referee.probe import HttpResponse

SEED = b"tls-calibration-seed"


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
    assert (
        checks.judge_redirect(
            answer(308, Location="https://gw.test:443/records/a"), "gw.test", "/records/a"
        )
        is None
    )
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
