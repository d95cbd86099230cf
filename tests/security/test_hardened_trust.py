"""Red team, hardened-service: a competitor that is root in its host cannot steer the
challenge's kernel-fact checks, nor make them read the arena machine.

Each attack is planted as a competitor would (through `Host.exec` / `write_file`), then
the challenge's own registered checks judge the host, exactly as the referee runs them:

- a directory swapped again and again with a symlink to a directory of the arena
  machine (renameat2 RENAME_EXCHANGE): the write-sandbox walk never lists, stats or
  reports a file of the machine;
- a server that binds as root, then setresuid(svc, svc, 0): its effective uid is the
  service user's, but it can become root again, so service-user fails (and
  write-sandbox, for the permitted capabilities it kept);
- two processes holding the socket, the first clean and the second keeping
  CAP_DAC_OVERRIDE: every holder is judged, not only the first.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsarena.challenges import builtin_challenge
from opsarena.hosts import Host
from opsarena.referee.contract import CheckContext, Verdict, get_check
from tests.conftest import HostFactory
from tests.security.red_team import HEALTH, USER, deploy, sh

pytestmark = pytest.mark.hosts

CHALLENGE = builtin_challenge("hardened-service")
SERVERS = "pgrep -f '^/usr/bin/python3 /opt/server.py'"
"""The red-team server's processes (not the shell that asks)."""
SAVED_ROOT = (
    "import os, pwd, socket\n" + HEALTH + "s = bound()  # as root\n"
    f"pw = pwd.getpwnam({USER!r})\n"
    "os.setgroups([pw.pw_gid])\n"
    "os.setresgid(pw.pw_gid, pw.pw_gid, 0)\n"
    "os.setresuid(pw.pw_uid, pw.pw_uid, 0)  # effective: the user's; saved: root's\n"
    "serve(s)\n"
)
TWO_HOLDERS = (
    "import ctypes, os, socket, sys\n" + HEALTH + "if len(sys.argv) > 1:\n"
    "    serve(socket.socket(fileno=int(sys.argv[1])))  # the parent, after its exec\n"
    "s = bound()\n"
    "if os.fork() == 0:\n"
    "    serve(s)  # the child keeps the unit's ambient CAP_DAC_OVERRIDE\n"
    "ctypes.CDLL(None).prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL\n"
    "os.set_inheritable(s.fileno(), True)\n"
    "os.execv(sys.executable, [sys.executable, sys.argv[0], str(s.fileno())])\n"
)
SWAPPER = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
while True:  # renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
    if libc.renameat2(-100, b"/opt/swap", -100, b"/opt/swaplink", 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
"""


def context(milestone: str) -> CheckContext:
    found = next(m for m in CHALLENGE.milestones if m.id == milestone)
    return CheckContext(
        challenge=CHALLENGE, milestone=found, territory="redteam", attempt=1,
    )  # fmt: skip


async def judge(host: Host, milestone: str) -> Verdict:
    check = next(m.check for m in CHALLENGE.milestones if m.id == milestone)
    return await get_check(check)(host, context(milestone))


async def test_a_server_keeping_a_saved_root_uid_fails_service_user(
    host_factory: HostFactory,
) -> None:
    host = await host_factory("saved")
    await deploy(host, SAVED_ROOT, "User=root\nNoNewPrivileges=yes\n")
    status = await sh(host, f"grep -E '^(Uid|Gid|CapEff):' /proc/$({SERVERS})/status")
    uid = (await sh(host, f"id -u {USER}")).strip()
    assert f"Uid:\t{uid}\t{uid}\t0\t{uid}" in status, status  # the attack is real
    assert "CapEff:\t0000000000000000" in status, status

    user = await judge(host, "service-user")
    assert (user.outcome, user.failure_reason) == ("failed", "service_runs_as_root"), user
    assert "saved uid 0" in (user.failure_detail or ""), user.failure_detail
    assert "saved gid 0" in (user.failure_detail or "")
    sandbox = await judge(host, "write-sandbox")
    assert sandbox.failure_reason == "writable_outside_data", sandbox
    assert "CAP_DAC_OVERRIDE" in (sandbox.failure_detail or ""), sandbox.failure_detail


async def test_every_holder_of_the_socket_is_judged(host_factory: HostFactory) -> None:
    host = await host_factory("holders")
    await deploy(
        host, TWO_HOLDERS,
        f"User={USER}\nAmbientCapabilities=CAP_DAC_OVERRIDE\nNoNewPrivileges=yes\n",
    )  # fmt: skip
    caps = await sh(host, f"for p in $({SERVERS}); do grep '^CapEff:' /proc/$p/status; done")
    assert sorted(caps.split()) == sorted(
        ["CapEff:", "0000000000000000", "CapEff:", "0000000000000002"]
    ), caps  # one holder clean, one with CAP_DAC_OVERRIDE

    user = await judge(host, "service-user")
    assert user.failure_reason == "service_runs_as_root", user
    assert "CAP_DAC_OVERRIDE" in (user.failure_detail or ""), user.failure_detail
    sandbox = await judge(host, "write-sandbox")
    assert sandbox.failure_reason == "writable_outside_data", sandbox
    assert "CAP_DAC_OVERRIDE" in (sandbox.failure_detail or ""), sandbox.failure_detail


@pytest.fixture
def machine_dir() -> Iterator[Path]:
    """A directory of the arena machine a hostile host knows the path of, holding
    world-writable files: if the walk ever reads it, they show up as writable."""
    path = Path(tempfile.mkdtemp(prefix="opsarena-redteam-"))
    try:
        path.chmod(0o755)
        for n in range(8):
            marker = path / f"machine-marker-{n}-{secrets.token_hex(4)}"
            marker.write_bytes(b"")
            marker.chmod(0o666)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_a_directory_swapped_with_a_symlink_never_leads_the_walk_out_of_the_host(
    host_factory: HostFactory, machine_dir: Path
) -> None:
    host = await host_factory("swapper")
    await deploy(host, "import socket\n" + HEALTH + "serve(bound())\n", f"User={USER}\n"
                 "NoNewPrivileges=yes\n")  # fmt: skip
    passed = await judge(host, "write-sandbox")
    assert passed.outcome == "passed", passed.failure_detail  # clean before the attack

    await host.write_file("/opt/swapper.py", SWAPPER.encode())
    await sh(
        host,
        "mkdir -m 0755 /opt/swap\n"
        f"ln -s {machine_dir} /opt/swaplink\n"
        "systemd-run --unit swapper /usr/bin/python3 /opt/swapper.py\n"
        "sleep 0.5; systemctl is-active --quiet swapper\n",
    )
    details = []
    for _ in range(30):
        verdict = await judge(host, "write-sandbox")
        assert verdict.outcome != "referee_error", verdict
        details.append(verdict.failure_detail or "")
    assert (await host.exec("systemctl is-active --quiet swapper", timeout=30)).ok
    leaked = [d for d in details if "machine-marker" in d or machine_dir.name in d]
    assert not leaked, leaked[0]
    # The walk saw the swap when it caught it, and said so (never what lay behind it).
    assert all(d == "" or "changed while the referee read it" in d for d in details), details
