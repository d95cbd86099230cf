"""The power-cut-capable disk of a host: its files, its stack of mounts, its power switch.

The stack, from the bottom: a sparse backing file (durable: the machine does not lose
power) → `diskserver`, a FUSE server that serves it as `fuse/disk` with a volatile
write cache → a loop device on `fuse/disk` → ext4 on the loop device, mounted at `fs/`
→ an overlay whose lower layers are the host image's and whose upper layer is
`fs/upper`, mounted at `root/`: the host's root filesystem (`podman run --rootfs`).

A host's disk gets the host's uid and gid range (`idmap.IdRange`): each image layer is
seen through a read-only idmapped clone (`lower/N`) that shows its files as owned by
the host's ids, and the upper layer's root belongs to the host's root. So the host runs
in a user namespace of its own, and everything it writes lands on the machine's disk
owned by its own uids, never by the machine's root. The disk's directory is `0700`
(as is the directory of all disks); `root/` is not in it, because the host's root
(an unprivileged uid on the machine) must reach it when the runtime sets the host up:
it lies in `<disks>-roots/<host>/root`, whose `<host>` directory is `0700` and belongs
to the host's root, below a `0711` directory.

A power cut drops the server's cache and discards every later write; unmounting the
ext4 then cannot write anything back either, so the next mount sees the disk as the
last flush left it and replays the journal. Every program run here is the arena's own
(`losetup`, `mount`, `mkfs.ext4` of this machine): nothing from a host's filesystem.

Every host gets such a disk, of a fixed size (`hosts/disk.py`): an ordinary host's has
no server, its loop device lies on the backing file itself (`kind` is `fixed`), and it
cannot lose power; its ext4 bounds what the host can write by construction.

A disk's directory is named after its host; a `removed` file in it marks a disk whose
host is being removed, and `lock` serialises a power cut against that removal, so a
host removed during a power cut never boots again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from opsarena.errors import HostBootError, HostUnavailableError
from opsarena.hosts import disk as fixed
from opsarena.hosts.idmap import IdRange, mount_shifted
from opsarena.hosts.process import run_process

SERVER_START_TIMEOUT = 15.0
_MOUNT_TIMEOUT = 30.0


def disks_root() -> Path:
    """Where power-cut disks live: `$OPSARENA_DISK_ROOT`, else /var/lib/opsarena/disks for
    root, else the user's data directory."""
    configured = os.environ.get("OPSARENA_DISK_ROOT")
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/var/lib/opsarena/disks")
    return platformdirs.user_data_path("opsarena") / "disks"


def _private_dir(path: Path, mode: int = 0o700) -> Path:
    """`path` made (with its parents) and set to `mode`, whatever the umask or an older
    arena left."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    return path


@dataclass(frozen=True)
class PowerDisk:
    """One host's disk, by its directory."""

    dir: Path

    @classmethod
    def of(cls, host_name: str) -> PowerDisk:
        return cls(disks_root() / host_name)

    @property
    def backing(self) -> Path:
        return self.dir / "backing.img"

    @property
    def fuse_dir(self) -> Path:
        return self.dir / "fuse"

    @property
    def served(self) -> Path:
        return self.fuse_dir / "disk"

    @property
    def control(self) -> Path:
        return self.dir / "control.sock"

    @property
    def fs(self) -> Path:
        return self.dir / "fs"

    @property
    def root_dir(self) -> Path:
        """`<disks>-roots/<host>`: holds `root`; 0700, owned by the host's root."""
        return self.dir.parent.with_name(self.dir.parent.name + "-roots") / self.dir.name

    @property
    def root(self) -> Path:
        """The host's root filesystem (the overlay)."""
        return self.root_dir / "root"

    @property
    def lower_dir(self) -> Path:
        """Where the idmapped clones of the image's layers are attached (`0`, `1`, ...)."""
        return self.dir / "lower"

    @property
    def ids(self) -> IdRange | None:
        """The host's uid and gid range, or None for a disk made without one."""
        text = self._read("idmap")
        return IdRange.parse(text) if text else None

    @property
    def upper(self) -> Path:
        return self.fs / "upper"

    @property
    def match_id(self) -> str:
        return self._read("match")

    @property
    def power(self) -> bool:
        """Whether the disk can lose power (served by `diskserver`); else a fixed disk."""
        return self._read("kind") != "fixed"

    @property
    def loop_file(self) -> Path:
        """Names the loop device the disk is attached to now."""
        return self.dir / "loop"

    def exists(self) -> bool:
        return self.dir.is_dir()

    @property
    def removed(self) -> bool:
        return (self.dir / "removed").exists()

    def mark_removed(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "removed").touch()

    def _read(self, name: str) -> str:
        try:
            return (self.dir / name).read_text().strip()
        except FileNotFoundError:
            return ""


def _last_line(data: bytes) -> str:
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


async def _run(*argv: str, what: str, timeout: float = _MOUNT_TIMEOUT) -> str:
    result = await run_process(list(argv), timeout=timeout, output_limit=64 * 1024)
    if result.returncode != 0:
        raise HostUnavailableError(f"{what}: {argv[0]} failed: {_last_line(result.stderr)}")
    return result.stdout.decode(errors="replace").strip()


async def control(disk: PowerDisk, command: str, *, timeout: float = 5.0) -> str:
    """Send `command` to the disk's server and return its answer. Raises
    `HostUnavailableError` when the server does not answer."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(str(disk.control))
            try:
                writer.write(command.encode() + b"\n")
                await writer.drain()
                answer = (await reader.readline()).decode().strip()
            finally:
                writer.close()
    except (OSError, TimeoutError) as exc:
        raise HostUnavailableError(
            f"the power-cut disk at {disk.dir} does not answer ({exc.__class__.__name__})"
        ) from exc
    if command in ("cut", "on", "ping") and answer != "ok":
        raise HostUnavailableError(f"the power-cut disk at {disk.dir} said {answer!r}")
    return answer


def _start_server(disk: PowerDisk) -> int:
    with open(disk.dir / "server.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "opsarena.hosts.diskserver",
             str(disk.backing), str(disk.fuse_dir), str(disk.control)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
    (disk.dir / "server.pid").write_text(str(proc.pid))
    return proc.pid


async def _wait_served(disk: PowerDisk, pid: int) -> None:
    deadline = asyncio.get_running_loop().time() + SERVER_START_TIMEOUT
    while True:
        if disk.control.exists():
            with contextlib.suppress(HostUnavailableError):
                await control(disk, "ping", timeout=1.0)
                return
        if not _alive(pid) or asyncio.get_running_loop().time() > deadline:
            log = (disk.dir / "server.log").read_bytes()[-2000:]
            raise HostBootError(f"the power-cut disk's server did not start: {_last_line(log)}")
        await asyncio.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


async def create(
    disk: PowerDisk,
    *,
    size_mb: int,
    lowerdirs: list[str],
    match_id: str = "",
    ids: IdRange | Awaitable[IdRange] | None = None,
    power: bool = True,
    inodes: int | None = None,
) -> None:
    """Make, serve and mount a new disk of `size_mb` MiB whose overlay lies over
    `lowerdirs` (topmost first), shifted into `ids` when given (a disk for a host in a
    user namespace of its own). `ids` may still be on its way: it is awaited only once
    the filesystem is made and served. Without `power` the disk is a fixed one: no
    server, `size_mb` MiB of data and `inodes` inodes (None: `disk.default_inodes`) on an
    ext4 made without zeroing anything. Raises `HostBootError` or `HostUnavailableError`; a
    half-made disk is destroyed first."""
    if not lowerdirs:
        raise HostBootError("the host image has no layers to lay a power-cut disk over")
    _private_dir(disk.dir.parent)
    disk.dir.mkdir(mode=0o700, exist_ok=False)
    try:
        disk.dir.chmod(0o700)
        disk.fs.mkdir(mode=0o700)
        _make_root_dir(disk, shifted=ids is not None)
        (disk.dir / "lowerdir").write_text(":".join(lowerdirs))
        (disk.dir / "match").write_text(match_id)
        backing_mb = size_mb
        if not power:
            (disk.dir / "kind").write_text("fixed")
            inodes = inodes or fixed.default_inodes(size_mb)
            backing_mb = fixed.backing_mb(size_mb, inodes)
        os.truncate(_created(disk.backing), backing_mb * 2**20)
        # Made on the plain backing file, before any server runs: fast, and durable.
        argv = fixed.mkfs_argv(disk.backing, size_mb, None if power else inodes)
        await _run(*argv, what="making the host's disk", timeout=60.0)
        if power:
            disk.fuse_dir.mkdir(mode=0o700)
            await _serve(disk)
        if ids is not None:
            known = ids if isinstance(ids, IdRange) else await ids
            os.chown(disk.root_dir, known.uid, known.gid)
            (disk.dir / "idmap").write_text(known.text())
        await attach(disk)  # and the overlay on it
    except BaseException:
        with contextlib.suppress(Exception):
            await destroy(disk)
        raise


def _make_root_dir(disk: PowerDisk, *, shifted: bool) -> None:
    """`root_dir` and the `root` mountpoint in it. For a `shifted` disk `root_dir` will
    belong to the host's root: the runtime resolves `--rootfs` as that uid, which may
    search nothing of the machine's but directories open to all, so every directory
    above must be."""
    parent = _private_dir(disk.root_dir.parent, 0o711)
    if shifted:
        for above in (parent, *parent.parents):
            if not above.stat().st_mode & 0o001:
                raise HostBootError(
                    f"{above} is closed to other users, so a host in a user namespace of "
                    f"its own cannot reach its root below it (chmod o+x {above}, or set "
                    "OPSARENA_DISK_ROOT elsewhere)"
                )
    disk.root_dir.mkdir(mode=0o700, exist_ok=True)
    disk.root_dir.chmod(0o700)
    disk.root.mkdir(mode=0o755, exist_ok=True)


def _make_layer_dirs(disk: PowerDisk) -> None:
    """The overlay's upper and work directories, durably (a cut must not take them).
    The upper directory is the root directory the host sees: its root owns it. The
    ext4's own root is the machine's and closed to everyone else."""
    disk.fs.chmod(0o700)
    disk.upper.mkdir(exist_ok=True)
    ids = disk.ids
    if ids is not None:
        os.chown(disk.upper, ids.uid, ids.gid)
    (disk.fs / "work").mkdir(mode=0o700, exist_ok=True)
    fd = os.open(disk.fs, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _created(path: Path) -> Path:
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    return path


async def _serve(disk: PowerDisk) -> None:
    with contextlib.suppress(FileNotFoundError):
        disk.control.unlink()
    pid = await asyncio.to_thread(_start_server, disk)
    await _wait_served(disk, pid)


async def attach(disk: PowerDisk) -> None:
    """Attach the loop device, mount the ext4 (replaying its journal after a cut) and
    the host's root overlay on it."""
    device = disk.served if disk.power else disk.backing
    loop = await _run("losetup", "--find", "--show", str(device), what="attaching the disk")
    disk.loop_file.write_text(loop)
    # nosuid, nodev: the machine's own view of what the host wrote grants nothing. The
    # inode tables are never zeroed: the disk's new file read as zeros already.
    await _run("mount", "-t", "ext4", "-o", "noatime,nosuid,nodev,noinit_itable", loop,
               str(disk.fs), what="mounting the host's disk")  # fmt: skip
    if not (disk.dir / "lowerdir").read_text():
        return
    await asyncio.to_thread(_make_layer_dirs, disk)
    await asyncio.to_thread(_mount_lowers, disk)
    await _mount_overlay(disk)


def _lowerdirs(disk: PowerDisk) -> list[str]:
    """The overlay's lower layers: the image's, or their idmapped clones."""
    layers = disk._read("lowerdir").split(":")
    if disk.ids is None:
        return layers
    return [str(disk.lower_dir / str(index)) for index in range(len(layers))]


def _mount_lowers(disk: PowerDisk) -> None:
    """Attach the idmapped clone of each image layer that is not attached yet (they
    stay across power cuts: they hold nothing of the ext4's)."""
    ids = disk.ids
    if ids is None:
        return
    disk.lower_dir.mkdir(mode=0o700, exist_ok=True)
    for index, layer in enumerate(disk._read("lowerdir").split(":")):
        target = disk.lower_dir / str(index)
        target.mkdir(mode=0o700, exist_ok=True)
        if _mounted(target):
            continue
        try:
            mount_shifted(Path(layer), target, ids)
        except OSError as exc:
            raise HostBootError(
                f"cannot give the image layer {layer} the host's ids (an idmapped mount, "
                f"Linux 5.19+ for overlayfs over it): {exc.strerror or exc}"
            ) from exc


async def _mount_overlay(disk: PowerDisk) -> None:
    lower = ":".join(_lowerdirs(disk))
    options = f"lowerdir={lower},upperdir={disk.upper},workdir={disk.fs / 'work'}"
    await _run("mount", "-t", "overlay", "overlay", "-o", options, str(disk.root),
               what="mounting the host's root on its power-cut disk")  # fmt: skip


def _mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4] == target for line in mountinfo)


async def _umount(path: Path, what: str, *, lazy_at_last: bool = False) -> None:
    last = ""
    for attempt in range(60):
        if not _mounted(path):
            return
        lazy = ["--lazy"] if lazy_at_last and attempt == 59 else []
        result = await run_process(["umount", *lazy, str(path)], timeout=_MOUNT_TIMEOUT)
        if result.returncode == 0:
            return
        last = _last_line(result.stderr)
        await asyncio.sleep(0.05)  # busy: the runtime is still letting go of it
    raise HostUnavailableError(f"cannot unmount {what}: {last}")


async def detach(disk: PowerDisk) -> None:
    """Unmount the overlay and the ext4 and detach the loop device (after a cut nothing
    they write reaches the disk)."""
    await _umount(disk.root, "the host's root")
    await _umount(disk.fs, "the power-cut disk")
    loop = disk._read("loop")
    if loop:
        result = await run_process(["losetup", "--detach", loop], timeout=_MOUNT_TIMEOUT)
        if result.returncode != 0 and b"No such device" not in result.stderr:
            raise HostUnavailableError(f"cannot detach {loop}: {_last_line(result.stderr)}")
        # The kernel may release the old loop device later (a container being created
        # elsewhere holds a copy of every mount until its pivot_root): the server
        # discards every write through the old handle for ever, and the next attach
        # takes a new loop device, hence a new ext4 instance that replays the journal.
        (disk.dir / "loop").unlink()


async def power_cycle(disk: PowerDisk) -> None:
    """After `cut` and once nothing uses the host's root: unmount, restore power, mount.
    Un-synced writes are gone; the journal replays."""
    await detach(disk)
    await control(disk, "on")
    await attach(disk)


async def destroy(disk: PowerDisk) -> None:
    """Unmount everything, stop the server and delete the disk. Best effort at every
    step, so that a half-made disk goes too."""
    if not disk.exists():
        await asyncio.to_thread(_remove_tree, disk.root_dir)
        return
    with contextlib.suppress(HostUnavailableError):
        await detach(disk)
    if disk.lower_dir.is_dir():
        for lower in sorted(disk.lower_dir.iterdir()):
            with contextlib.suppress(HostUnavailableError):
                await _umount(lower, "an image layer's idmapped clone", lazy_at_last=True)
    pid_text = disk._read("server.pid")
    # The server's own mount: lazily at last (a namespace of a dying container may
    # still hold it); the server exits once nothing does.
    await _umount(disk.fuse_dir, "the power-cut disk's server", lazy_at_last=True)
    if pid_text:
        pid = int(pid_text)
        for _ in range(200):
            if not _alive(pid):
                break
            await asyncio.sleep(0.01)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    await asyncio.to_thread(_remove_tree, disk.dir)
    await asyncio.to_thread(_remove_tree, disk.root_dir)


def _remove_tree(path: Path) -> None:
    """Delete `path` and everything in it, but never through a mount: whatever is still
    mounted below it (a step above that failed) is detached lazily first."""
    prefix = str(path) + "/"
    with open("/proc/self/mountinfo") as mountinfo:
        below = [line.split()[4] for line in mountinfo]
    for target in sorted((t for t in below if t.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", target], check=False, capture_output=True, timeout=30)
    shutil.rmtree(path, ignore_errors=True)


def all_disks() -> list[PowerDisk]:
    """Every disk in `disks_root()` (for the cleanup sweep)."""
    root = disks_root()
    if not root.is_dir():
        return []
    root.chmod(0o700)  # closed to other users, whichever arena made it
    return [PowerDisk(path) for path in sorted(root.iterdir()) if path.is_dir()]


@contextlib.asynccontextmanager
async def locked(disk: PowerDisk) -> AsyncIterator[None]:
    """Hold the disk's lock (across processes): a power cut and a removal never overlap."""
    fd = os.open(disk.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
