"""The power-cut disk's server: one file served over FUSE as a disk with a volatile write cache.

Run as its own process (`python -m opsarena.hosts.diskserver BACKING MOUNTPOINT CONTROL`):
it serves `MOUNTPOINT/disk`, a file of the backing file's size. A write goes into an
in-memory block cache; a flush (`fsync`/`fdatasync` of the served file, which is what
the loop device above it sends for every flush or FUA request of the filesystem on it)
writes the cache to the backing file. A read sees the cache over the backing file.

The control socket (a Unix socket at CONTROL, one command per connection) takes:
- `cut`: power fails. The cache is dropped and every later write is acknowledged and
  discarded, as by a disk that has lost power, until `on`; writes through a handle
  opened before the cut are discarded for ever (the machine that wrote them is dead,
  even if the kernel still holds its filesystem for a while).
- `on`: power is back; writes are cached again.
- `ping`: answers `ok` (the server is up and the file is served).
- `stats`: one JSON line (cached blocks, flushes, writes discarded, power state).

The cut is taken by a thread: the FUSE loop holds the main thread, where Python signal
handlers would never run. The files are opened with direct I/O so the kernel keeps no
page cache of the served file: what the loop device reads back is what this server says,
never a page the kernel remembers from before the cut.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import sys
import threading
import time
from typing import Any

import mfusepy  # type: ignore[import-untyped]

BLOCK = 4096
DISK_NAME = "disk"
CACHE_LIMIT_BLOCKS = 16384
"""A cache over 64 MiB is written back at once: a real disk's cache is bounded too, and an
un-synced write that becomes durable early is allowed (it *may* be lost, never must)."""


class WriteCache:
    """The disk's state: the backing file, the cache of writes since the last flush, and
    the power. Every method holds the lock; the FUSE loop and the control thread share it."""

    def __init__(self, backing: str) -> None:
        self.fd = os.open(backing, os.O_RDWR)
        self.size = os.fstat(self.fd).st_size
        self.blocks: dict[int, bytearray] = {}
        self.powered = True
        self.lock = threading.Lock()
        self.flushes = 0
        self.discarded = 0
        self.next_handle = 1
        self.dead_below = 0
        """Handles opened before the last cut: their writes and flushes are discarded
        forever (a kernel that still holds the old filesystem must never write it)."""

    def open_handle(self) -> int:
        with self.lock:
            handle = self.next_handle
            self.next_handle += 1
            return handle

    def _block(self, index: int) -> bytearray:
        cached = self.blocks.get(index)
        if cached is None:
            cached = bytearray(os.pread(self.fd, BLOCK, index * BLOCK).ljust(BLOCK, b"\0"))
            self.blocks[index] = cached
        return cached

    def write(self, data: bytes, offset: int, handle: int) -> int:
        with self.lock:
            if not self.powered or handle < self.dead_below:
                self.discarded += 1
                return len(data)
            end = min(offset + len(data), self.size)
            view = memoryview(data)
            pos = offset
            while pos < end:
                index, within = divmod(pos, BLOCK)
                take = min(BLOCK - within, end - pos)
                if within == 0 and take == BLOCK:
                    self.blocks[index] = bytearray(view[pos - offset : pos - offset + BLOCK])
                else:
                    self._block(index)[within : within + take] = view[
                        pos - offset : pos - offset + take
                    ]
                pos += take
            if len(self.blocks) > CACHE_LIMIT_BLOCKS:
                self._flush()
            return len(data)

    def read(self, size: int, offset: int) -> bytes:
        with self.lock:
            size = max(0, min(size, self.size - offset))
            out = bytearray(os.pread(self.fd, size, offset).ljust(size, b"\0"))
            if self.blocks:
                first, last = offset // BLOCK, (offset + size - 1) // BLOCK
                for index in range(first, last + 1):
                    cached = self.blocks.get(index)
                    if cached is None:
                        continue
                    start = index * BLOCK
                    lo, hi = max(start, offset), min(start + BLOCK, offset + size)
                    out[lo - offset : hi - offset] = cached[lo - start : hi - start]
            return bytes(out)

    def _flush(self) -> None:
        for index in sorted(self.blocks):
            os.pwrite(self.fd, self.blocks[index], index * BLOCK)
        self.blocks.clear()
        self.flushes += 1

    def flush(self, handle: int) -> None:
        with self.lock:
            if self.powered and handle >= self.dead_below:
                self._flush()

    def cut(self) -> None:
        with self.lock:
            self.blocks.clear()
            self.powered = False
            self.dead_below = self.next_handle

    def power_on(self) -> None:
        with self.lock:
            self.powered = True

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "cached_blocks": len(self.blocks),
                "flushes": self.flushes,
                "discarded_writes": self.discarded,
                "powered": self.powered,
            }


class DiskFS(mfusepy.Operations):  # type: ignore[misc]
    """A directory holding one file, `disk`, backed by a `WriteCache`."""

    use_ns = True

    def __init__(self, cache: WriteCache, control: str) -> None:
        self.cache = cache
        self.control = control
        self.now = time.time_ns()

    def init(self, path: str) -> None:
        # Mounted: only now may the control socket say "ok".
        threading.Thread(target=serve_control, args=(self.cache, self.control), daemon=True).start()

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        times = {"st_atime": self.now, "st_mtime": self.now, "st_ctime": self.now}
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o700, "st_nlink": 2, **times}
        if path == "/" + DISK_NAME:
            return {"st_mode": stat.S_IFREG | 0o600, "st_nlink": 1, "st_size": self.cache.size,
                    "st_blocks": self.cache.size // 512, **times}  # fmt: skip
        raise mfusepy.FuseOSError(errno.ENOENT)

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", DISK_NAME]

    def open(self, path: str, fi: Any) -> int:
        if path != "/" + DISK_NAME:
            raise mfusepy.FuseOSError(errno.ENOENT)
        fi.direct_io = 1
        fi.fh = self.cache.open_handle()
        return 0

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        return self.cache.read(size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: Any) -> int:
        return self.cache.write(data, offset, int(fh.fh))

    def fsync(self, path: str, datasync: int, fh: Any) -> int:
        self.cache.flush(int(fh.fh))
        return 0

    def flush(self, path: str, fh: Any) -> int:
        return 0  # close(2): not a durability point on a disk

    def truncate(self, path: str, length: int, fh: Any = None) -> int:
        raise mfusepy.FuseOSError(errno.EPERM)  # a disk has a fixed size

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": BLOCK, "f_frsize": BLOCK, "f_blocks": self.cache.size // BLOCK}


def serve_control(cache: WriteCache, path: str) -> None:
    """Answer control commands on the Unix socket at `path`, forever (a daemon thread)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        tmp = path + ".new"
        if os.path.exists(tmp):
            os.unlink(tmp)
        server.bind(tmp)
        os.chmod(tmp, 0o600)
        server.listen(8)
        os.replace(tmp, path)
        while True:
            conn, _ = server.accept()
            with conn:
                command = conn.recv(64).decode(errors="replace").strip()
                if command == "cut":
                    cache.cut()
                    answer = "ok"
                elif command == "on":
                    cache.power_on()
                    answer = "ok"
                elif command == "ping":
                    answer = "ok"
                elif command == "stats":
                    answer = json.dumps(cache.stats())
                else:
                    answer = f"unknown command {command!r}"
                conn.sendall(answer.encode() + b"\n")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m opsarena.hosts.diskserver BACKING MOUNTPOINT CONTROL",
              file=sys.stderr)  # fmt: skip
        return 2
    backing, mountpoint, control = argv
    cache = WriteCache(backing)
    mfusepy.FUSE(
        DiskFS(cache, control),
        mountpoint,
        raw_fi=True,
        foreground=True,
        nothreads=True,
        fsname="opsarena-powerdisk",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
