"""`hosts/kernel.py`, the one place that walks `/proc`, on a real host: the host's
processes, whom a signal reaches, and who writes to its root filesystem."""

from __future__ import annotations

import asyncio
import time

from opsarena.hosts import Host, kernel

WRITER = "exec 3>>/root/kernel-writer; exec sleep infinity"
READER = "exec 3</etc/os-release; exec sleep infinity"


async def started(host: Host, unit: str, script: str) -> int:
    """Start `script` as transient `unit`; once its process runs `sleep` (so its fd 3 is
    open), return its machine pid."""
    await host.exec(["systemd-run", "--unit", unit, "bash", "-c", script], timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for proc in await host.unit_members(f"{unit}.service"):
            with open(f"/proc/{proc.pid}/comm") as comm:
                if comm.read().strip() == "sleep":
                    return proc.pid
        await asyncio.sleep(0.05)
    raise AssertionError(f"{unit} did not start")


async def test_walks_find_the_hosts_processes_and_its_writers(shared_host: Host) -> None:
    try:
        writer = await started(shared_host, "kwriter", WRITER)
        reader = await started(shared_host, "kreader", READER)
        init = shared_host.init_process
        assert init is not None
        everyone = kernel.host_pids(init.pid)
        assert {init.pid, writer, reader} <= set(everyone)
        processes = {proc.pid: proc for proc in kernel.host_processes(init.pid)}
        assert processes[init.pid] == init and processes[writer].inner > 1
        without_init = kernel.host_pids(init.pid, with_init=False)
        assert {writer, reader} <= set(without_init) and init.pid not in without_init
        writers = kernel.root_writers(init.pid)
        assert writer in writers and reader not in writers and init.pid not in writers
        reached = kernel.signal_host_processes(init.pid, 0)  # signal 0: delivered, no effect
        assert {writer, reader} <= set(reached) and init.pid not in reached
        assert not kernel.root_mount_read_only(init.pid)
    finally:
        await shared_host.exec(
            "systemctl stop kwriter kreader; rm -f /root/kernel-writer", timeout=30
        )
