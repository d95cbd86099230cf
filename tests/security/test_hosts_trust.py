"""Red team, host side: a competitor that is root in its host, planting each attack
exactly as it would (through `Host.exec`), gains nothing.

Each test names the boundary it proves. The arena runs no program of the host's with
its own privileges (planted systemctl/mount/timeout/bash/nsenter never run outside the
host's confinement, and nothing appears on the arena machine); a restart is confirmed
from outside (a fake systemctl in front of an in-memory service fails with
record_missing, a decoy outside the unit and a KillMode=process child are not
accepted); a frozen disk cannot be faked; no write lands on the machine's disk outside
the host's measured layer; a host cannot exhaust the arena's per-user kernel limits;
and a host cannot make user namespaces or leave its cgroup.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from opsarena.challenges import Challenge, builtin_challenge
from opsarena.errors import HostBootError
from opsarena.hosts import Host, kernel
from opsarena.referee.contract import CheckContext, Verdict, get_check
from opsarena.referee.ownership import port_ownership_verdict
from opsarena.referee.referee import Referee, enforce_table
from tests.conftest import HostFactory
from tests.security.red_team import INOTIFY_HOG, sh, wait_listening

pytestmark = pytest.mark.hosts

RECORDS_SERVER = (
    Path(__file__).parents[2] / "src" / "opsarena" / "workloads" / "records" / "server.py"
)
UNIT = "builder-app.service"
PORT = 8080
SEED = b"security-hosts"

PLANTED = """#!/bin/sh
# A competitor's wrapper: says who ran it, tries to reach the arena machine, then
# behaves like the real program so the host keeps working.
if grep -q '^Seccomp:[[:space:]]*2' /proc/self/status \\
   && ! grep -Eq '^ +0 +0 ' /proc/self/uid_map; then how=confined; else how=UNCONFINED; fi
echo "$how $0 $*" >> /var/tmp/planted.log
for parent in $PPID 1; do echo pwned > /proc/$parent/root/tmp/{marker} 2>/dev/null; done
echo pwned > /tmp/{marker}-inside 2>/dev/null
[ -x /usr/bin/{name} ] && exec /usr/bin/{name} "$@"
exec /bin/{name} "$@"
"""


def challenge() -> Challenge:
    return builtin_challenge("durable-records")


async def deploy_unit(
    host: Host, exec_start: str, *, extra: str = "", listens: bool = True
) -> None:
    """Install and start builder-app.service running `exec_start` (and wait until port
    8080 listens, when it `listens`)."""
    await host.write_file("/opt/records_server.py", RECORDS_SERVER.read_bytes())
    unit = (
        "[Unit]\nDescription=security test service\n\n"
        f"[Service]\nExecStart={exec_start}\nRestart=always\nRestartSec=200ms\n{extra}\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
    await host.write_file(f"/etc/systemd/system/{UNIT}", unit.encode())
    await sh(host, f"systemctl daemon-reload && systemctl enable --now {UNIT}")
    if listens:
        await wait_listening(host)


IN_MEMORY = f"/usr/bin/python3 /opt/records_server.py --port {PORT} --in-memory"


async def judge_until(host: Host, milestone: str) -> tuple[Verdict, list[dict[str, Any]]]:
    """Run a real referee on `host` until it has judged `milestone` (or an earlier
    milestone failed); return that verdict and the events it emitted."""
    events: list[dict[str, Any]] = []

    async def emit(kind: str, data: dict[str, Any]) -> None:
        events.append({"type": kind, **data})

    referee = Referee(challenge(), seed=SEED, emit=emit, clock=lambda: 0)
    referee.add_territory(host.territory, host)
    order = [m.id for m in challenge().milestones]
    while True:
        current = referee.first_unpassed(host.territory)
        assert current is not None
        verdict = await referee.evaluate_next(host.territory)
        assert verdict is not None
        if current.id == milestone or verdict.outcome != "passed":
            assert order.index(current.id) <= order.index(milestone)
            return verdict, events


# ---- principle 1: nothing of the host's runs with the arena's privileges ---------------


async def test_planted_programs_never_run_outside_the_hosts_confinement(
    host_factory: HostFactory,
) -> None:
    host = await host_factory("planted")
    marker = f"opsarena-planted-{secrets.token_hex(6)}"
    for name in ("systemctl", "mount", "timeout", "bash", "nsenter", "umount", "cat"):
        wrapper = PLANTED.replace("{marker}", marker).replace("{name}", name)
        for directory in ("/usr/local/sbin", "/usr/local/bin"):
            await host.write_file(f"{directory}/{name}", wrapper.encode(), mode=0o755)
    await deploy_unit(host, IN_MEMORY)
    # The competitor's own commands do run its wrappers, confined: the plant works.
    assert "confined" in await sh(host, "timeout 5 true; cat /var/tmp/planted.log")

    await host.wait_ready(30)
    restart = await host.restart_service(UNIT)
    assert restart.main_pid != 0 and not restart.killed
    await host.reboot()
    await host.freeze_disk()

    log = await host.read_file("/var/tmp/planted.log")
    assert b"UNCONFINED" not in log, log.decode(errors="replace")
    assert not Path(f"/tmp/{marker}").exists(), "a planted program wrote on the arena machine"
    assert not list(Path("/tmp").glob(f"{marker}*"))
    refused = await host.exec("echo x > /var/lib/after-freeze", timeout=10)
    assert refused.exit_code != 0 and b"Read-only file system" in refused.stderr


async def test_a_symlink_planted_for_the_bus_socket_is_refused(host_factory: HostFactory) -> None:
    host = await host_factory("symlink")
    await sh(
        host,
        "mv /run/systemd/private /run/systemd/private.real && "
        "ln -s /run/systemd/private.real /run/systemd/private",
    )
    with pytest.raises(HostBootError, match="private"):
        await host.wait_ready(3)
    await sh(host, "rm /run/systemd/private && mv /run/systemd/private.real /run/systemd/private")
    assert await host.wait_ready(30) in ("running", "degraded")


async def test_a_socket_served_by_another_program_is_refused(host_factory: HostFactory) -> None:
    """A competitor's own server on /run/systemd/private (lying `running`) is not init."""
    host = await host_factory("impostor")
    fake = (
        "import socket, os\n"
        "os.rename('/run/systemd/private', '/run/systemd/private.real')\n"
        "s = socket.socket(socket.AF_UNIX); s.bind('/run/systemd/private'); s.listen()\n"
        "open('/run/impostor-ready', 'w').close()\n"
        "while True:\n"
        "    c, _ = s.accept()\n"
        "    try:\n"
        "        c.recv(100); c.sendall(b'OK 1234\\r\\n')\n"
        "    except OSError:\n"
        "        pass\n"
    )
    await host.write_file("/opt/impostor.py", fake.encode())
    await sh(
        host,
        "systemd-run --unit impostor python3 /opt/impostor.py; for i in $(seq 100); do "
        "[ -e /run/impostor-ready ] && exit 0; sleep 0.05; done; exit 1",
    )
    with pytest.raises(HostBootError, match="not by its init"):
        await host.wait_ready(3)


# ---- principle 2: a fault's effect is confirmed from outside -------------------------


async def test_fake_systemctl_in_front_of_an_in_memory_service_fails_record_missing(
    host_factory: HostFactory,
) -> None:
    host = await host_factory("fakectl")
    await deploy_unit(host, IN_MEMORY)
    fake = (
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  restart|reset-failed|is-system-running) echo running; exit 0;;\n"
        "  show) n=$(cat /run/fakepid 2>/dev/null || echo 40000); n=$((n+1)); "
        "echo $n > /run/fakepid; echo LoadState=loaded; echo ActiveState=active; "
        "echo MainPID=$n; exit 0;;\n"
        "esac\n"
        'exec /bin/systemctl "$@"\n'
    )
    for directory in ("/usr/local/sbin", "/usr/local/bin"):
        await host.write_file(f"{directory}/systemctl", fake.encode(), mode=0o755)
    verdict, events = await judge_until(host, "service-restart")
    assert (verdict.outcome, verdict.failure_reason) == ("failed", "record_missing"), verdict
    faults = [e for e in events if e["type"] == "fault_injected"]
    assert faults and faults[-1]["ok"], faults


async def test_a_decoy_outside_the_unit_fails_service_up(host_factory: HostFactory) -> None:
    host = await host_factory("decoy")
    await deploy_unit(host, "/bin/sleep infinity", listens=False)
    await host.write_file("/opt/records_server.py", RECORDS_SERVER.read_bytes())
    await sh(host, f"systemd-run --unit decoy {IN_MEMORY}")
    await wait_listening(host)
    verdict, _events = await judge_until(host, "service-up")
    assert (verdict.outcome, verdict.failure_reason) == ("failed", "port_not_owned_by_unit")
    assert "not in builder-app.service" in (verdict.failure_detail or "")


async def test_a_decoy_started_after_service_up_fails_service_restart(
    host_factory: HostFactory,
) -> None:
    """The unit serves honestly until write-read passed; then the competitor swaps in
    a decoy outside the unit that keeps the records across the unit's restart."""
    host = await host_factory("latedecoy")
    await deploy_unit(host, IN_MEMORY)
    verdict, _events = await judge_until(host, "write-read")
    assert verdict.outcome == "passed", verdict
    # Replace the unit's server by a sleeper and serve 8080 from a decoy unit instead.
    await deploy_unit_without_wait(host, "/bin/sleep infinity")
    await sh(host, f"systemd-run --unit decoy {IN_MEMORY}")
    await wait_listening(host)
    restart_check = challenge().milestone("service-restart")

    async def inject(kind: str) -> int:
        await host.restart_service(UNIT, timeout=30)
        return 0

    ctx = CheckContext(
        challenge=challenge(), milestone=restart_check, territory=host.territory, attempt=1,
        seed=SEED, inject_fault=inject,  # type: ignore[arg-type]
    )  # fmt: skip
    verdict = enforce_table(await get_check(restart_check.check)(host, ctx))
    assert (verdict.outcome, verdict.failure_reason) == ("failed", "port_not_owned_by_unit")


async def deploy_unit_without_wait(host: Host, exec_start: str) -> None:
    unit = f"[Service]\nExecStart={exec_start}\n"
    await host.write_file(f"/etc/systemd/system/{UNIT}", unit.encode())
    await sh(host, f"systemctl daemon-reload && systemctl restart {UNIT}")


async def test_a_killmode_process_child_holding_the_port_is_killed_and_not_accepted(
    host_factory: HostFactory,
) -> None:
    host = await host_factory("killmode")
    await deploy_unit(
        host, f"/bin/sh -c '{IN_MEMORY} & exec sleep infinity'", extra="KillMode=process\n"
    )
    owner_before = await host.port_owners(PORT)
    verdict, events = await judge_until(host, "service-restart")
    assert verdict.outcome == "failed", verdict
    assert verdict.failure_reason in ("record_missing", "not_ready_after_fault"), verdict
    restart = host.last_restart
    assert restart is not None
    assert set(owner_before) <= set(restart.killed), (owner_before, restart)
    assert not any(kernel.alive(proc) for proc in owner_before)
    detail = [e["detail"] for e in events if e["type"] == "fault_injected"][-1]
    assert "killed by the arena" in detail, detail


async def test_an_honest_disk_backed_unit_still_passes_restart(host_factory: HostFactory) -> None:
    """The same checks accept the real thing (so the checks above can fail for cause)."""
    host = await host_factory("honest")
    await deploy_unit(
        host, f"/usr/bin/python3 /opt/records_server.py --port {PORT} --storage /var/lib/rec"
    )
    verdict, events = await judge_until(host, "service-restart")
    assert verdict.outcome == "passed", verdict
    detail = [e["detail"] for e in events if e["type"] == "fault_injected"][-1]
    assert "killed" not in detail


# ---- disk: bounded by construction -------------------------------------------------


async def test_no_writable_file_of_the_machines_disk_is_bound_into_a_host(
    host_factory: HostFactory,
) -> None:
    host = await host_factory("binds")
    init = host.init_process
    assert init is not None
    assert kernel.writable_binds(init.pid) == []
    for path in ("/etc/hostname", "/run/.containerenv"):
        tried = await host.exec(f"dd if=/dev/zero of={path} bs=1M count=5", timeout=30)
        assert tried.exit_code != 0, path
    assert (await sh(host, "hostname")).strip() == "binds"
    # /etc/hosts is the host's own file now: writes to it are on its measured disk.
    before = await host.disk_usage()
    await sh(host, "dd if=/dev/zero of=/etc/hosts bs=1M count=20 status=none", timeout=60)
    assert await host.disk_usage() >= before + 20 * 1024 * 1024


async def test_a_planted_mount_cannot_fake_the_freeze(host_factory: HostFactory) -> None:
    host = await host_factory("fakemount")
    for path in ("/usr/local/sbin/mount", "/usr/local/bin/mount", "/usr/bin/mount", "/bin/mount"):
        await host.write_file(path, b"#!/bin/sh\nexit 0\n", mode=0o755)
    await host.freeze_disk()
    init = host.init_process
    assert init is not None and kernel.root_mount_read_only(init.pid)
    refused = await host.exec("head -c 1000000 /dev/zero > /var/lib/fill", timeout=30)
    assert refused.exit_code != 0 and b"Read-only file system" in refused.stderr


# ---- kernel limits, namespaces, cgroups ------------------------------------------------


async def test_inotify_exhaustion_in_a_host_leaves_the_arena_and_neighbours_alone(
    host_factory: HostFactory,
) -> None:
    hog = await host_factory("hog")
    await hog.write_file("/opt/hog.py", INOTIFY_HOG.encode())
    await sh(
        hog,
        "systemd-run --unit hog python3 /opt/hog.py; "
        "for i in $(seq 200); do [ -s /run/hog ] && exit 0; sleep 0.05; done; exit 1",
    )
    assert int(await sh(hog, "cat /run/hog")) > 0
    exhausted = await sh(
        hog,
        "python3 -c 'import ctypes, os; l = ctypes.CDLL(None, use_errno=True); "
        "print(l.inotify_init1(0), os.strerror(ctypes.get_errno()))'",
    )
    assert "Too many open files" in exhausted, exhausted
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    os.close(fd)
    neighbour = await host_factory("after-hog")
    assert await neighbour.wait_ready(30) == "running"


async def test_a_host_cannot_make_user_namespaces(host_factory: HostFactory) -> None:
    host = await host_factory("userns")
    tried = await host.exec("unshare -Ur true", timeout=10)
    assert tried.exit_code != 0 and b"Operation not permitted" in tried.stderr
    direct = await sh(
        host,
        "python3 -c 'import ctypes, os; l = ctypes.CDLL(None, use_errno=True); "
        "print(l.unshare(0x10000000), os.strerror(ctypes.get_errno()))'",
    )
    assert direct.split() == ["-1", "Operation", "not", "permitted"], direct
    # Ordinary process creation (clone without new namespaces, clone3 falling back) works.
    assert (
        (
            await sh(
                host,
                "python3 -c 'import threading; t=threading.Thread(target=print); "
                "t.start(); t.join()'; echo forked",
            )
        )
        .strip()
        .endswith("forked")
    )
    mapping = (await sh(host, "cat /proc/self/uid_map")).split()
    assert mapping[0] == "0" and mapping[1] != "0", mapping


async def test_a_host_cannot_leave_its_cgroup_or_enter_a_neighbours(
    host_factory: HostFactory,
) -> None:
    mine, theirs = await asyncio.gather(host_factory("cg-a"), host_factory("cg-b"))
    their_init = theirs.init_process
    assert their_init is not None
    their_cgroup = kernel.container_cgroup(their_init.pid)
    escape = await mine.exec("echo $$ > /sys/fs/cgroup/systemd/cgroup.procs", timeout=10)
    assert escape.exit_code != 0
    into = await mine.exec(
        f"echo $$ > /sys/fs/cgroup/systemd{their_cgroup}/cgroup.procs", timeout=10
    )
    assert into.exit_code != 0
    made = await mine.exec(f"mkdir /sys/fs/cgroup/systemd{their_cgroup}/intruder", timeout=10)
    assert made.exit_code != 0


async def test_a_server_hidden_outside_the_unit_over_a_restart_is_not_new(
    host_factory: HostFactory,
) -> None:
    """The competitor moves its server out of the unit's cgroup before the restart (so
    systemd's stop misses it) and back in after it: it still started before the
    restart, so it is not the restarted unit's process."""
    host = await host_factory("hideout")
    await deploy_unit(host, f"/bin/sh -c '{IN_MEMORY} & exec sleep infinity'")
    (server,) = await host.port_owners(PORT)
    unit_dir = (await sh(host, f"systemctl show -P ControlGroup {UNIT}")).strip()
    # The host's own subtree of the systemd hierarchy, as the host sees it.
    own = "/sys/fs/cgroup/systemd" + unit_dir.split("/system.slice/", 1)[0]
    await sh(host, f"mkdir -p {own}/hideout && echo {server.inner} > {own}/hideout/cgroup.procs")
    since = host.clock_ticks()
    restart = await host.restart_service(UNIT)
    assert kernel.alive(server) and server not in restart.before
    await sh(host, f"echo {server.inner} > /sys/fs/cgroup/systemd{unit_dir}/cgroup.procs")
    assert server in await host.unit_members(UNIT)
    ctx = CheckContext(
        challenge=challenge(),
        milestone=challenge().milestone("service-restart"),
        territory=host.territory,
        attempt=1,
    )
    verdict = await port_ownership_verdict(host, ctx, step="after the restart", since=since)
    assert verdict is not None and verdict.failure_reason == "port_not_owned_by_unit"
    assert "from before the restart" in (verdict.failure_detail or "")
