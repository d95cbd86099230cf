"""A podman host's own disk (`hosts/powerdisk.py`, `hosts/disk.py`): making it from the
image's layers, and the uid/gid range it is shifted into, reserved from podman's
`--userns=auto` allocator by a container that never starts (`reserve_ids`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from opsarena.errors import HostBootError, HostUnavailableError
from opsarena.hosts import powerdisk
from opsarena.hosts.base import HostSpec
from opsarena.hosts.idmap import IdRange
from opsarena.hosts.podman.cli import LABEL_IDS_MATCH, LABEL_IDS_OF, Podman, last_line


def disk_kind(disk: powerdisk.PowerDisk) -> str:
    """`LABEL_DISK`'s value for a host on `disk`."""
    return "power" if disk.power else "fixed"


def ids_name(host: str) -> str:
    """The name of the container that holds the id range of power-cut host `host`
    (never a host's name: those begin with `opsarena-`)."""
    return f"ids.{host}"


def _single_range(entries: list[str] | None, what: str) -> tuple[int, int]:
    """(machine base, size) of a podman id map that is one `0:BASE:SIZE` entry."""
    if not entries or len(entries) != 1:
        raise HostBootError(f"podman reserved no single {what} range: {entries!r}")
    inside, base, size = (int(part) for part in entries[0].split(":"))
    if inside != 0:
        raise HostBootError(f"podman's {what} range does not start at 0: {entries[0]}")
    return base, size


async def image_layers(podman: Podman, image: str) -> list[str]:
    """The image's layer directories, topmost first (an overlay's lowerdir)."""
    out = await podman.check("image", "inspect", "--format", "json", image)
    data = (json.loads(out)[0].get("GraphDriver") or {}).get("Data") or {}
    layers = [data["UpperDir"]] if data.get("UpperDir") else []
    layers += [layer for layer in (data.get("LowerDir") or "").split(":") if layer]
    return layers


async def reserve_ids(podman: Podman, spec: HostSpec, name: str) -> IdRange:
    """A uid and gid range of the host's own, from podman's `--userns=auto` allocator.

    Podman cannot map a `--rootfs` container itself, and it records the ranges it
    hands out only for containers of its storage. So a power-cut host's range is
    held by a container that is created and never started (`ids_name`): podman
    gives it a range no other host has, and gives that range to nobody else while
    it exists. The host runs with exactly that range (`--uidmap`/`--gidmap`); the
    reservation is removed after the host and its disk (`remove`)."""
    reservation = ids_name(name)
    argv = [
        "create", "--name", reservation, "--label", f"{LABEL_IDS_OF}={name}",
        "--label", f"{LABEL_IDS_MATCH}={spec.match_id}", "--network", "none",
        *podman.userns_flags, spec.image, "/bin/true",
    ]  # fmt: skip
    result = await podman.run(*argv)
    if result.returncode != 0 and b"already in use" in result.stderr:
        # A leftover of a host podman no longer has (the host itself was checked).
        await drop_ids(podman, name)
        result = await podman.run(*argv)
    if result.returncode != 0:
        raise HostBootError(f"cannot reserve ids for {name}: {last_line(result.stderr)}")
    out = await podman.check(
        "inspect", "--type", "container", "--format", "{{json .HostConfig.IDMappings}}",
        reservation,
    )  # fmt: skip
    mappings = json.loads(out)
    uid, size = _single_range(mappings.get("UidMap"), "uid")
    gid, gid_size = _single_range(mappings.get("GidMap"), "gid")
    if gid_size != size:
        raise HostBootError(f"podman reserved {size} uids but {gid_size} gids for {name}")
    return IdRange(uid, gid, size)


async def drop_ids(podman: Podman, name: str) -> None:
    """Remove the id reservation of host `name` (nothing when it has none)."""
    result = await podman.run("rm", "--force", "--time", "0", ids_name(name))
    if result.returncode != 0:
        raise HostUnavailableError(
            f"cannot remove the id reservation of {name}: {last_line(result.stderr)}"
        )


async def make_disk(
    podman: Podman, spec: HostSpec, name: str
) -> tuple[powerdisk.PowerDisk, IdRange]:
    disk = powerdisk.PowerDisk.of(name)
    await powerdisk.destroy(disk)  # a leftover of a host podman no longer has
    # The reservation (two podman calls) runs while the disk is made and served.
    reserved = asyncio.create_task(reserve_ids(podman, spec, name))
    try:
        layers = await image_layers(podman, spec.image)
        await powerdisk.create(
            disk, size_mb=spec.disk_mb, lowerdirs=layers, match_id=spec.match_id,
            ids=reserved, power=spec.power_cut, inodes=spec.disk_inodes,
        )  # fmt: skip
    except BaseException:
        reserved.cancel()
        with contextlib.suppress(BaseException):
            await reserved
        raise
    return disk, reserved.result()
