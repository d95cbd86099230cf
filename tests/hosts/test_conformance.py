"""Conformance suite: every sentence of the `Host` contract, on every registered driver.

Tests that only run commands share one host per module; tests that reboot or
restart make their own. Every host is removed at teardown, even after a failure.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from opsarena.errors import (
    HostFileError,
    ServiceNotRunningError,
    UnitMissingError,
)
from opsarena.hosts import Host, HostDriver, HostSpec
from tests.conftest import TEST_IMAGE, new_match_id

pytestmark = pytest.mark.hosts

SERVER = (
    "import http.server, socketserver\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = b'hello from ' + self.path.encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers(); self.wfile.write(body)\n"
    "socketserver.TCPServer.allow_reuse_address = True\n"
    "http.server.HTTPServer(('127.0.0.1', 8080), H).serve_forever()\n"
)


async def install_unit(host: Host, name: str, exec_start: str, *, enable: bool) -> None:
    unit = (
        "[Unit]\nDescription=conformance test unit\n\n"
        f"[Service]\nExecStart={exec_start}\nRestart=always\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
    await host.write_file(f"/etc/systemd/system/{name}", unit.encode())
    action = "enable --now" if enable else "start"
    result = await host.exec(f"systemctl daemon-reload && systemctl {action} {name}", timeout=30)
    assert result.exit_code == 0, result.stderr


async def start_server(host: Host) -> None:
    """Run SERVER on 127.0.0.1:8080 in `host` and return once it answers."""
    await host.write_file("/opt/conformance/server.py", SERVER.encode())
    started = await host.exec(
        "systemd-run --unit conf-http python3 /opt/conformance/server.py && "
        "for i in $(seq 200); do curl -s localhost:8080/ >/dev/null && exit 0; sleep 0.05; done; "
        "exit 1",
        timeout=20,
    )
    assert started.exit_code == 0, started.stderr


async def unit_active(host: Host, name: str) -> str:
    result = await host.exec(["systemctl", "is-active", name], timeout=10)
    return result.stdout.decode().strip()


async def http_get(host: Host, port: int, path: str) -> bytes:
    reader, writer = await host.connect(port)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


# --- exec -------------------------------------------------------------------


async def test_exec_passes_exit_codes_and_separates_streams(shared_host: Host) -> None:
    result = await shared_host.exec("echo out; echo err >&2; exit 7", timeout=10)
    assert (result.exit_code, result.stdout, result.stderr) == (7, b"out\n", b"err\n")
    assert not result.truncated and not result.timed_out
    ok = await shared_host.exec(["true"], timeout=10)
    assert ok.exit_code == 0 and ok.ok


async def test_exec_list_is_not_split_by_a_shell(shared_host: Host) -> None:
    result = await shared_host.exec(["printf", "%s|", "a b", "$HOME", ";"], timeout=10)
    assert result.stdout == b"a b|$HOME|;|"


async def test_exec_feeds_stdin_and_leaves_it_empty_otherwise(shared_host: Host) -> None:
    data = bytes(range(256)) * 64
    fed = await shared_host.exec(["sha256sum"], timeout=10, input=data)
    import hashlib

    assert fed.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    empty = await shared_host.exec(["wc", "-c"], timeout=10)
    assert empty.stdout.strip() == b"0"


async def test_exec_runs_as_the_given_user(shared_host: Host) -> None:
    assert (await shared_host.exec(["id", "-un"], timeout=10)).stdout == b"root\n"
    nobody = await shared_host.exec(["id", "-un"], timeout=10, user="nobody")
    assert nobody.stdout == b"nobody\n"


async def test_timed_out_command_is_killed_inside_the_host(shared_host: Host) -> None:
    marker = f"sleep {4000 + os.getpid() % 1000}.5"
    result = await shared_host.exec(f"{marker} & {marker}; echo never", timeout=1.0)
    assert result.timed_out and result.exit_code == 124
    assert b"never" not in result.stdout
    # "[s]leep" matches the sleeps but not this pgrep's own command line.
    left = await shared_host.exec(["pgrep", "-f", f"[s]{marker[1:]}"], timeout=10)
    assert left.exit_code == 1, f"processes survived the timeout: {left.stdout!r}"


async def test_large_output_is_truncated_and_flagged(shared_host: Host) -> None:
    result = await shared_host.exec(
        "head -c 3000000 /dev/zero; head -c 10 /dev/zero >&2", timeout=30, output_limit=1 << 20
    )
    assert result.truncated and len(result.stdout) == 1 << 20
    small = await shared_host.exec("head -c 100 /dev/zero", timeout=10, output_limit=50)
    assert small.truncated and len(small.stdout) == 50


async def test_a_command_flooding_past_the_limit_is_ended_with_what_writes_its_pipes(
    shared_host: Host,
) -> None:
    """Past `output_limit` the command is ended, not read away until its timeout: its
    group and a child that left the group but still writes the exec's pipe are killed; a
    child that left the group and its pipes (a daemon it started) is not."""
    marker = f"flood-{os.getpid()}"
    result = await shared_host.exec(
        f"setsid sleep 1000{marker[-3:]} >/dev/null 2>&1 < /dev/null & "
        # (the daemon is on its own once it is in a session of its own)
        'until [ "$(ps -o sid= -p $!)" != "$(ps -o sid= -p $$)" ]; do sleep 0.01; done; '
        f"setsid bash -c 'exec -a {marker}-escaped cat /dev/zero' & "
        f"exec -a {marker}-group cat /dev/zero",
        timeout=60,
        output_limit=1 << 20,
    )
    try:
        assert result.truncated and not result.timed_out, result
        assert len(result.stdout) == 1 << 20
        left = await shared_host.exec(["pgrep", "-f", f"^[{marker[0]}]{marker[1:]}"], timeout=10)
        assert left.exit_code == 1, f"the flood survived its exec: {left.stdout!r}"
        daemon = await shared_host.exec(["pgrep", "-f", f"[s]leep 1000{marker[-3:]}"], timeout=10)
        assert daemon.exit_code == 0, "a process that left the exec was killed with it"
    finally:
        await shared_host.exec(["pkill", "-f", f"[s]leep 1000{marker[-3:]}"], timeout=10)


# --- files ------------------------------------------------------------------


async def test_binary_file_round_trip_creates_parents(shared_host: Host) -> None:
    data = os.urandom(3 << 20) + bytes(range(256)) + b"\r\n\0"
    await shared_host.write_file("/var/lib/conformance/deep/er/blob.bin", data, mode=0o600)
    assert await shared_host.read_file("/var/lib/conformance/deep/er/blob.bin") == data
    mode = await shared_host.exec(
        ["stat", "-c", "%a", "/var/lib/conformance/deep/er/blob.bin"], timeout=10
    )
    assert mode.stdout.strip() == b"600"
    await shared_host.write_file("/var/lib/conformance/deep/er/blob.bin", b"")
    assert await shared_host.read_file("/var/lib/conformance/deep/er/blob.bin") == b""


async def test_file_errors_are_clear(shared_host: Host) -> None:
    with pytest.raises(HostFileError, match="does-not-exist"):
        await shared_host.read_file("/does-not-exist")
    with pytest.raises(HostFileError, match="not an absolute path"):
        await shared_host.read_file("relative/path")
    with pytest.raises(HostFileError, match="/etc"):
        await shared_host.read_file("/etc")
    with pytest.raises(HostFileError, match="larger than"):
        await shared_host.read_file("/etc/passwd", limit=10)
    with pytest.raises(HostFileError):
        await shared_host.write_file("/etc/passwd/below-a-file", b"x")


# --- connect ----------------------------------------------------------------


async def test_fresh_host_serves_nothing_on_8080(shared_host: Host) -> None:
    with pytest.raises(ConnectionRefusedError):
        await shared_host.connect(8080)


async def test_connect_reaches_a_server_inside_the_host(shared_host: Host) -> None:
    await start_server(shared_host)
    answer = await http_get(shared_host, 8080, "/probe")
    assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"hello from /probe")
    await shared_host.exec(["systemctl", "stop", "conf-http"], timeout=10)


async def test_connect_rejects_bad_ports(shared_host: Host) -> None:
    for port in (0, 65536, -1):
        with pytest.raises(ValueError):
            await shared_host.connect(port)


# --- services and reboots -----------------------------------------------------


async def test_restart_service_changes_main_pid_and_fails_clearly(driver: HostDriver) -> None:
    match_id = new_match_id("conf")
    try:
        host = await driver.create(HostSpec(match_id=match_id, territory="svc", image=TEST_IMAGE))
        await install_unit(host, "keeper.service", "/bin/sleep infinity", enable=True)
        before = await host.exec(
            ["systemctl", "show", "-P", "MainPID", "keeper.service"], timeout=10
        )
        restart = await host.restart_service("keeper.service")
        new_pid = restart.main_pid
        assert new_pid not in (0, int(before.stdout))
        assert host.last_restart == restart
        assert [proc.inner for proc in restart.before] == [int(before.stdout)]
        assert restart.killed == ()  # systemd stopped the old process itself
        members = await host.unit_members("keeper.service")
        assert [proc.inner for proc in members] == [new_pid]
        after = await host.exec(
            ["systemctl", "show", "-P", "MainPID", "keeper.service"], timeout=10
        )
        assert int(after.stdout) == new_pid
        with pytest.raises(UnitMissingError, match=r"nope\.service"):
            await host.restart_service("nope.service")
        await host.exec(["systemctl", "stop", "keeper.service"], timeout=10)
        with pytest.raises(ServiceNotRunningError, match=r"keeper\.service"):
            await host.restart_service("keeper.service")
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))


@pytest.mark.parametrize("hard", [False, True], ids=["clean", "hard"])
async def test_reboot_keeps_disk_and_enabled_units_only(driver: HostDriver, hard: bool) -> None:
    match_id = new_match_id("conf")
    try:
        host = await driver.create(HostSpec(match_id=match_id, territory="boot", image=TEST_IMAGE))
        assert host.boots == 1
        await install_unit(host, "keeper.service", "/bin/sleep infinity", enable=True)
        await install_unit(host, "loner.service", "/bin/sleep infinity", enable=False)
        assert await unit_active(host, "loner.service") == "active"
        # /dev/shm is memory too: a "RAM disk" must not outlive a reboot (podman keeps a
        # container's shm mount over stop and start; the driver empties it).
        for path in ("/var/lib/kept/file", "/run/gone", "/tmp/gone", "/dev/shm/gone"):
            await host.write_file(path, b"before reboot")
        await host.exec("mkdir -p /dev/shm/dir/sub && ln -s / /dev/shm/dir/root", timeout=10)
        old_boot = await host.exec(["cat", "/proc/1/stat"], timeout=10)

        await host.reboot(hard=hard)

        assert host.boots == 2
        assert await host.read_file("/var/lib/kept/file") == b"before reboot"
        shm = await host.exec("ls -A /dev/shm", timeout=10)
        assert shm.stdout == b""
        for path in ("/run/gone", "/tmp/gone"):
            with pytest.raises(HostFileError):
                await host.read_file(path)
        assert await unit_active(host, "keeper.service") == "active"
        assert await unit_active(host, "loner.service") == "inactive"
        new_boot = await host.exec(["cat", "/proc/1/stat"], timeout=10)
        # Field 22 of /proc/1/stat is init's start time: a new boot has a new one.
        assert new_boot.stdout.split()[21] != old_boot.stdout.split()[21]
        await host.reboot(hard=not hard)
        assert host.boots == 3
        assert await unit_active(host, "keeper.service") == "active"
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))


# --- isolation and cleanup ----------------------------------------------------


async def test_two_hosts_cannot_reach_each_other(driver: HostDriver) -> None:
    match_id = new_match_id("conf")
    try:
        a, b = await asyncio.gather(
            driver.create(HostSpec(match_id=match_id, territory="a", image=TEST_IMAGE)),
            driver.create(HostSpec(match_id=match_id, territory="b", image=TEST_IMAGE)),
        )
        await start_server(b)
        assert (await http_get(b, 8080, "/")).startswith(b"HTTP/1.0 200")
        # From inside a: only loopback, no route anywhere, and b's server is not on a's loopback.
        links = await a.exec(["ip", "-o", "link", "show"], timeout=10)
        assert [line.split(":")[1].strip() for line in links.stdout.decode().splitlines()] == ["lo"]
        routes = await a.exec(["ip", "route", "show"], timeout=10)
        assert routes.stdout.strip() == b""
        for target in ("127.0.0.1:8080", "b:8080"):
            tried = await a.exec(
                ["curl", "-sS", "--max-time", "3", f"http://{target}/"], timeout=10
            )
            assert tried.exit_code != 0, f"{target} answered from inside host a"
        # A route lookup sends nothing; it proves no packet could leave for any address.
        for address in ("10.88.0.1", "192.168.1.1", "1.1.1.1"):
            lookup = await a.exec(["ip", "route", "get", address], timeout=10)
            assert lookup.exit_code != 0 and b"unreachable" in lookup.stderr
        ns_a = await a.exec(["readlink", "/proc/1/ns/net"], timeout=10)
        ns_b = await b.exec(["readlink", "/proc/1/ns/net"], timeout=10)
        assert ns_a.stdout != ns_b.stdout
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))


async def test_repeated_restarts_never_hit_the_start_rate_limit(driver: HostDriver) -> None:
    match_id = new_match_id("conf")
    try:
        host = await driver.create(HostSpec(match_id=match_id, territory="lim", image=TEST_IMAGE))
        # StartLimitBurst=3 would stop the unit at the 4th start within a minute.
        unit = (
            "[Unit]\nStartLimitIntervalSec=60\nStartLimitBurst=3\n\n"
            "[Service]\nExecStart=/bin/sleep infinity\n"
        )
        await host.write_file("/etc/systemd/system/limited.service", unit.encode())
        started = await host.exec("systemctl daemon-reload && systemctl start limited", timeout=30)
        assert started.exit_code == 0
        pids = {(await host.restart_service("limited.service")).main_pid for _ in range(6)}
        assert len(pids) == 6
        assert await unit_active(host, "limited.service") == "active"
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))


async def test_disk_usage_counts_writes_and_a_frozen_disk_refuses_them(
    driver: HostDriver,
) -> None:
    match_id = new_match_id("conf")
    try:
        host = await driver.create(HostSpec(match_id=match_id, territory="disk", image=TEST_IMAGE))
        before = await host.disk_usage()
        wrote = await host.exec("head -c 20000000 /dev/urandom > /var/lib/blob", timeout=60)
        assert wrote.exit_code == 0
        assert await host.disk_usage() >= before + 20_000_000
        # A file held open for writing would make the kernel refuse a read-only remount.
        holder = await host.exec(
            "systemd-run --unit holder bash -c 'exec 3>>/var/lib/held; sleep infinity'",
            timeout=10,
        )
        assert holder.exit_code == 0
        await host.freeze_disk()
        refused = await host.exec("echo more > /var/lib/more", timeout=10)
        assert refused.exit_code != 0 and b"Read-only file system" in refused.stderr
        assert len(await host.read_file("/var/lib/blob")) == 20_000_000
        assert (await host.exec("echo fine > /tmp/scratch", timeout=10)).exit_code == 0
        await host.reboot()
        still = await host.exec("echo more > /var/lib/more", timeout=10)
        assert still.exit_code != 0, "the freeze must survive a reboot"
        assert await host.wait_ready(30) in ("running", "degraded")
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))


async def test_kernel_facts_name_the_units_processes_and_the_ports_owner(
    driver: HostDriver,
) -> None:
    """`unit_members`, `port_owners` and `init_process`, read from outside the host,
    agree with what the host itself shows."""
    match_id = new_match_id("conf")
    try:
        host = await driver.create(HostSpec(match_id=match_id, territory="facts", image=TEST_IMAGE))
        init = host.init_process
        assert init is not None and init.inner == 1
        assert await host.port_owners(8080) == []
        await start_server(host)
        owners = await host.port_owners(8080)
        members = await host.unit_members("conf-http.service")
        assert owners and set(owners) <= set(members)
        main = await host.exec(["systemctl", "show", "-P", "MainPID", "conf-http"], timeout=10)
        assert [proc.inner for proc in owners] == [int(main.stdout)]
        # A process started outside the unit is not one of its members.
        outside = await host.exec("sleep 300 >/dev/null 2>&1 & echo $!", timeout=10)
        assert int(outside.stdout) not in {proc.inner for proc in members}
        with pytest.raises(UnitMissingError):
            await host.unit_members("nope.service")
    finally:
        await asyncio.shield(driver.cleanup(match_id=match_id))
