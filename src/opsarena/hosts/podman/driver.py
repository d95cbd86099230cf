"""`PodmanDriver`: the lifecycle of podman hosts (create, get, list, remove, cleanup and
the sweep of what outlived podman's knowledge).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import shutil

from opsarena.errors import (
    HostBootError,
    HostError,
    HostNotFoundError,
    HostUnavailableError,
    ImageMissingError,
)
from opsarena.hosts import powerdisk
from opsarena.hosts.base import (
    FAULT_DISK_LOSS,
    FAULT_POWER_CUT,
    FAULT_SERVICE_CRASH,
    Host,
    HostDriver,
    HostInfo,
    HostSpec,
)
from opsarena.hosts.disk import IO_ANNOTATION, WriteCaps
from opsarena.hosts.image import build_image
from opsarena.hosts.podman.cli import (
    DISK_KINDS,
    LABEL_DISK,
    LABEL_IDS_MATCH,
    LABEL_IDS_OF,
    LABEL_IMAGE,
    LABEL_MATCH,
    LABEL_TERRITORY,
    PODMAN_TIMEOUT,
    RUNC_ROOT,
    Podman,
    last_line,
    without_userns,
)
from opsarena.hosts.podman.disk import disk_kind, drop_ids, make_disk
from opsarena.hosts.podman.host import PodmanHost
from opsarena.hosts.process import run_process
from opsarena.hosts.runc import runc_containers

REMOVE_ATTEMPTS = 5
"""`remove` tries this many times while podman finds the host's shm mount busy."""


class PodmanDriver(HostDriver):
    """Hosts as podman containers. See `HostDriver`."""

    name = "podman"
    faults = frozenset({"restart", "reboot", FAULT_SERVICE_CRASH, FAULT_POWER_CUT, FAULT_DISK_LOSS})

    def __init__(self, podman: Podman | None = None) -> None:
        self.podman = podman or Podman()

    def _host(self, name: str, labels: dict[str, str]) -> PodmanHost:
        disk = powerdisk.PowerDisk.of(name) if labels.get(LABEL_DISK) in DISK_KINDS else None
        return PodmanHost(
            self.podman, name, labels.get(LABEL_MATCH, ""), labels.get(LABEL_TERRITORY, ""), disk
        )

    async def prepare_image(self, image: str, packages: tuple[str, ...]) -> None:
        # Built once per recipe and cached (a label on the image).
        await build_image(image, extra=packages)

    async def create(self, spec: HostSpec, *, boot_timeout: float = 60.0) -> Host:
        name = self.host_name(spec.match_id, spec.territory)
        if (await self.podman.run("image", "exists", spec.image)).returncode != 0:
            raise ImageMissingError(f"image {spec.image} is not there: run `opsarena image build`")
        if (await self.podman.run("container", "exists", name)).returncode == 0:
            raise HostError(
                f"host {name} exists already: remove it with `opsarena hosts rm {name}`"
            )
        caps = WriteCaps(spec.disk_write_mbps * 2**20, spec.disk_write_iops)
        try:
            cap_text = caps.annotation(powerdisk.PowerDisk.of(name).loop_file)
        except ValueError as exc:
            raise HostBootError(f"cannot cap the writes of {name}: {exc}") from None
        disk: powerdisk.PowerDisk | None = None
        confine = self.podman.confine_flags
        if spec.power_cut or self.podman.own_disks:
            # The host's root lies on a disk of its own, of a fixed size (hosts/disk.py).
            try:
                disk, ids = await make_disk(self.podman, spec, name)
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.shield(drop_ids(self.podman, name))
                raise
            # podman 4.3 cannot map a `--rootfs` tree itself (`--userns=auto` fails with
            # "no uid mappings found"): the disk is already shifted into the range
            # reserved for the host, which it runs in (docs/SECURITY.md).
            confine = [*without_userns(confine), *ids.podman_flags()]
        root = ["--rootfs", str(disk.root)] if disk else [spec.image]
        disk_labels = ["--label", f"{LABEL_DISK}={disk_kind(disk)}"] if disk else []
        if disk and caps.any and self.podman.io_controller is not None:
            disk_labels += ["--annotation", f"{IO_ANNOTATION}={cap_text}"]
        result = await self.podman.run(
            "run", "--detach", "--name", name, "--hostname", spec.territory,
            "--label", f"{LABEL_MATCH}={spec.match_id}",
            "--label", f"{LABEL_TERRITORY}={spec.territory}",
            "--label", f"{LABEL_IMAGE}={spec.image}", *disk_labels,
            # The runtime's own record names the match too, so that `cleanup` finds a
            # container podman has forgotten (see `sweep_runtime`).
            "--annotation", f"{LABEL_MATCH}={spec.match_id}",
            "--network", "none", "--systemd", "always",
            "--cpus", f"{spec.cpus:g}", "--memory", f"{spec.memory_mb}m",
            "--memory-swap", f"{spec.memory_mb}m", "--pids-limit", str(spec.pids_limit),
            *self.podman.run_flags, *confine,
            "--mount", f"type=bind,src={self.podman.hostname_file(spec.territory)},"
            "dst=/etc/hostname,ro=true",
            *root, "/sbin/init",
            timeout=boot_timeout,
        )  # fmt: skip
        host = PodmanHost(self.podman, name, spec.match_id, spec.territory, disk)
        try:
            if result.returncode != 0:
                raise HostBootError(f"host {name} did not start: {last_line(result.stderr)}")
            await host.wait_ready(boot_timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.remove(name)
            if disk is not None:
                with contextlib.suppress(Exception):
                    await powerdisk.destroy(disk)
                with contextlib.suppress(Exception):
                    await drop_ids(self.podman, name)
            raise
        return host

    async def cleanup(self, *, match_id: str | None = None) -> builtins.list[str]:
        """Remove the hosts podman knows, then sweep what outlived podman's knowledge:
        runtime containers and power-cut disks of hosts podman no longer has."""
        removed = await super().cleanup(match_id=match_id)
        return removed + await self.sweep_runtime(match_id=match_id)

    async def sweep_runtime(self, *, match_id: str | None = None) -> builtins.list[str]:
        """Kill and delete runc containers annotated as ours that podman has forgotten,
        and destroy power-cut disks and id reservations whose host podman no longer has;
        return what went."""
        known = set(
            (await self.podman.check("ps", "--all", "--no-trunc", "--format", "{{.ID}}")).split()
        )
        names = set((await self.podman.check("ps", "--all", "--format", "{{.Names}}")).split())
        swept: list[str] = []
        runc = shutil.which("runc")
        if runc is not None:
            for row in await runc_containers(runc, RUNC_ROOT, timeout=PODMAN_TIMEOUT):
                annotations = row.get("annotations") or {}
                ours = annotations.get(LABEL_MATCH)
                if ours is None or row["id"] in known or match_id not in (None, ours):
                    continue
                for argv in (["kill", row["id"], "KILL"], ["delete", "--force", row["id"]]):
                    await run_process([runc, "--root", RUNC_ROOT, *argv], timeout=PODMAN_TIMEOUT)
                swept.append(f"runc:{row['id'][:12]}")
        for disk in powerdisk.all_disks():
            if disk.dir.name in names or match_id not in (None, disk.match_id):
                continue
            disk.mark_removed()
            async with powerdisk.locked(disk):
                await powerdisk.destroy(disk)
            swept.append(f"disk:{disk.dir.name}")
        reservations = await self.podman.check(
            "ps", "--all", "--filter", f"label={LABEL_IDS_OF}", "--format", "json"
        )
        for row in json.loads(reservations or "[]"):
            labels = row.get("Labels") or {}
            host = labels.get(LABEL_IDS_OF, "")
            if host in names or match_id not in (None, labels.get(LABEL_IDS_MATCH)):
                continue
            await drop_ids(self.podman, host)
            swept.append(f"ids:{host}")
        return swept

    async def get(self, name: str) -> Host:
        host = PodmanHost(self.podman, name, "", "")
        labels = (await host._inspect())["Config"].get("Labels") or {}
        if LABEL_MATCH not in labels:
            raise HostNotFoundError(f"{name} is not an opsarena host")
        return self._host(name, labels)

    async def list(self, *, match_id: str | None = None) -> list[HostInfo]:
        label = f"{LABEL_MATCH}={match_id}" if match_id is not None else LABEL_MATCH
        out = await self.podman.check(
            "ps", "--all", "--filter", f"label={label}", "--format", "json"
        )
        infos = []
        for row in json.loads(out or "[]"):
            labels = row.get("Labels") or {}
            infos.append(
                HostInfo(
                    name=row["Names"][0],
                    match_id=labels.get(LABEL_MATCH, ""),
                    territory=labels.get(LABEL_TERRITORY, ""),
                    image=labels.get(LABEL_IMAGE) or row.get("Image", ""),
                    state=row.get("State", ""),
                    created=str(row.get("CreatedAt", "")),
                    labels=labels,
                )
            )
        return sorted(infos, key=lambda info: info.name)

    async def remove(self, name: str) -> None:
        # `rm --force` succeeds for a missing container, so ask first.
        if (await self.podman.run("container", "exists", name)).returncode == 1:
            raise HostNotFoundError(f"host {name} does not exist")
        disk = powerdisk.PowerDisk.of(name)
        if not disk.exists():
            await self._rm(name)
            return
        # A power cut in flight checks the mark before it boots the host again, and
        # holds the lock until it has: removing under the lock means it never comes back.
        disk.mark_removed()
        await self._rm(name)
        async with powerdisk.locked(disk):
            await self._rm(name)
            await powerdisk.destroy(disk)
        # Last: podman may give the range to another host once this is gone.
        await drop_ids(self.podman, name)

    async def _rm(self, name: str) -> None:
        for _attempt in range(REMOVE_ATTEMPTS):
            result = await self.podman.run("rm", "--force", "--time", "0", name, timeout=60.0)
            # A host in a user namespace of its own can leave its shm mount busy for a
            # moment after its processes died; podman then has removed all but that.
            if result.returncode == 0 or b"resource busy" not in result.stderr:
                break
            await asyncio.sleep(0.5)
        if result.returncode != 0:
            raise HostUnavailableError(f"cannot remove {name}: {last_line(result.stderr)}")
