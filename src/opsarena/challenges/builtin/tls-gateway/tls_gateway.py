"""tls-gateway's checks and setup: the arena's per-match CA, TLS spoken by the referee.

The setup derives, from the match seed, the name the certificate must carry
(`server_name`) and the CA's private key (P-256, `derive_private_key` of an HMAC of the
seed, so a replay or a resumed referee has the same CA), and places the CA key and
certificate on each host under /etc/opsarena/ca before the agents start. The referee
trusts only the CA it holds in memory: replacing /etc/opsarena/ca/ca.crt on the host
changes nothing it believes.

Every TLS connection is made by the arena's process over `Host.connect` with Python
`ssl` (`StreamWriter.start_tls`); nothing inside the host is asked. The records
contract (health, write-read, the reboot's ledger re-read) is the referee's own
built-in checks run through `TlsHost`, a view of the host whose `connect` to the
service's port speaks verified TLS.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import hashlib
import hmac
import ssl
import warnings
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from opsarena.errors import HostError
from opsarena.hosts import Host
from opsarena.referee.contract import (
    CheckContext,
    Setup,
    Verdict,
    get_check,
    register_check,
    register_setup,
)
from opsarena.referee.failures import Observation, describe_error
from opsarena.referee.probe import HttpResponse, ProbeError, ProbeLimits, http_request
from opsarena.workloads.records.checks import attempt_record

CA_DIR = "/etc/opsarena/ca"
HTTP_PORT = 80
HANDSHAKE_TIMEOUT_S = 5.0
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_EPOCH = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
_END = datetime.datetime(2099, 1, 1, tzinfo=datetime.UTC)


def _derive(seed: bytes, label: str) -> bytes:
    return hmac.new(seed, f"opsarena-tls-gateway:{label}".encode(), hashlib.sha256).digest()


def server_name(seed: bytes) -> str:
    """The name the brief gives (a fresh one per seed). Pure."""
    return f"gw-{_derive(seed, 'name').hex()[:10]}.arena.test"


def variables(seed: bytes) -> dict[str, str]:
    return {"server_name": server_name(seed), "ca_dir": CA_DIR}


@functools.lru_cache(maxsize=16)
def ca_pair(seed: bytes) -> tuple[bytes, bytes]:
    """The match's CA: (private key PEM, certificate PEM), both derived from the seed
    (the certificate's fields are fixed, so a re-derived one is an equal trust anchor)."""
    scalar = int.from_bytes(_derive(seed, "ca-key") * 2, "big") % (P256_ORDER - 1) + 1
    key = ec.derive_private_key(scalar, ec.SECP256R1())
    common_name = f"opsarena match CA {_derive(seed, 'n').hex()[:8]}"
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    serial = int.from_bytes(_derive(seed, "serial")[:16], "big") >> 1
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(_EPOCH)
        .not_valid_after(_END)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


async def place(host: Host, seed: bytes) -> None:
    key_pem, cert_pem = ca_pair(seed)
    await host.write_file(f"{CA_DIR}/ca.key", key_pem, mode=0o600)
    await host.write_file(f"{CA_DIR}/ca.crt", cert_pem, mode=0o644)


register_setup("tls-gateway", Setup(variables=variables, place=place))


def verifying_context(seed: bytes) -> ssl.SSLContext:
    """TLS 1.2+, the chain verified against the match's CA only, the name checked."""
    context = ssl.create_default_context(cadata=ca_pair(seed)[1].decode())
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def legacy_context(version: ssl.TLSVersion) -> ssl.SSLContext:
    """Offers exactly `version` (TLS 1.0 or 1.1), nothing verified: only whether the
    server agrees to speak it matters."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():  # offering them is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = version
        context.maximum_version = version
    return context


async def handshake(
    host: Host, port: int, context: ssl.SSLContext, name: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection into the host, then a TLS handshake on it by the arena."""
    reader, writer = await host.connect(port, timeout=HANDSHAKE_TIMEOUT_S)
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            await writer.start_tls(context, server_hostname=name)
    except BaseException:
        writer.close()
        raise
    return reader, writer


class TlsHost:
    """`host` whose `connect(port)` to the service's port returns a verified TLS stream
    (a failed handshake looks like a reset connection to the built-in checks; the
    `tls-up` milestone has already named its precise reason). Everything else is the
    host's own."""

    def __init__(self, host: Host, port: int, seed: bytes) -> None:
        self._host, self._port, self._seed = host, port, seed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)

    async def connect(
        self, port: int, *, timeout: float = 5.0
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if port != self._port:
            return await self._host.connect(port, timeout=timeout)
        try:
            return await handshake(
                self._host, port, verifying_context(self._seed), server_name(self._seed)
            )
        except ssl.SSLError as exc:
            raise ConnectionResetError(f"TLS handshake failed: {exc.reason or exc}") from exc


def tls_view(host: Host, ctx: CheckContext) -> Host:
    return cast(Host, TlsHost(host, ctx.challenge.port, ctx.seed))


def _fail(reason: str, step: str, detail: str, reproduce: str = "") -> Verdict:
    return Verdict.failed(
        reason, Observation(step=step, elapsed_ms=0, error=detail, reproduce=reproduce).render()
    )


def _openssl_line(port: int, name: str, extra: str = "") -> str:
    return (
        f"openssl s_client -connect 127.0.0.1:{port} -servername {name} "
        f"-CAfile {CA_DIR}/ca.crt -verify_return_error {extra}</dev/null"
    ).replace("  ", " ")


async def verified_handshake(host: Host, ctx: CheckContext) -> Verdict:
    """Passed (with the negotiated version, cipher and certificate subject) when a TLS
    1.2+ handshake verifies against the match's CA for the brief's name. Else the reason:
    `certificate_untrusted`, `certificate_name_mismatch`, `tls_handshake_failed`, or the
    table's connection reasons."""
    port, name = ctx.challenge.port, server_name(ctx.seed)
    step = f"TLS handshake with 127.0.0.1:{port} for {name}"
    reproduce = _openssl_line(port, name)
    try:
        _reader, writer = await handshake(host, port, verifying_context(ctx.seed), name)
    except ssl.SSLCertVerificationError as exc:
        reason = "certificate_name_mismatch" if exc.verify_code == 62 else "certificate_untrusted"
        why = f"{exc.verify_message} (verify code {exc.verify_code})"
        return _fail(reason, step, why, reproduce)
    except ssl.SSLError as exc:
        return _fail("tls_handshake_failed", step, str(exc.reason or exc), reproduce)
    except (ConnectionRefusedError, ConnectionResetError, TimeoutError) as exc:
        reason = {
            ConnectionRefusedError: "connection_refused",
            ConnectionResetError: "connection_reset",
            TimeoutError: "timeout",
        }[type(exc)]
        return _fail(reason, step, describe_error(exc), reproduce)
    except HostError as exc:
        return Verdict.referee_error("host_unavailable", f"{step}: {describe_error(exc)}")
    except OSError as exc:
        if exc.__class__ is OSError or isinstance(exc, PermissionError):
            return Verdict.referee_error("probe_error", f"{step}: {describe_error(exc)}")
        return _fail("tls_handshake_failed", step, describe_error(exc), reproduce)
    tls = writer.get_extra_info("ssl_object")
    peer = writer.get_extra_info("peercert") or {}
    writer.close()
    return Verdict.passed(
        {
            "tls_version": tls.version() if tls else None,
            "cipher": (tls.cipher() or ("",))[0] if tls else None,
            "subject": str(peer.get("subject", "")),
            "server_name": name,
        }
    )


async def _then(first: Verdict, second: Verdict) -> Verdict:
    if first.outcome != "passed":
        return first
    if second.outcome != "passed":
        return second
    return Verdict.passed({**(first.evidence or {}), **(second.evidence or {})})


@register_check("tls-health")
async def tls_health(host: Host, ctx: CheckContext) -> Verdict:
    """A verified TLS handshake, then GET /health over it answers 200 `ready`."""
    shaken = await verified_handshake(host, ctx)
    if shaken.outcome != "passed":
        return shaken
    return await _then(shaken, await get_check("health")(tls_view(host, ctx), ctx))


@register_check("tls-versions")
async def tls_versions(host: Host, ctx: CheckContext) -> Verdict:
    """Every version of `params.refused` (default TLS 1.0 and 1.1) is refused, while a
    verified TLS 1.2+ handshake still succeeds."""
    port, name = ctx.challenge.port, server_name(ctx.seed)
    versions = {"1.0": ssl.TLSVersion.TLSv1, "1.1": ssl.TLSVersion.TLSv1_1}
    refused = [v for v in ctx.milestone.param("refused", ["1.0", "1.1"]) if v in versions]
    for label in refused:
        try:
            _reader, writer = await handshake(host, port, legacy_context(versions[label]), name)
        except (ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError, EOFError):
            continue  # refused, as it must be
        except (TimeoutError, ConnectionRefusedError, HostError, OSError) as exc:
            return Verdict.referee_error(
                "probe_error", f"TLS {label} attempt on {port}: {describe_error(exc)}"
            )
        tls = writer.get_extra_info("ssl_object")
        writer.close()
        agreed = tls.version() if tls else "?"
        return _fail(
            "old_tls_accepted",
            f"TLS {label} handshake with 127.0.0.1:{port}",
            f"the server agreed to {agreed}; only TLS 1.2 or newer may be accepted",
            _openssl_line(port, name, f"-tls1{'_1' if label == '1.1' else ''}"),
        )
    return await _then(Verdict.passed({"refused": refused}), await verified_handshake(host, ctx))


def judge_redirect(response: HttpResponse, name: str, target: str) -> str | None:
    """None when `response` permanently redirects to https://NAME/TARGET; else why not
    (`no_redirect` or `bad_redirect` and a sentence). Pure."""
    location = response.header("location") or ""
    if response.status not in (301, 308):
        if 300 <= response.status < 400:
            return f"bad_redirect: status {response.status} is not permanent (301 or 308)"
        return f"no_redirect: status {response.status}, not a permanent redirect to https"
    wanted = (f"https://{name}{target}", f"https://{name}:443{target}")
    if location not in wanted:
        return f"bad_redirect: Location {location[:200]!r}, not {wanted[0]!r}"
    return None


async def redirect_verdict(host: Host, ctx: CheckContext) -> Verdict:
    name = server_name(ctx.seed)
    target = f"/records/{attempt_record(ctx)[0]}"
    step = f"GET http://127.0.0.1:{HTTP_PORT}{target}"
    reproduce = f"curl -sS -i --max-time 5 http://127.0.0.1:{HTTP_PORT}{target}"
    try:
        response = await http_request(host, HTTP_PORT, "GET", target, limits=ProbeLimits())
    except ProbeError as exc:
        return _fail("no_redirect", step, f"no answer on port 80: {describe_error(exc)}", reproduce)
    except HostError as exc:
        return Verdict.referee_error("host_unavailable", f"{step}: {describe_error(exc)}")
    problem = judge_redirect(response, name, target)
    if problem is not None:
        reason, detail = problem.split(": ", 1)
        return _fail(reason, step, detail, reproduce)
    return Verdict.passed({"redirect": response.status, "location": response.header("location")})


@register_check("http-redirect")
async def http_redirect(host: Host, ctx: CheckContext) -> Verdict:
    """Plain HTTP on 80 answers a permanent redirect to the same path on https://NAME."""
    return await redirect_verdict(host, ctx)


def judge_hsts(value: str | None, min_max_age: int) -> str | None:
    """None when a Strict-Transport-Security value has max-age >= `min_max_age`; else
    why not. Pure."""
    if value is None:
        return "no Strict-Transport-Security header"
    for part in value.split(";"):
        key, _, number = part.strip().partition("=")
        if key.lower() == "max-age":
            try:
                age = int(number.strip().strip('"'))
            except ValueError:
                return f"max-age {number!r} is not a number"
            if age < min_max_age:
                return f"max-age={age} is under {min_max_age}"
            return None
    return f"Strict-Transport-Security {value[:100]!r} has no max-age"


async def hsts_verdict(host: Host, ctx: CheckContext) -> Verdict:
    minimum = ctx.milestone.param("min_max_age", 86400)
    step = f"GET https://{server_name(ctx.seed)}/health (its Strict-Transport-Security)"
    try:
        response = await http_request(
            tls_view(host, ctx), ctx.challenge.port, "GET", "/health", limits=ProbeLimits()
        )
    except ProbeError as exc:
        return _fail("tls_handshake_failed", step, describe_error(exc))
    except HostError as exc:
        return Verdict.referee_error("host_unavailable", f"{step}: {describe_error(exc)}")
    problem = judge_hsts(response.header("strict-transport-security"), minimum)
    if problem is not None:
        return _fail(
            "hsts_missing", step, problem, "curl -sk -D - -o /dev/null https://127.0.0.1/health"
        )
    return Verdict.passed({"hsts": response.header("strict-transport-security")})


@register_check("hsts")
async def hsts(host: Host, ctx: CheckContext) -> Verdict:
    """Answers over TLS carry Strict-Transport-Security with max-age >= `min_max_age`."""
    return await hsts_verdict(host, ctx)


@register_check("tls-write-read")
async def tls_write_read(host: Host, ctx: CheckContext) -> Verdict:
    """The referee's whole write-read workload, over verified TLS."""
    return await get_check("write-read")(tls_view(host, ctx), ctx)


@register_check("tls-reboot")
async def tls_reboot(host: Host, ctx: CheckContext) -> Verdict:
    """The built-in reboot durability check over TLS (reboot, ready within the budget,
    the ledger re-read), then the certificate, the redirect and HSTS once more."""
    verdict = await get_check("fault-durability")(tls_view(host, ctx), ctx)
    for after in (verified_handshake, redirect_verdict, hsts_verdict):
        verdict = await _then(verdict, await after(host, ctx))
    return verdict
