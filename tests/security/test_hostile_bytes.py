"""Red team: bytes that are not UTF-8 in everything a check reads from a host.

A competitor is root in its host: it names files, processes and HTTP answers as it likes.
Each attack is planted as a competitor would (through `Host.exec` / `write_file`), then
judged by a real `Referee` on the real host whose every event goes through the
controller's path (typed by `parse_data`, appended to a real SQLite log):

- a file its service user may write, outside the data directory, named `/opt/plant/\\xff`
  (the walk lists it as U+DCFF): write-sandbox fails, the name shown as `\\xff`;
- the service's process named `\\xff\\xfe` (its comm, `prctl(PR_SET_NAME)`) and holding a second
  port: only-listener fails naming it; the port-ownership check of service-up, which
  reads every host process's /proc status, still judges;
- HTTP answers whose headers and body carry `\\xff`: health and write-read fail cleanly;
- a TLS certificate (signed with the CA key the host holds, as a competitor may) whose
  subject carries the bytes `\\xff\\xfe`: tls-up judges it and logs its subject.
  (OpenSSL will not even load a certificate whose UTF8String, BMPString or
  UniversalString name is not valid text, so such a name never reaches a check.)

Each verdict is `failed` (or referee_error), logged, the log's chain intact: before the
fix logging the first raised `UnicodeEncodeError` and ended the match as `aborted`. A
whole match shows it end to end: a competitor that plants `/opt/plant/\\xff` fails
write-sandbox, one whose result cannot be logged at all gets a referee_error, their
neighbour wins, the match finishes as any other.
"""

from __future__ import annotations

import asyncio
import datetime
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from opsarena.agents import Agent, AgentContext, AgentOutcome
from opsarena.agents.competitors import competitor_from_cli
from opsarena.agents.registry import register_agent_kind
from opsarena.agents.scripted import ScriptedAgent
from opsarena.challenges import Challenge, builtin_challenge
from opsarena.hosts import Host, get_driver
from opsarena.match.controller import Controller, MatchPlan
from opsarena.match.events import parse_data
from opsarena.match.fold import fold_events
from opsarena.referee.contract import CheckContext, Verdict, get_check, register_check
from opsarena.referee.referee import Referee
from opsarena.store import SqliteEventStore, StoredEvent, chain_problems
from tests.conftest import SharedHosts, new_match_id, podman_names
from tests.hardening.hostile import REPLAY_PORT, STAGE_PORT, on_port, stage, start_hostile_server
from tests.security.red_team import HEALTH, USER, deploy, sh, wait_listening

pytestmark = pytest.mark.hosts

HARDENED = builtin_challenge("hardened-service")
RECORDS = builtin_challenge("durable-records")
SEED = b"hostile-bytes-seed"
NAMED = (
    "import ctypes, socket, sys\n" + HEALTH + "ctypes.CDLL(None).prctl(15, b'\\xff\\xfe', 0, 0, 0)"
    "  # PR_SET_NAME: comm is not UTF-8\n"
    "extra = socket.socket()\n"
    "extra.bind(('0.0.0.0', 9999))\n"
    "extra.listen(1)\n"
    "serve(bound())\n"
)
"""The service, named `\\xff\\xfe`, holding 8080 (healthy) and 9999 (one port too many)."""


class Judge:
    """A real referee judging one host, its events appended to a real SQLite log."""

    def __init__(self, store: SqliteEventStore, match_id: str) -> None:
        self.store, self.match_id = store, match_id

    async def emit(self, kind: str, data: dict[str, Any]) -> None:
        event = parse_data(kind, data)  # as the controller logs the referee's events
        await self.store.append(self.match_id, event.event_type, event.model_dump(mode="json"), 0)

    async def __call__(
        self, host: Host, challenge: Challenge, milestone: str
    ) -> tuple[Verdict, StoredEvent]:
        """One attempt at `milestone` on `host`; its verdict and its logged attempt_result."""
        only = challenge.model_copy(update={"milestones": [challenge.milestone(milestone)]})
        referee = Referee(only, seed=SEED, emit=self.emit, clock=lambda: 0)
        referee.add_territory(host.territory, host)
        verdict = await referee.evaluate_next(host.territory)
        assert verdict is not None
        events = await self.store.read(self.match_id)
        assert not chain_problems([e.link() for e in events])
        result = next(e for e in reversed(events) if e.type == "attempt_result")
        assert result.data["milestone"] == milestone
        assert result.data["verdict"] == verdict.outcome
        return verdict, result


@pytest.fixture
def judge(tmp_path: Path) -> Judge:
    return Judge(SqliteEventStore(tmp_path / "log.db"), "hostile-bytes")


@pytest.fixture(scope="module")
async def named_host(shared_hosts: SharedHosts) -> AsyncIterator[Host]:
    """A hardened-service host whose service is named `\\xff\\xfe` and may write one file
    outside the data directory, named `/opt/plant/\\xff`."""
    host = await shared_hosts("named")
    await deploy(host, NAMED, f"User={USER}\nNoNewPrivileges=yes\n")
    await sh(
        host,
        "mkdir -m 0755 /opt/plant\n"
        f"touch /opt/plant/$(printf '\\377') && chown {USER} /opt/plant/*\n"
        "systemctl is-active --quiet builder-app.service\n"
        "grep -q $(printf '^Name:\\t\\377\\376$') /proc/$(systemctl show -P MainPID "
        "builder-app.service)/status\n",
    )
    yield host


async def test_a_planted_file_named_with_a_non_utf8_byte_fails_write_sandbox_logged(
    named_host: Host, judge: Judge
) -> None:
    verdict, logged = await judge(named_host, HARDENED, "write-sandbox")
    assert (verdict.outcome, verdict.failure_reason) == ("failed", "writable_outside_data")
    detail = logged.data["failure_detail"]
    assert "/opt/plant/\\xff (-rw-r--r--" in detail, detail  # rendered from its bytes
    assert "\\xff\\xfe:" in detail, detail  # the holder's name, escaped too


async def test_a_process_named_with_non_utf8_bytes_is_judged_and_logged(
    named_host: Host, judge: Judge
) -> None:
    others, logged = await judge(named_host, HARDENED, "only-listener")
    assert (others.outcome, others.failure_reason) == ("failed", "unexpected_listener")
    assert "port 9999 held by pid" in logged.data["failure_detail"]
    assert "\\xff\\xfe uid" in logged.data["failure_detail"], logged.data
    user, _ = await judge(named_host, HARDENED, "service-user")
    assert user.outcome == "passed", user  # the name changes nothing about the user
    # The port's ownership is read from every host process's /proc status: the name
    # made that read raise (a referee_error every attempt), it must judge instead.
    up, logged = await judge(named_host, RECORDS, "service-up")
    assert up.outcome == "passed", up
    assert logged.data["points"] > 0


@pytest.fixture(scope="module")
async def replay_host(shared_hosts: SharedHosts) -> AsyncIterator[Host]:
    host = await shared_hosts("replay")
    await start_hostile_server(host, {"stage": STAGE_PORT, "replay": REPLAY_PORT})
    yield host


@pytest.mark.parametrize(
    ("milestone", "answer", "reason"),
    [
        (
            "service-up",
            b"HTTP/1.1 200 OK\r\nX-A: \xff\xfe\r\nContent-Length: 7\r\n\r\nready\xff\xfe",
            "wrong_body",
        ),
        (
            "service-up",
            b"HTTP/1.1 200 OK\r\nX-\xff\xfe: \xff\r\nContent-Length: 5\r\n\r\nready",
            "protocol_error",
        ),
        (
            "service-up",
            b"HTTP/1.1 503 \xff\xfe\r\nContent-Length: 2\r\n\r\n\xff\xfe",
            "bad_status",
        ),
        (
            "write-read",
            b"HTTP/1.1 201 \xff\r\nLocation: /\xff\r\nContent-Length: 2\r\n\r\n\xff\xfe",
            None,
        ),
    ],
)
async def test_http_answers_with_non_utf8_bytes_fail_cleanly_and_are_logged(
    replay_host: Host, judge: Judge, milestone: str, answer: bytes, reason: str | None
) -> None:
    challenge = on_port(RECORDS, REPLAY_PORT)
    await stage(replay_host, answer)
    verdict, logged = await judge(replay_host, challenge, milestone)
    assert verdict.outcome == "failed", verdict
    if reason is not None:
        assert verdict.failure_reason == reason, verdict
    logged.data["failure_detail"].encode()


class Planter(Agent):
    """Plants a world-writable file named `/opt/plant/\\xff`, then builds as `reference`."""

    model = "scripted/planter"

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        planted = await ctx.host.exec(
            "install -d -m 0755 /opt/plant && install -m 0666 /dev/null /opt/plant/$'\\xff'",
            timeout=30,
        )
        if not planted.ok:
            return AgentOutcome("failed", False, "could not plant", "player")
        # The reference of the challenge being played (its directory is in the params).
        return await ScriptedAgent("reference").run(ctx)


register_agent_kind("test-planter", lambda spec, settings, env: Planter(), arg=None)


@register_check("test-write-sandbox-unloggable-for-crasher")
async def unloggable_for_crasher(host: Host, ctx: CheckContext) -> Verdict:
    """write-sandbox; but the territory `crasher` gets a result no log can hold (a stand-in
    for any exception while judging an attempt outside its check)."""
    if ctx.territory == "crasher":
        return Verdict.passed({"unloggable": object()})
    return await get_check("write-sandbox")(host, ctx)


async def test_a_match_with_a_planted_non_utf8_name_finishes_as_any_other(tmp_path: Path) -> None:
    hardened = builtin_challenge("hardened-service")
    last = [m.id for m in hardened.milestones].index("write-sandbox")
    sandbox = hardened.milestones[last].model_copy(
        update={"check": "test-write-sandbox-unloggable-for-crasher"}
    )
    plan = MatchPlan(
        # Up to write-sandbox: the reboot milestone adds a minute and nothing to the attack.
        challenge=hardened.model_copy(
            update={"milestones": [*hardened.milestones[:last], sandbox], "settle_s": 5.0}
        ),
        competitors=[
            competitor_from_cli("planter", "test-planter"),
            competitor_from_cli("crasher", "scripted:reference"),
            competitor_from_cli("honest", "scripted:reference"),
        ],
        time_limit_s=240.0,
        match_id=new_match_id("bytes"),
        drain_s=2.0,
        finish="all",  # the planter is judged to its end, however fast the honest one is
    )
    try:
        with SqliteEventStore(tmp_path / "log.db") as store:
            record = await Controller(plan, store).run()
            events = await store.read(plan.match_id)
        assert podman_names(plan.match_id) == []  # the match removed its hosts itself
    finally:
        await asyncio.shield(get_driver("podman").cleanup(match_id=plan.match_id))
    assert (record.match_state, record.finish_reason) == ("finished", "all competitors finished")
    assert record.winner == "honest"
    planted = record.territories["planter"].milestones["write-sandbox"]
    assert planted.failure_reason == "writable_outside_data", planted
    assert "/opt/plant/\\xff (-rw-rw-rw-" in (planted.failure_detail or ""), planted
    crashed = record.territories["crasher"].milestones["write-sandbox"]
    assert (crashed.passed, crashed.failure_reason) == (False, "internal_error"), crashed
    assert "judging write-sandbox attempt" in (crashed.failure_detail or ""), crashed
    assert record.infrastructure_failures >= 1
    assert not chain_problems([e.link() for e in events])
    assert fold_events(events).model_dump_json() == record.model_dump_json()


TLS = builtin_challenge("tls-gateway")
TLS_SERVER = """import socket, ssl
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/opt/tls/cert.pem", "/opt/tls/key.pem")
listener = socket.socket(socket.AF_INET6)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
listener.bind(("::", 443))
listener.listen(16)
while True:
    conn, _ = listener.accept()
    try:
        tls = context.wrap_socket(conn, server_side=True)
        tls.recv(65536)
        tls.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 5\\r\\n\\r\\nready")
        tls.close()
    except OSError:
        conn.close()
"""


def _der(tag: int, body: bytes) -> bytes:
    size = len(body)
    if size < 0x80:
        return bytes([tag, size]) + body
    length = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(length)]) + length + body


def hostile_leaf(seed: bytes, raw: bytes) -> tuple[bytes, bytes]:
    """A certificate for the brief's name, signed by the match's CA, whose subject's
    organisation is the bytes `raw` as a T61String (no library writes those: the signed
    part is patched, then signed again); with its key, both PEM."""
    tls = sys.modules[get_check("tls-health").__module__]
    ca_pem, ca_cert = tls.ca_pair(seed)
    ca_key = serialization.load_pem_private_key(ca_pem, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    name, key = tls.server_name(seed), ec.generate_private_key(ec.SECP256R1())
    marker = "Q" * len(raw)
    subject = [
        x509.NameAttribute(NameOID.COMMON_NAME, name),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, marker),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(x509.load_pem_x509_certificate(ca_cert).subject)
        .public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC))
        .not_valid_after(datetime.datetime(2090, 1, 1, tzinfo=datetime.UTC))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    utf8 = bytes([0x0C, len(raw)]) + marker.encode()
    tbs = cert.tbs_certificate_bytes.replace(utf8, bytes([0x14, len(raw)]) + raw)
    algorithm = _der(0x30, _der(0x06, bytes.fromhex("2a8648ce3d040302")))  # ecdsa-with-SHA256
    signature = _der(0x03, b"\x00" + ca_key.sign(tbs, ec.ECDSA(hashes.SHA256())))
    pem = ssl.DER_cert_to_PEM_cert(_der(0x30, tbs + algorithm + signature)).encode()
    plain = serialization.NoEncryption()
    encoding, form = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    return pem, key.private_bytes(encoding, form, plain)


async def test_a_tls_name_with_non_utf8_bytes_is_judged_and_logged(
    shared_hosts: SharedHosts, judge: Judge
) -> None:
    host = await shared_hosts("tls")
    cert, key = hostile_leaf(SEED, b"\xff\xfe")
    await host.write_file("/opt/tls/cert.pem", cert)
    await host.write_file("/opt/tls/key.pem", key, mode=0o600)
    await host.write_file("/opt/tls_server.py", TLS_SERVER.encode())
    await sh(host, "systemd-run --unit=builder-app /usr/bin/python3 /opt/tls_server.py\n")
    await wait_listening(host, 443)
    verdict, logged = await judge(host, TLS, "tls-up")
    assert verdict.outcome == "passed", verdict
    # OpenSSL reads a T61String as Latin-1: the bytes arrive as the text "\xff\xfe".
    assert "('organizationName', '\xff\xfe')" in logged.data["evidence"]["subject"], logged.data
