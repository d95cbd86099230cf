"""tls-gateway's scripted builders: the records service behind TLS, and one flaw each.

`reference` issues its certificate from the arena's CA (placed by the challenge's setup
under `CA_DIR`) for the brief's `server_name`, serves HTTPS on 443 (TLS 1.2 at least,
HSTS) and redirects plain 80 there; each flawed builder is `reference` with one of
`TLS_FLAWS` (`calibration.toml` says where each stops and why).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from opsarena.agents.scripted import IdleBuilder, RecordsServiceBuilder, ScriptedBuilder
from opsarena.agents.scripted.deploy import ServiceTarget, service_target
from opsarena.hosts import ExecResult, Host

TLS_FLAWS = ("self-signed", "legacy", "no-redirect", "no-hsts")
"""Deliberate `tls-gateway` flaws: a self-signed certificate; TLS 1.0 accepted; the
records API served on plain 80 instead of a redirect; no HSTS header."""

CA_DIR = "/etc/opsarena/ca"
"""Where `tls-gateway` places the arena's CA key and certificate on the host."""


def tls_issue_script(target: ServiceTarget, *, self_signed: bool) -> str:
    """Bash issuing the service's key and certificate for `target.server_name` with the
    host's openssl: signed by the arena's CA (or, as a flaw, self-signed), readable by the
    service's user only."""
    user, tls_dir, name = target.stem, f"{target.config_dir}/tls", target.server_name
    head = (
        "set -eu\n"
        f"id -u {user} >/dev/null 2>&1 || useradd --system --no-create-home "
        f"--home-dir /nonexistent --shell /usr/sbin/nologin {user}\n"
        f"install -d -m 0750 -o root -g {user} {tls_dir}\n"
        f"cd {tls_dir}\n"
    )
    new_key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout key.pem"
    ext = f"-subj /CN={name} -addext subjectAltName=DNS:{name}"
    if self_signed:
        issue = f"openssl req -x509 {new_key} {ext} -days 30 -out cert.pem 2>/dev/null\n"
    else:
        issue = (
            f"openssl req -new {new_key} {ext} -out req.csr 2>/dev/null\n"
            f"openssl x509 -req -in req.csr -CA {CA_DIR}/ca.crt -CAkey {CA_DIR}/ca.key "
            "-CAcreateserial -days 30 -copy_extensions copy -out cert.pem 2>/dev/null\n"
        )
    return head + issue + f"chgrp {user} key.pem cert.pem && chmod 0640 key.pem cert.pem\n"


def tls_server_args(target: ServiceTarget, flaw: str | None) -> tuple[str, ...]:
    """The records server's TLS options for `tls-gateway`, with one deliberate flaw."""
    tls_dir = f"{target.config_dir}/tls"
    args = ["--tls-cert", f"{tls_dir}/cert.pem", "--tls-key", f"{tls_dir}/key.pem"]
    args += ["--plain-port", "80", "--server-name", target.server_name]
    args += ["--tls-min", "1.0" if flaw == "legacy" else "1.2"]
    if flaw == "no-redirect":
        args += ["--plain-mode", "serve"]
    if flaw != "no-hsts":
        args.append("--hsts")
    return tuple(args)


class TlsBuilder(RecordsServiceBuilder):
    """The records server over TLS with the subclass's `tls_flaw` (none by default)."""

    tls_flaw: ClassVar[str | None] = None

    def target(self, params: Mapping[str, Any]) -> ServiceTarget:
        return dataclasses.replace(service_target(params), tls=True)

    async def prepare(self, host: Host, target: ServiceTarget) -> ExecResult | None:
        return await host.exec(
            tls_issue_script(target, self_signed=self.tls_flaw == "self-signed"), timeout=60.0
        )

    def unit_options(self, target: ServiceTarget) -> dict[str, Any]:
        return {"extra_args": tls_server_args(target, self.tls_flaw)}


class ReferenceBuilder(TlsBuilder):
    """A CA-issued certificate, modern TLS, the redirect and HSTS: passes every milestone."""

    name = "reference"


class TlsSelfSignedBuilder(TlsBuilder):
    """A self-signed certificate (fails `tls-up`: certificate_untrusted)."""

    name = "tls-self-signed"
    tls_flaw = "self-signed"


class TlsLegacyBuilder(TlsBuilder):
    """Accepts TLS 1.0 (fails `modern-tls`: old_tls_accepted)."""

    name = "tls-legacy"
    tls_flaw = "legacy"


class TlsNoRedirectBuilder(TlsBuilder):
    """serves the API on plain 80 (fails `http-redirect`: no_redirect)."""

    name = "tls-no-redirect"
    tls_flaw = "no-redirect"


class TlsNoHstsBuilder(TlsBuilder):
    """no Strict-Transport-Security header (fails `hsts`: hsts_missing)."""

    name = "tls-no-hsts"
    tls_flaw = "no-hsts"


BUILDERS: tuple[type[ScriptedBuilder], ...] = (
    ReferenceBuilder,
    IdleBuilder,
    TlsSelfSignedBuilder,
    TlsLegacyBuilder,
    TlsNoRedirectBuilder,
    TlsNoHstsBuilder,
)
