"""The podman command line: one `Podman` per driver, with a timeout on every call and
this machine's quirks detected when it starts, never assumed (a hybrid cgroup hierarchy
needs the runc runtime, which crun refuses; ulimits are capped at the arena's own hard
limits, since raising them needs CAP_SYS_RESOURCE). Also the labels the arena puts on
what it makes with podman.
"""

from __future__ import annotations

import os
import resource
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import platformdirs

from opsarena.errors import DriverMissingError, HostUnavailableError
from opsarena.hosts.base import DEFAULT_OUTPUT_LIMIT
from opsarena.hosts.disk import io_controller, own_disks_possible
from opsarena.hosts.podman.confine import (
    DEFAULT_SECCOMP,
    HOOK_ANNOTATION,
    MACHINE_INOTIFY_INSTANCES,
    has_subids,
    hook_config,
    read_int,
    seccomp_profile,
    write_once,
)
from opsarena.hosts.process import ProcessResult, run_process

LABEL_MATCH = "opsarena.match"
LABEL_TERRITORY = "opsarena.territory"
LABEL_DISK = "opsarena.disk"
"""`power` on a host whose root is a power-cut disk (`hosts/powerdisk.py`), `fixed` on
one whose root is a fixed-size disk (`hosts/disk.py`); none on a host made before every
host had a disk of its own (its root is in podman's storage)."""
DISK_KINDS = ("power", "fixed")
LABEL_IMAGE = "opsarena.image"
LABEL_IDS_OF = "opsarena.ids-of"
"""On a power-cut host's id reservation (`ids_name`): the host's name."""
LABEL_IDS_MATCH = "opsarena.ids-match"
"""On a power-cut host's id reservation: the host's match (for `cleanup --match`)."""
RUNC_ROOT = "/run/runc"
"""Where runc keeps its containers' state for podman run as root."""
PODMAN_TIMEOUT = 30.0
# Ceilings for the hosts' ulimits. Podman's defaults (1048576) exceed the hard limits
# of an unprivileged arena, and conmon may run with a lower NPROC hard limit than the
# shell that started it, so stay well below both; --pids-limit bounds processes anyway.
NOFILE_CEILING = 8192
NPROC_CEILING = 4096


def _cgroup_is_hybrid() -> bool:
    """True on a cgroup v1/v2 hybrid (a tmpfs at /sys/fs/cgroup with `unified` in it)."""
    return os.path.isdir("/sys/fs/cgroup/unified") and not os.path.exists(
        "/sys/fs/cgroup/cgroup.controllers"
    )


def _ulimit(kind: int, ceiling: int) -> int:
    _soft, hard = resource.getrlimit(kind)
    return ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)


class Podman:
    """The podman command line, with a timeout on every call and this machine's quirks."""

    def __init__(self, binary: str | None = None) -> None:
        found = binary or shutil.which("podman")
        if not found:
            raise DriverMissingError(
                "podman is not installed: run ./bootstrap (or apt-get install podman runc)"
            )
        self.binary = found
        self.run_flags = self._detect_run_flags()
        self.global_flags: list[str] = []
        """Flags before podman's subcommand (the arena's hooks directory)."""
        self.confine_flags = self._prepare_confinement()
        """`podman run` flags that confine a host (see `_prepare_confinement`)."""
        self.io_controller = io_controller()
        """The cgroup controller that caps a host's disk writes, or None (`hosts/disk.py`)."""
        self.own_disks = own_disks_possible()
        """Whether every host gets a fixed-size disk of its own (`hosts/disk.py`); else
        an ordinary host's root is in podman's storage, bounded by the quota watch only."""

    @staticmethod
    def _detect_run_flags() -> list[str]:
        flags: list[str] = []
        if _cgroup_is_hybrid():
            if not shutil.which("runc"):
                raise DriverMissingError(
                    "this machine has hybrid cgroups, which only the runc runtime "
                    "supports: apt-get install runc"
                )
            flags += ["--runtime", "runc"]
        nofile = _ulimit(resource.RLIMIT_NOFILE, NOFILE_CEILING)
        nproc = _ulimit(resource.RLIMIT_NPROC, NPROC_CEILING)
        flags += ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]
        return flags

    def _prepare_confinement(self) -> list[str]:
        """The flags that put a host in a user namespace of its own, deny it new user
        namespaces, and leave it no writable file of the machine's disk.

        - `--userns auto`: podman gives each host a distinct range of the uids listed
          for `containers` in /etc/subuid and /etc/subgid, so no host shares the arena's
          ids, and the arena's `start_hook` (run by podman before the host's init, at
          every start) caps its per-user kernel limits (inotify instances and watches)
          in that namespace: the owner of every host's namespace is the machine's root,
          so without a cap of its own a host could spend root's whole budget. On a
          cgroup v1/hybrid machine the hook also hands the host its systemd cgroup
          (runc leaves it owned by the machine's root).
        - a seccomp profile derived from podman's default that refuses `CLONE_NEWUSER`
          in clone/unshare and answers clone3 with ENOSYS (so libc falls back to clone).
        - `--no-hosts` and read-only binds for /etc/hostname and /run/.containerenv: the
          files podman would bind read-write from the machine's disk, outside the host's
          measured layer.
        """
        state = platformdirs.user_state_path("opsarena") / "hosts"
        flags: list[str] = []
        if not has_subids("containers"):
            raise DriverMissingError(
                "hosts need uid ranges of their own: add `containers:1073741824:1073741824` "
                "to /etc/subuid and /etc/subgid (./bootstrap does it)"
            )
        self.userns_flags = ["--userns", "auto:size=65536"]
        flags += self.userns_flags
        budget = read_int("/proc/sys/user/max_inotify_instances")
        if budget is not None and budget < MACHINE_INOTIFY_INSTANCES:
            raise DriverMissingError(
                f"the machine's root may hold only {budget} inotify instances, which a few "
                f"hosts (64 each) could spend: sysctl -w fs.inotify.max_user_instances="
                f"{MACHINE_INOTIFY_INSTANCES} (./bootstrap does it)"
            )
        hooks = write_once(state, "hook.json", hook_config())
        self.global_flags = ["--hooks-dir", str(hooks.parent)]
        flags += ["--annotation", f"{HOOK_ANNOTATION}=1"]
        profile = write_once(state, "seccomp.json", seccomp_profile(DEFAULT_SECCOMP))
        flags += ["--security-opt", f"seccomp={profile}"]
        empty = write_once(state, "containerenv", b"")
        flags += ["--no-hosts", "--mount", f"type=bind,src={empty},dst=/run/.containerenv,ro=true"]
        self.state_dir = state
        return flags

    def hostname_file(self, territory: str) -> Path:
        """A read-only-mounted /etc/hostname for a host of `territory`."""
        return write_once(self.state_dir, "hostname", f"{territory}\n".encode())

    async def run(
        self,
        *args: str,
        timeout: float = PODMAN_TIMEOUT,
        input: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        on_overflow: Callable[[], Awaitable[None]] | None = None,
    ) -> ProcessResult:
        """Run `podman ARGS` (`run_process` says what `on_overflow` does). Raises
        `HostUnavailableError` when podman itself hangs."""
        result = await run_process(
            [self.binary, *self.global_flags, *args],
            timeout=timeout,
            input=input,
            output_limit=output_limit,
            on_overflow=on_overflow,
        )
        if result.timed_out:
            raise HostUnavailableError(f"podman {args[0]} did not answer within {timeout:g}s")
        return result

    async def check(self, *args: str, timeout: float = PODMAN_TIMEOUT) -> str:
        """Run `podman ARGS` and return its stdout; raise `HostUnavailableError` on failure."""
        result = await self.run(*args, timeout=timeout)
        if result.returncode != 0:
            raise HostUnavailableError(f"podman {args[0]} failed: {last_line(result.stderr)}")
        return result.stdout.decode(errors="replace")


def without_userns(flags: list[str]) -> list[str]:
    """`flags` without their `--userns VALUE` pair."""
    kept: list[str] = []
    skip = False
    for flag in flags:
        if skip:
            skip = False
        elif flag == "--userns":
            skip = True
        else:
            kept.append(flag)
    return kept


def last_line(data: bytes) -> str:
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"
