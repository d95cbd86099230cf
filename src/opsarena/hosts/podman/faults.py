"""The faults a podman host undergoes: a service restart and crash, a clean or hard
reboot, a power cut, the loss of a directory, and the freeze of its disk. Each is done
from outside (the host's bus, kernel facts, signals and mount(2) from the arena's side)
and confirmed by kernel facts, never by what the host says.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from opsarena.errors import (
    FaultUnsupportedError,
    HostBootError,
    HostError,
    HostNotFoundError,
    HostUnavailableError,
    PathMissingError,
    ServiceNotRestartedError,
    ServiceNotRunningError,
    ServiceRestartError,
    UnitMissingError,
)
from opsarena.hosts import crash, diskloss, kernel, powerdisk
from opsarena.hosts.base import ServiceRestart
from opsarena.hosts.podman.facts import UNIT_RE, PodmanFacts
from opsarena.hosts.systemd_bus import BusError, report_empty_cgroup

log = logging.getLogger(__name__)


RESTORE_TIMEOUT_S = 30.0
"""Bound on bringing a host back after a power cut that failed midway."""
CGROUP_NUDGE_S = 0.5
"""After a kill, how long the driver waits before it tells the host's systemd (again) that
the unit's cgroup may be empty (`systemd_bus.report_empty_cgroup`)."""


FREEZE_ROUNDS = 20
"""`freeze_disk` tries this many times to catch the host without a file open for writing."""

CLONE_FS = 0x00000200
CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_REMOUNT = 32
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def remount_root_read_only(init_pid: int) -> str | None:
    """Remount the root filesystem of the host of `init_pid` read-only with mount(2)
    itself: no program (the host's `mount` least of all) runs for it. Returns None on
    success, else the error.

    A fresh thread unshares its filesystem attributes (so it alone may change mount
    namespace), enters the host's mount namespace, remounts and ends; the arena's other
    threads never leave their own namespace.
    """
    try:
        ns_fd = os.open(f"/proc/{init_pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return f"the host's init is gone ({exc.strerror})"
    outcome: list[str | None] = []

    def enter_and_remount() -> None:
        steps: tuple[tuple[str, Callable[[], int]], ...] = (
            ("unshare(CLONE_FS)", lambda: int(_libc.unshare(CLONE_FS))),
            ("setns(mnt)", lambda: int(_libc.setns(ns_fd, CLONE_NEWNS))),
            (
                "mount(remount,ro)",
                lambda: int(_libc.mount(None, b"/", None, MS_REMOUNT | MS_RDONLY, None)),
            ),
        )
        for step, call in steps:
            if call() != 0:
                outcome.append(f"{step}: {os.strerror(ctypes.get_errno())}")
                return
        outcome.append(None)

    try:
        thread = threading.Thread(target=enter_and_remount, name=f"mnt-{init_pid}", daemon=True)
        thread.start()
        thread.join()
    finally:
        os.close(ns_fd)
    return outcome[0] if outcome else "the remount thread failed"


class PodmanFaults(PodmanFacts):
    """The faults of a podman host (see the module)."""

    async def restart_service(self, unit: str, *, timeout: float = 30.0) -> ServiceRestart:
        if not UNIT_RE.match(unit):
            raise UnitMissingError(f"{unit!r} is not a systemd unit name")
        deadline = time.monotonic() + timeout
        pid = await self._init_pid()
        with await self._bus(f"restarting {unit}", 10.0) as bus:
            state = await asyncio.to_thread(bus.unit_state, unit)
            if state.load != "loaded":
                raise UnitMissingError(
                    f"unit {unit} does not exist in {self.name} ({state.load or 'unknown'})"
                )
            if state.main_pid == 0:
                raise ServiceNotRunningError(
                    f"unit {unit} in {self.name} has no running process ({state.active})"
                )
            cgroup = self._unit_cgroup(pid, state.cgroup, unit)
            started = kernel.now_ticks()
            before = await asyncio.to_thread(kernel.cgroup_members, cgroup, pid)
            # reset-failed first: restarts the arena injects are not crashes, and must not
            # push the competitor's unit over its start rate limit (StartLimitBurst).
            try:
                await asyncio.to_thread(bus.reset_failed, unit)
                self.last_fault_at = time.monotonic()
                job = await asyncio.to_thread(bus.restart_unit, unit)
                nudged = time.monotonic()
                while await asyncio.to_thread(bus.job_running, job):
                    if time.monotonic() >= deadline:
                        raise ServiceRestartError(
                            f"the restart of {unit} in {self.name} did not finish "
                            f"within {timeout:g}s"
                        )
                    # systemd may wait in stop-sigterm for a cgroup-empty event that never
                    # comes on a v1 machine (`report_empty_cgroup`): tell it once it is empty.
                    if (
                        time.monotonic() - nudged >= CGROUP_NUDGE_S
                        and not any(kernel.alive(proc) for proc in before)
                        and not await asyncio.to_thread(kernel.cgroup_members, cgroup, pid)
                    ):
                        await self._report_empty(pid, state.cgroup)
                        nudged = time.monotonic()
                    await asyncio.sleep(0.02)
            except BusError as exc:
                raise ServiceRestartError(
                    f"systemd in {self.name} did not restart {unit}: {exc}"
                ) from exc
            # Whatever systemd (or the unit's KillMode) left of the old service dies now,
            # from outside: a restart leaves no old process behind.
            survivors = [proc for proc in before if kernel.alive(proc)]
            killed = await asyncio.to_thread(kernel.kill, survivors)
            old = set(before)
            while True:
                state = await asyncio.to_thread(bus.unit_state, unit)
                members = await asyncio.to_thread(kernel.cgroup_members, cgroup, pid)
                fresh = [p for p in members if p not in old and p.start >= started]
                main = next((proc for proc in fresh if proc.inner == state.main_pid), None)
                if main is not None:
                    restart = ServiceRestart(
                        unit=unit,
                        main_pid=main.inner,
                        before=tuple(before),
                        killed=tuple(killed),
                        started=started,
                    )
                    self.last_restart = restart
                    return restart
                if time.monotonic() >= deadline:
                    raise ServiceRestartError(
                        f"unit {unit} in {self.name} had no new main process {timeout:g}s "
                        f"after restart ({state.active}, MainPID {state.main_pid}; "
                        f"{len(fresh)} new process(es) in its cgroup)"
                    )
                await asyncio.sleep(0.05)

    async def reboot(self, *, hard: bool = False, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        old_boot = (self._pid, self._boot_id) if self._pid else None
        with contextlib.suppress(HostError):
            await self._init_pid()
            old_boot = (self._pid, self._boot_id)
        self._rebooting = True
        self._stopped_by_arena = True
        self.last_fault_at = time.monotonic()
        try:
            if hard:
                await self.podman.check("kill", "--signal", "KILL", self.name, timeout=timeout)
            else:
                # podman sends SIGRTMIN+3, systemd's "halt" request, and waits for it.
                await self.podman.check("stop", "--time", "20", self.name, timeout=timeout)
            await self._wait_stopped(deadline)
            await self._clear_shm()
            await self.podman.check("start", self.name, timeout=timeout)
            await self._init_pid()
        finally:
            self._rebooting = False
        if (self._pid, self._boot_id) == old_boot:
            raise HostBootError(f"{self.name} did not reboot: its init has the same start time")
        self._boots += 1
        await self.wait_ready(max(1.0, deadline - time.monotonic()))
        if self._frozen:  # a new boot mounts the disk read-write again
            await self.freeze_disk()

    async def freeze_disk(self) -> None:
        pid = await self._init_pid()
        self._frozen = True
        last = ""
        for _round in range(FREEZE_ROUNDS):
            # The kernel refuses a read-only remount while any file on it is open for
            # writing: stop the host's processes (not init), kill those writers, remount.
            stopped = await asyncio.to_thread(kernel.signal_host_processes, pid, signal.SIGSTOP)
            try:
                writers = await asyncio.to_thread(kernel.root_writers, pid)
                for writer in writers:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(writer, signal.SIGKILL)
                if writers:
                    await asyncio.sleep(0.05)
                error = await asyncio.to_thread(remount_root_read_only, pid)
            finally:
                for stopped_pid in stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(stopped_pid, signal.SIGCONT)
            # Confirmed from the kernel's own mount table, not from mount(2)'s word.
            if error is None and await asyncio.to_thread(kernel.root_mount_read_only, pid):
                return
            last = error or "the root mount is still read-write"
            await asyncio.sleep(0.05)
        raise HostUnavailableError(f"cannot make the disk of {self.name} read-only: {last}")

    async def crash_service(self, unit: str, *, timeout: float = 10.0) -> int:
        name = crash.unit_name(unit)
        pid = await self._init_pid()
        init = self.init_process
        assert init is not None
        with await self._bus(f"crashing {name}", 10.0) as bus:
            state = await asyncio.to_thread(bus.unit_state, name)
            if state.load != "loaded":
                raise UnitMissingError(
                    f"unit {name} does not exist in {self.name} ({state.load or 'unknown'})"
                )
            if not state.cgroup:
                raise ServiceNotRunningError(f"unit {name} in {self.name} has no running process")
            # The unit's cgroup is systemd's own answer (below the host's cgroup), never a
            # directory found by its name: a competitor can make one anywhere in its tree.
            cgroup = self._unit_cgroup(pid, state.cgroup, name)
            # As for restart_service: the arena's crashes must not push the unit over its
            # start rate limit (the referee may crash it once a second). It also sets
            # NRestarts back to 0, so the count to compare with is read after it.
            await asyncio.to_thread(bus.reset_failed, name)
            state = await asyncio.to_thread(bus.unit_state, name)
            freezer = await asyncio.to_thread(crash.host_freezer, pid)
            self.last_fault_at = time.monotonic()
            victims, killed = await asyncio.to_thread(crash.kill_unit, cgroup, pid, freezer)
            if not victims:
                raise ServiceNotRunningError(f"unit {name} in {self.name} has no running process")
            killed_at = time.monotonic()
            while not await asyncio.to_thread(crash.gone, victims):
                if time.monotonic() - killed_at > 10.0:
                    raise HostUnavailableError(
                        f"the processes of {name} in {self.name} survived SIGKILL"
                    )
                await asyncio.sleep(0.005)
            nudged = killed_at
            while True:
                crash.require_alive(init)
                found = await asyncio.to_thread(
                    crash.new_main_process, cgroup, pid, victims, killed
                )
                if found is not None:
                    # A process an agent started by hand (`systemctl start`) is not the
                    # unit restarting itself: systemd counts only its own restarts.
                    after = await asyncio.to_thread(bus.unit_state, name)
                    if after.restarts > state.restarts:
                        self.last_crash_restart_ms = int((time.monotonic() - killed_at) * 1000)
                        return found.inner
                now = time.monotonic()
                if now - killed_at >= timeout:
                    raise ServiceNotRestartedError(
                        f"unit {name} in {self.name} was not restarted by systemd (its own "
                        f"Restart=) within {timeout:g}s of being killed"
                    )
                if now - nudged >= CGROUP_NUDGE_S and not await asyncio.to_thread(
                    kernel.cgroup_members, cgroup, pid
                ):
                    await self._report_empty(pid, state.cgroup)
                    nudged = time.monotonic()
                await asyncio.sleep(0.01)

    async def _report_empty(self, init_pid: int, cgroup: str) -> None:
        """Tell the host's systemd that `cgroup` (its name for it) may have emptied; see
        `systemd_bus.report_empty_cgroup` for why. A failure changes nothing."""
        try:
            await asyncio.to_thread(report_empty_cgroup, init_pid, cgroup, timeout=5.0)
        except (BusError, OSError) as exc:
            log.debug("could not nudge systemd in %s about %s: %s", self.name, cgroup, exc)

    async def power_cut(self, *, timeout: float = 60.0) -> None:
        disk = self.disk
        if disk is None or not disk.power:
            raise FaultUnsupportedError(
                f"host {self.name} has no power-cut disk (create it with HostSpec.power_cut)"
            )
        deadline = time.monotonic() + timeout
        try:
            async with powerdisk.locked(disk):
                await self._power_cut_locked(disk, deadline)
        except FileNotFoundError:
            raise HostNotFoundError(f"host {self.name} was removed during the power cut") from None
        self._boots += 1
        await self.wait_ready(max(1.0, deadline - time.monotonic()))
        if self._frozen:
            await self.freeze_disk()

    async def _power_cut_locked(self, disk: powerdisk.PowerDisk, deadline: float) -> None:
        if disk.removed or not disk.exists():
            raise HostNotFoundError(f"host {self.name} is being removed")
        pid = await self._init_pid()
        old_boot = (pid, self._boot_id)
        self._rebooting = True
        try:
            # Killing a PID namespace's init kills every process in it at once; the
            # disk loses power right after, so nothing acknowledged later was durable.
            self.last_fault_at = time.monotonic()
            self._stopped_by_arena = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            try:
                await powerdisk.control(disk, "cut")
                await self._wait_stopped(deadline)
                await self._clear_shm()
                await powerdisk.power_cycle(disk)
                if disk.removed:
                    raise HostNotFoundError(f"host {self.name} was removed during the power cut")
                await self.podman.check(
                    "start", self.name, timeout=max(1.0, deadline - time.monotonic())
                )
            except BaseException:
                # The arena stopped this host: bring it back before reporting the failure,
                # or a later probe would take it for a host that stopped by itself.
                if not disk.removed:
                    await asyncio.shield(self._restore_power(disk))
                raise
            self._pid = 0
            await self._init_pid()
        finally:
            self._rebooting = False
        if (self._pid, self._boot_id) == old_boot:
            raise HostBootError(f"{self.name} did not boot after the power cut")

    async def _wait_stopped(self, deadline: float) -> None:
        while (await self._inspect())["State"].get("Running"):
            if time.monotonic() > deadline:
                raise HostBootError(f"{self.name} did not stop")
            await asyncio.sleep(0.01)

    async def _clear_shm(self) -> None:
        """Empty the host's /dev/shm while it is stopped. Podman keeps a container's shm
        mount across stop and start, so without this a "RAM disk" outlived every reboot
        and power cut (a memory-only service passed the reboot milestones). Done from the
        arena's side without following anything the host left (it runs nothing then)."""
        static = str((await self._inspect()).get("StaticDir") or "")
        shm = Path(static) / "shm"
        if static and shm.is_dir() and not shm.is_symlink():
            await asyncio.to_thread(kernel.empty_directory, str(shm))

    async def lose_directory(self, path: str, *, timeout: float = 60.0) -> int:
        diskloss.check_path(path)
        deadline = time.monotonic() + timeout
        pid = await self._init_pid()
        old_boot = (self._pid, self._boot_id)
        self._rebooting = True
        self._stopped_by_arena = True
        try:
            self.last_fault_at = time.monotonic()
            try:
                loss = await asyncio.to_thread(diskloss.lose, pid, path)
            except PathMissingError:
                self._stopped_by_arena = False  # nothing was done: the host runs as it did
                raise
            except BaseException:
                # Killed, partly emptied: the host must boot again whatever failed.
                await asyncio.shield(self._start_again(deadline))
                raise
            await self._wait_stopped(deadline)
            await self._clear_shm()
            await self.podman.check(
                "start", self.name, timeout=max(1.0, deadline - time.monotonic())
            )
            self._pid = 0
            await self._init_pid()
        finally:
            self._rebooting = False
        if (self._pid, self._boot_id) == old_boot:
            raise HostBootError(f"{self.name} did not boot after the disk loss")
        self._boots += 1
        await self.wait_ready(max(1.0, deadline - time.monotonic()))
        if self._frozen:
            await self.freeze_disk()
        return loss.removed

    async def _start_again(self, deadline: float) -> None:
        """Best effort: start a host the arena stopped (whatever a fault left)."""
        try:
            bound = max(1.0, min(RESTORE_TIMEOUT_S, deadline - time.monotonic()))
            async with asyncio.timeout(bound):
                await self._wait_stopped(deadline)
                await self.podman.check("start", self.name, timeout=RESTORE_TIMEOUT_S)
        except Exception as exc:  # logged; the original failure is the one raised
            log.warning("could not start %s again after a failed fault: %s", self.name, exc)

    async def boot_again(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        if not (await self._inspect())["State"].get("Running"):
            if self.disk is not None and self.disk.power:
                async with powerdisk.locked(self.disk):
                    await self._restore_power(self.disk)
            else:
                await self.podman.check("start", self.name, timeout=timeout)
            self._pid = 0
        return await self.wait_ready(max(1.0, deadline - time.monotonic()))

    async def _restore_power(self, disk: powerdisk.PowerDisk) -> None:
        """Best effort after a power cut that failed midway: power on, mount, start the
        host (bounded); whatever fails is logged and the host stays `_stopped_by_arena`."""
        try:
            async with asyncio.timeout(RESTORE_TIMEOUT_S):
                if (await self._inspect())["State"].get("Running"):
                    return
                with contextlib.suppress(HostUnavailableError):
                    await powerdisk.detach(disk)
                await powerdisk.control(disk, "on")
                await powerdisk.attach(disk)
                await self.podman.check("start", self.name, timeout=RESTORE_TIMEOUT_S)
        except Exception as exc:  # logged; the original failure is the one raised
            log.warning("could not bring %s back after a failed power cut: %s", self.name, exc)
