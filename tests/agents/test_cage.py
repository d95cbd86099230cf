"""The cage's deciding functions (cgroup discovery, limits, the sandbox's command line) and
the per-competitor cap on host operations, on a real host."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from opsarena.agents.cage import (
    BLOCKED_SYSCALLS_X86_64,
    SANDBOX_ROOT,
    SCRATCH_BYTES,
    CageLimits,
    ProcessCage,
    limit_files,
    parse_mountinfo,
    parse_proc_cgroup,
    sandbox_argv,
    seccomp_program,
)
from opsarena.agents.throttle import ThrottledHost, TokenBucket
from opsarena.hosts import Host
from tests.conftest import new_match_id

HYBRID = """\
25 24 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
31 25 0:28 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
32 25 0:29 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
33 25 0:30 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,xattr,name=systemd
40 22 0:40 / /proc rw - proc proc rw
"""


def test_mountinfo_gives_each_cgroup_mount_its_version_and_controllers() -> None:
    assert parse_mountinfo(HYBRID) == [
        (Path("/sys/fs/cgroup/unified"), 2, frozenset()),
        (Path("/sys/fs/cgroup/cpu,cpuacct"), 1, frozenset({"cpu"})),
        (Path("/sys/fs/cgroup/memory"), 1, frozenset({"memory"})),
        (Path("/sys/fs/cgroup/pids"), 1, frozenset({"pids"})),
        (Path("/sys/fs/cgroup/systemd"), 1, frozenset()),
    ]


def test_proc_cgroup_maps_every_controller_and_v2_to_its_path() -> None:
    text = "4:memory:/process_api/x\n2:cpu,cpuacct:/\n1:name=systemd:/a\n0::/user.slice\n"
    assert parse_proc_cgroup(text) == {
        "memory": "/process_api/x",
        "cpu": "/",
        "cpuacct": "/",
        "name=systemd": "/a",
        "": "/user.slice",
    }


def test_limits_are_written_in_each_versions_files() -> None:
    limits = CageLimits(pids=64, memory_bytes=1 << 28, cpus=0.5)
    assert limit_files(1, ["memory", "pids", "cpu"], limits) == [
        ("pids.max", "64"),
        ("memory.limit_in_bytes", str(1 << 28)),
        ("memory.memsw.limit_in_bytes", str(1 << 28)),  # after the memory limit, never before
        ("cpu.cfs_period_us", "100000"),
        ("cpu.cfs_quota_us", "50000"),
    ]
    assert limit_files(2, ["pids", "memory", "cpu"], limits) == [
        ("pids.max", "64"),
        ("memory.max", str(1 << 28)),
        ("memory.swap.max", "0"),
        ("cpu.max", "50000 100000"),
    ]
    assert limit_files(1, [], limits) == []


def test_the_sandbox_shows_only_what_it_names_and_drops_to_the_agents_uid() -> None:
    words = sandbox_argv(
        ["/srv/agent/run", "--fast"],
        uid=1_900_000_123,
        view=Path("/tmp/opsarena-agent-x/view"),
        read_only=["/srv/agent/run", "/data/model"],
        tools=("/usr/bin/setpriv", "/usr/bin/bwrap"),
    )
    binds = [(words[i + 1], words[i + 2]) for i, w in enumerate(words) if w == "--ro-bind"]
    sources = {source for source, _ in binds}
    assert ("/tmp/opsarena-agent-x/view", SANDBOX_ROOT) in binds
    assert {"/usr", "/srv/agent/run", "/data/model"} <= sources
    assert not {"/", "/sys", "/run", "/var", "/root", "/home", "/tmp"} & sources
    assert not any(
        w in ("--bind", "--dev-bind") and i < words.index("--") for i, w in enumerate(words)
    )
    assert "--unshare-net" in words and "--unshare-pid" in words
    for scratch in ("/tmp", "/home/agent"):  # bounded tmpfs, not the arena's disk
        at = words.index(scratch, words.index("--dev"))
        assert words[at - 3 : at] == ["--size", str(SCRATCH_BYTES), "--tmpfs"], scratch
    setpriv = words.index("/usr/bin/setpriv")
    assert words[setpriv + 1 : setpriv + 3] == ["--reuid=1900000123", "--regid=1900000123"]
    assert "--bounding-set=-all" in words and "--no-new-privs" in words
    inner = words[setpriv:]
    assert "--disable-userns" in inner and inner[-2:] == ["/srv/agent/run", "--fast"]
    # Parents of a bound path are made searchable, so the agent's uid can reach it.
    assert words[words.index("/srv") - 3 : words.index("/srv")] == ["--perms", "0755", "--dir"]
    with_network = sandbox_argv(
        ["/bin/true"], uid=1, view=Path("/v"), network=True, tools=("/s", "/b")
    )
    assert "--unshare-net" not in with_network


@pytest.mark.hosts
async def test_a_competitor_over_its_cap_waits_its_turn(agents_host: Host) -> None:
    host = ThrottledHost(agents_host, limit=2)
    results = await asyncio.gather(
        *(host.exec(f"sleep 0.3; echo {i}", timeout=60) for i in range(6)),
        host.write_file("/tmp/capped", b"x"),
    )
    assert [r.stdout for r in results[:6]] == [f"{i}\n".encode() for i in range(6)]
    assert host.peak == 2 and host.in_flight == 0
    assert await host.read_file("/tmp/capped") == b"x"
    with pytest.raises(ValueError):
        ThrottledHost(agents_host, limit=0)


@pytest.mark.hosts
async def test_a_competitor_past_its_burst_waits_for_its_rate(agents_host: Host) -> None:
    host = ThrottledHost(agents_host, limit=8, rate=10.0, burst=3)
    results = await asyncio.gather(*(host.exec(f"echo {i}", timeout=60) for i in range(6)))
    # All ran; the three past the burst were held back for their tokens.
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(6)]
    assert host.waited_s > 0


def test_the_token_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [bucket.delay(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.delay(0.0) == pytest.approx(0.5)  # the fourth: one token, 0.5 s away
    assert bucket.delay(0.0) == pytest.approx(1.0)  # queued behind it
    assert bucket.delay(10.0) == 0.0  # a quiet spell refills it, never above the burst
    assert [bucket.delay(10.0) for _ in range(2)] == [0.0, 0.0]
    assert bucket.delay(10.0) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        TokenBucket(rate=0.0, burst=1, now=0.0)


def test_a_charge_takes_tokens_below_empty_and_later_operations_wait_for_them() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    bucket.charge(8.0, 0.0)  # an exec that flooded 2 MiB: 8 operations' worth
    assert bucket.delay(0.0) == pytest.approx(3.0)  # 3 - 8 - 1 = -6 tokens: 3 s away
    bucket.charge(1.0, 100.0)  # refilled to the burst first, never above it
    assert [bucket.delay(100.0) for _ in range(2)] == [0.0, 0.0]
    assert bucket.delay(100.0) == pytest.approx(0.5)


@pytest.mark.hosts
async def test_what_an_exec_floods_costs_its_competitor_operations(agents_host: Host) -> None:
    host = ThrottledHost(agents_host, limit=2, rate=2.0, burst=20)
    flood = await host.exec("cat /dev/zero", timeout=60)
    assert flood.truncated and host.read_bytes == len(flood.stdout) == 1 << 20
    # One start and 1 MiB read (4 operations' worth): without the charge it would be
    # back near the burst (20) by now.
    assert host._bucket.tokens < 20 - 3
    quiet = await host.exec("true", timeout=60)
    assert host.read_bytes == 1 << 20 and quiet.exit_code == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups needs root")
def test_a_cage_has_its_limits_is_found_again_by_its_match_and_removed() -> None:
    match_id = new_match_id("cage")
    limits = CageLimits(pids=8, memory_bytes=64 * 1024 * 1024, cpus=0.5)
    cage = ProcessCage.create(match_id, "t", limits)
    sleeper: subprocess.Popen[bytes] | None = None
    try:
        sleeper = subprocess.Popen(cage.wrap(["sleep", "100"]))
        values = {
            f.name: f.read_text().strip()
            for path in cage.paths
            for f in path.iterdir()
            if f.name in ("pids.max", "memory.limit_in_bytes", "memory.max", "cpu.cfs_quota_us")
            or f.name == "cpu.max"
        }
        assert values["pids.max"] == "8"
        assert values.get("memory.limit_in_bytes", values.get("memory.max")) == str(64 << 20)
        assert values.get("cpu.cfs_quota_us", values.get("cpu.max", "").split(" ")[0]) == "50000"
        for _ in range(100):
            if sleeper.pid in cage.pids():
                break
            time.sleep(0.02)
        assert cage.pids() == [sleeper.pid]
        found = ProcessCage.of_match(match_id)
        assert [(c.name, sorted(c.paths)) for c in found] == [(cage.name, sorted(cage.paths))]
        found[0].remove()
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert not any(path.exists() for path in cage.paths)
        assert ProcessCage.of_match(match_id) == []
    finally:
        if sleeper is not None:
            sleeper.kill()
        cage.remove()


def run_filter(program: bytes, arch: int, nr: int) -> int:
    """Evaluate a classic-BPF seccomp filter (the four instructions it uses) on one call."""
    ops = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    data = {0: nr, 4: arch}
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = ops[pc]
        if code == 0x20:  # ld [k]
            acc, pc = data[k], pc + 1
        elif code == 0x15:  # jeq #k
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x35:  # jge #k
            pc += 1 + (jt if acc >= k else jf)
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


def test_the_seccomp_filter_refuses_the_listed_calls_and_other_abis() -> None:
    program = seccomp_program("x86_64")
    assert program is not None and len(program) % 8 == 0
    x86_64, i386 = 0xC000003E, 0x40000003
    allow, eperm, kill = 0x7FFF0000, 0x00050001, 0x80000000
    for name, nr in BLOCKED_SYSCALLS_X86_64.items():
        assert run_filter(program, x86_64, nr) == eperm, name
    for nr in (0, 1, 2, 39, 56, 57, 59, 61, 231, 435):  # read ... exit_group, clone3
        assert run_filter(program, x86_64, nr) == allow, nr
    assert run_filter(program, x86_64, 0x40000000 | 321) == eperm, "x32 bpf"
    assert run_filter(program, x86_64, 0x40000000 | 39) == eperm, "all of x32"
    assert run_filter(program, i386, 20) == kill, "i386 through int 0x80"
    assert seccomp_program("aarch64") is None
