"""The scripted builders behave exactly as designed, on real hosts.

Every builder gets its own host and the same scenario, all at once: deploy, then
requests made with curl inside the host (health, writes, reads, an absent record), a
service restart, the same reads, a host reboot, the same reads. The scenario records
what it saw (a history, in Jepsen's sense); each builder's test then checks its part of
it against the design in durable-records' `builders.py`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from opsarena.agents import AgentContext, AgentOutcome
from opsarena.agents.scripted import (
    DEFAULT_UNIT,
    ScriptedAgent,
    ServiceTarget,
    check_scripted,
    get_scripted,
    scripted_names,
)
from opsarena.agents.scripted.deploy import records_unit, service_target
from opsarena.challenges.catalog import builtin_names, builtin_root
from opsarena.errors import HostError, OpsArenaError, UnknownBuilderError, UsageError
from opsarena.hosts import Host, HostSpec, get_driver
from opsarena.workloads.records.server import valid_record_id
from tests.conftest import TEST_IMAGE, new_match_id

DURABLE = builtin_root() / "durable-records"
"""The challenge whose builders these are (`scripted:NAME` resolves among them)."""

BUILDERS = ("reference", "webdav", "in-memory", "volatile", "not-enabled", "wrong-health", "idle")
# Builders whose flaw the referee's calibration matrix exercises (tests/referee/).
CALIBRATION_BUILDERS = (
    "ignore-ids", "newest-only", "binary-unsafe", "size-limited", "found-for-missing",
    "no-overwrite", "racy", "slow-start",
    # tls-gateway's, hardened-service's and incident-repair's (tests/challenges/).
    "repair-wipe", "repair-transient", "repair-collateral", "repair-standin",
    "tls-self-signed", "tls-legacy", "tls-no-redirect", "tls-no-hsts",
    "hardened-root", "hardened-planted-left", "hardened-stopped-only", "hardened-writable",
    "hardened-saved-root", "hardened-acl-writable",
    # zero-downtime-deploy's (tests/challenges/test_zero_downtime_deploy.py).
    "deploy-stop-start", "deploy-fresh-data", "deploy-newest-only", "deploy-v2-first",
    "deploy-no-command",
    # backup-restore's (tests/challenges/test_backup_restore.py).
    "backup-once", "backup-in-datadir", "backup-not-enabled", "stores-elsewhere",
    "restore-broken",
)  # fmt: skip
SMALL_ID = "rec-small"
BINARY_ID = "rec.binary_1"
ABSENT_ID = "rec-absent"
FIRST_VALUE = b"first value"
SMALL_VALUE = b"second value, \x00\xff and \r\n included"
# 1 MiB of every byte value, fixed so failures reproduce.
BINARY_VALUE = random.Random(20261203).randbytes(1024 * 1024)
PAYLOADS = {"/tmp/first": FIRST_VALUE, "/tmp/small": SMALL_VALUE, "/tmp/binary": BINARY_VALUE}
CURL_REFUSED = 7

# Runs each request given as arguments (METHOD URL PAYLOAD-FILE-OR-"-", three at a time)
# and prints, per request, "CURL-EXIT STATUS BODY-LENGTH" on a line, then the body.
CURL = r"""
while [ $# -ge 3 ]; do
  rm -f /tmp/reply
  data=(); [ "$3" != - ] && data=(--data-binary "@$3")
  code=$(curl -s -o /tmp/reply -w '%{http_code}' --max-time 10 -X "$1" "${data[@]}" "$2")
  rc=$?
  touch /tmp/reply
  printf '%s %s %s\n' "$rc" "${code:-000}" "$(stat -c %s /tmp/reply)"
  cat /tmp/reply
  shift 3
done
"""


@dataclass(frozen=True)
class Reply:
    """One request made by curl in the host: curl's exit code, the HTTP status (0 when
    there was no answer) and the body."""

    curl_exit: int
    status: int
    body: bytes = b""

    @property
    def is_2xx(self) -> bool:
        return self.curl_exit == 0 and 200 <= self.status < 300


@dataclass
class History:
    """What the scenario saw on one builder's host, step by step."""

    outcome: AgentOutcome | None = None
    replies: dict[str, Reply] = field(default_factory=dict)
    facts: dict[str, str] = field(default_factory=dict)
    error: BaseException | None = None


async def requests(host: Host, history: History, *steps: tuple[str, str, str, str]) -> None:
    """Make each request (step name, method, path, payload file in the host or "-") with
    curl in the host, in order, and record the replies under their step names."""
    port = ServiceTarget().port
    argv = ["bash", "-c", CURL, "curl"]
    for _step, method, path, payload in steps:
        argv += [method, f"http://127.0.0.1:{port}{path}", payload]
    result = await host.exec(argv, timeout=20 + 10 * len(steps), output_limit=8 * 1024 * 1024)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for step, *_request in steps:
        head, _, out = out.partition(b"\n")
        curl_exit, status, length = (int(word) for word in head.split())
        history.replies[step] = Reply(curl_exit, status, out[:length])
        out = out[length:]


async def read_back(host: Host, history: History, when: str) -> None:
    await requests(
        host,
        history,
        (f"health {when}", "GET", "/health", "-"),
        (f"get {when}", "GET", f"/records/{SMALL_ID}", "-"),
        (f"get-binary {when}", "GET", f"/records/{BINARY_ID}", "-"),
    )


async def scenario(host: Host, builder: str, history: History) -> None:
    context = AgentContext(
        match_id=host.match_id,
        territory=host.territory,
        brief="deploy the durable-records service",
        host=host,
        deadline=time.monotonic() + 60,
    )
    history.outcome = await get_scripted(builder, DURABLE).run(context)

    await requests(
        host,
        history,
        ("health", "GET", "/health", "-"),
        ("put new", "PUT", f"/records/{SMALL_ID}", "/tmp/first"),
        ("put again", "PUT", f"/records/{SMALL_ID}", "/tmp/small"),
        ("put binary", "PUT", f"/records/{BINARY_ID}", "/tmp/binary"),
        ("get absent", "GET", f"/records/{ABSENT_ID}", "-"),
    )
    await read_back(host, history, "before faults")
    # ss cannot name other users' processes here (no CAP_SYS_PTRACE): ps can.
    facts = await host.exec(
        f"ss -Hltn 'sport = :{ServiceTarget().port}' | wc -l; "
        'echo "$(ps -o comm= -u builder-app 2>/dev/null | sort -u | paste -sd,)"; '
        f"systemctl show -P Restart {DEFAULT_UNIT}",
        timeout=10,
    )
    listening, processes, restart = facts.stdout.decode().splitlines()
    history.facts.update(
        {"listening": listening, "service processes": processes, "restart setting": restart}
    )

    try:
        await host.restart_service(DEFAULT_UNIT)
        history.facts["restart"] = "restarted"
    except HostError as exc:
        history.facts["restart"] = type(exc).__name__
    await wait_for_listener(host)
    await read_back(host, history, "after restart")

    await host.reboot()
    await wait_for_listener(host)
    await read_back(host, history, "after reboot")
    enabled = await host.exec(["systemctl", "is-enabled", DEFAULT_UNIT], timeout=10)
    history.facts["enabled"] = enabled.stdout.decode().strip()


async def wait_for_listener(host: Host, seconds: float = 10.0) -> None:
    """Give the unit (if any, and if it is meant to come back) time to listen again,
    the way the referee waits for /health after a fault."""
    url = f"http://127.0.0.1:{ServiceTarget().port}/health"
    await host.exec(
        f"systemctl is-enabled --quiet {DEFAULT_UNIT} || systemctl is-active --quiet "
        f"{DEFAULT_UNIT} || exit 0; for _ in $(seq {int(seconds * 10)}); do "
        f"curl -s -o /dev/null --max-time 1 {url} && exit 0; sleep 0.1; done",
        timeout=seconds + 10,
    )


@pytest.fixture(scope="module")
async def histories() -> AsyncIterator[dict[str, History]]:
    """Every builder's scenario, run at once on hosts of one match (removed at the end).

    Module-scoped so that the seven scenarios run in parallel and each builder still has
    its own test; `host_factory` is per test, so this makes its hosts the same way."""
    driver = get_driver("podman")
    match_id = new_match_id("scr")
    result = {builder: History() for builder in BUILDERS}

    async def run(builder: str) -> None:
        try:
            host = await driver.create(
                HostSpec(match_id=match_id, territory=builder, image=TEST_IMAGE)
            )
            for path, payload in PAYLOADS.items():
                await host.write_file(path, payload)
            await scenario(host, builder, result[builder])
        except Exception as exc:
            result[builder].error = exc

    try:
        await asyncio.gather(*(run(builder) for builder in BUILDERS))
        yield result
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))


def history_of(histories: dict[str, History], builder: str) -> History:
    history = histories[builder]
    if history.error is not None:
        raise history.error
    assert history.outcome is not None
    assert history.outcome.terminal_state == "completed", history.outcome
    assert history.outcome.successful is True
    assert history.outcome.terminal_detail.startswith(builder)
    return history


def assert_serves_records(history: History, when: str) -> None:
    replies = history.replies
    assert replies[f"health {when}"] == Reply(0, 200, b"ready")
    assert replies[f"get {when}"] == Reply(0, 200, SMALL_VALUE)
    binary = replies[f"get-binary {when}"]
    assert (binary.curl_exit, binary.status) == (0, 200)
    assert binary.body == BINARY_VALUE, f"{len(binary.body)} bytes came back, not the 1 MiB written"


def assert_lost_records(history: History, when: str) -> None:
    replies = history.replies
    assert replies[f"health {when}"] == Reply(0, 200, b"ready")
    assert replies[f"get {when}"].status == 404
    assert replies[f"get-binary {when}"].status == 404


def assert_writes_work(history: History) -> None:
    replies = history.replies
    assert replies["health"] == Reply(0, 200, b"ready")
    assert replies["put new"].is_2xx, replies["put new"]
    assert replies["put again"].is_2xx, replies["put again"]
    assert replies["put binary"].is_2xx, replies["put binary"]
    assert replies["get absent"].status == 404
    assert_serves_records(history, "before faults")
    assert history.facts["restart"] == "restarted"


# --- builders that pass everything ------------------------------------------------------


@pytest.mark.hosts
@pytest.mark.parametrize("builder", ["reference", "webdav"])
async def test_durable_builders_keep_records_across_restart_and_reboot(
    histories: dict[str, History], builder: str
) -> None:
    history = history_of(histories, builder)
    assert_writes_work(history)
    assert_serves_records(history, "after restart")
    assert_serves_records(history, "after reboot")
    assert history.facts["enabled"] == "enabled"
    assert history.facts["restart setting"] == "always"


@pytest.mark.hosts
async def test_webdav_is_served_by_nginx_not_python(histories: dict[str, History]) -> None:
    facts = history_of(histories, "webdav").facts
    assert facts["listening"] == "1"
    assert facts["service processes"] == "nginx"


@pytest.mark.hosts
async def test_reference_is_served_by_the_python_records_server(
    histories: dict[str, History],
) -> None:
    facts = history_of(histories, "reference").facts
    assert facts["listening"] == "1"
    assert facts["service processes"] == "python3"


# --- builders that fail one milestone by design ------------------------------------------


@pytest.mark.hosts
async def test_in_memory_loses_records_at_restart(histories: dict[str, History]) -> None:
    history = history_of(histories, "in-memory")
    assert_writes_work(history)
    assert_lost_records(history, "after restart")


@pytest.mark.hosts
async def test_volatile_keeps_records_across_restart_not_reboot(
    histories: dict[str, History],
) -> None:
    history = history_of(histories, "volatile")
    assert_writes_work(history)
    assert_serves_records(history, "after restart")
    assert_lost_records(history, "after reboot")


@pytest.mark.hosts
async def test_not_enabled_survives_restart_but_is_down_after_reboot(
    histories: dict[str, History],
) -> None:
    history = history_of(histories, "not-enabled")
    assert_writes_work(history)
    assert_serves_records(history, "after restart")
    assert history.replies["health after reboot"].curl_exit == CURL_REFUSED
    assert history.facts["enabled"] == "disabled"


@pytest.mark.hosts
async def test_wrong_health_answers_ok(histories: dict[str, History]) -> None:
    history = history_of(histories, "wrong-health")
    assert history.replies["health"] == Reply(0, 200, b"ok")
    assert history.replies["put new"].is_2xx


@pytest.mark.hosts
async def test_idle_leaves_nothing_listening(histories: dict[str, History]) -> None:
    history = history_of(histories, "idle")
    assert history.replies["health"].curl_exit == CURL_REFUSED
    assert history.facts["restart"] == "UnitMissingError"
    assert history.replies["health after reboot"].curl_exit == CURL_REFUSED


# --- registry and pure decisions ----------------------------------------------------------


DURABILITY_BUILDERS = ("no-fsync", "ack-before-write", "no-restart", "fsync-no-dirsync")
"""Calibrated against the crash and power-cut faults in tests/hosts/test_faults.py."""


def test_every_challenge_directory_knows_its_builders() -> None:
    found: set[str] = set()
    for challenge in builtin_names():
        names = scripted_names(builtin_root() / challenge)
        assert "reference" in names and "idle" in names, challenge
        for name in names:
            builder = get_scripted(name, builtin_root() / challenge)
            assert builder.name == name and builder.model == f"scripted/{name}"
        found |= set(names)
    assert found == set(BUILDERS + CALIBRATION_BUILDERS + DURABILITY_BUILDERS)
    # A challenge without builders.py (a lone TOML file) has the records reference and idle.
    assert scripted_names(None) == ["idle", "reference"]


def test_a_builder_of_another_challenge_is_unknown_in_this_one() -> None:
    assert "in-memory" in scripted_names(DURABLE)
    with pytest.raises(UnknownBuilderError, match="'in-memory'"):
        get_scripted("in-memory", builtin_root() / "tls-gateway")


def test_the_scripted_agent_resolves_its_name_in_the_played_challenge() -> None:
    agent = ScriptedAgent("in-memory")  # built before the challenge is known
    assert agent.model == "scripted/in-memory"
    assert agent.builder({"challenge_dir": str(DURABLE)}).name == "in-memory"
    with pytest.raises(UnknownBuilderError):  # the match forfeits it (a player's failure)
        agent.builder({"challenge_dir": str(builtin_root() / "tls-gateway")})
    with pytest.raises(UnknownBuilderError):  # no directory: the default builders only
        agent.builder({})
    assert ScriptedAgent("reference").builder({}).name == "reference"
    with pytest.raises(UnknownBuilderError, match="'in-memory'"):
        check_scripted("in-memory", [builtin_root() / "tls-gateway", None])
    check_scripted("in-memory", [builtin_root() / "tls-gateway", DURABLE])


def test_unknown_builder_is_a_one_line_error_listing_the_names() -> None:
    with pytest.raises(UnknownBuilderError) as caught:
        get_scripted("nope", DURABLE)
    assert isinstance(caught.value, OpsArenaError)
    message = str(caught.value)
    assert "\n" not in message and "'nope'" in message
    assert all(name in message for name in BUILDERS)


def test_service_target_defaults_and_rejects_bad_params() -> None:
    assert service_target({}) == ServiceTarget(port=8080, unit="builder-app.service")
    assert service_target({"port": 9000, "unit": "shop.service"}).state_dir == "/var/lib/shop"
    for bad in ({"port": 0}, {"port": "8080"}, {"port": True}, {"unit": "../x.service"},
                {"unit": "builder-app"}, {"unit": "Builder.service"}):  # fmt: skip
        with pytest.raises(UsageError):
            service_target(bad)


def test_record_ids_are_safe_file_names() -> None:
    for good in ("a", "record-17a9a70ac04b2eff", "x.y_z", "9" * 128):
        assert valid_record_id(good), good
    for bad in ("", ".", "..", ".hidden", "a/b", "a b", "é", "9" * 129, "a\n"):
        assert not valid_record_id(bad), bad


def test_records_unit_puts_records_where_the_storage_choice_says() -> None:
    target = ServiceTarget()
    units = {
        storage: records_unit(
            target, "/srv/records_server.py", storage=storage, health_body="all good", builder="x"
        )
        for storage in ("disk", "run", "memory")
    }
    assert "StateDirectory=builder-app\n" in units["disk"]
    assert "--storage /var/lib/builder-app/records" in units["disk"]
    assert "RuntimeDirectoryPreserve=yes\n" in units["run"]
    assert "--storage /run/builder-app/records" in units["run"]
    assert "--in-memory" in units["memory"] and "Directory=" not in units["memory"]
    for unit in units.values():
        assert "Restart=always\n" in unit and "WantedBy=multi-user.target\n" in unit
        assert "--health-body 'all good'" in unit
