"""The faults' deciding parts, directly: unit names, and the disk's write cache (no
FUSE, no kernel: the same object the server runs, on a plain file)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsarena.errors import HostFactsTooLargeError, UnitMissingError
from opsarena.hosts import kernel
from opsarena.hosts.crash import gone, unit_name
from opsarena.hosts.diskserver import BLOCK, WriteCache
from opsarena.hosts.kernel import Proc
from opsarena.referee.failures import classify_error


@pytest.mark.parametrize(
    ("given", "named"),
    [("records", "records.service"), ("builder-app.service", "builder-app.service"),
     ("getty@tty1.service", "getty@tty1.service"), ("x.socket", "x.socket")],
)  # fmt: skip
def test_unit_names_get_their_suffix(given: str, named: str) -> None:
    assert unit_name(given) == named


@pytest.mark.parametrize("bad", ["", "..", "../init.scope", "a/b", ".hidden", "a..b", "a b"])
def test_paths_and_odd_names_are_not_units(bad: str) -> None:
    with pytest.raises(UnitMissingError):
        unit_name(bad)


def test_a_process_is_gone_when_its_pid_has_another_start_time() -> None:
    me = Proc(os.getpid(), 0)  # this pid, but not started at tick 0
    assert gone([me])
    with open(f"/proc/{os.getpid()}/stat", "rb") as stat:
        start = int(stat.read().rsplit(b")", 1)[1].split()[19])
    assert not gone([Proc(os.getpid(), start)])


@pytest.fixture
def cache(tmp_path: Path) -> WriteCache:
    backing = tmp_path / "backing"
    backing.write_bytes(b"\0" * (16 * BLOCK))
    return WriteCache(str(backing))


def test_writes_are_read_back_before_a_flush_and_lost_at_a_cut(cache: WriteCache) -> None:
    handle = 1
    cache.write(b"a" * 10, BLOCK - 5, handle)  # straddles two blocks
    assert cache.read(10, BLOCK - 5) == b"a" * 10
    assert os.pread(cache.fd, 10, BLOCK - 5) == b"\0" * 10  # not on the disk yet
    cache.cut()
    assert cache.read(10, BLOCK - 5) == b"\0" * 10


def test_a_flush_makes_writes_durable_and_power_off_discards_even_flushes(
    cache: WriteCache,
) -> None:
    cache.write(b"kept", 0, 1)
    cache.flush(1)
    assert os.pread(cache.fd, 4, 0) == b"kept"
    cache.cut()
    cache.write(b"lost", 0, 1)
    cache.flush(1)
    assert os.pread(cache.fd, 4, 0) == b"kept"
    assert cache.read(4, 0) == b"kept"


def test_handles_opened_before_a_cut_stay_dead_after_power_returns(cache: WriteCache) -> None:
    old = cache.open_handle()
    cache.cut()
    cache.power_on()
    new = cache.open_handle()
    cache.write(b"old!", 0, old)
    cache.flush(old)
    cache.write(b"new!", BLOCK, new)
    cache.flush(new)
    assert os.pread(cache.fd, 4, 0) == b"\0" * 4
    assert os.pread(cache.fd, 4, BLOCK) == b"new!"
    assert cache.stats()["discarded_writes"] == 1


def test_writes_past_the_end_of_the_disk_are_cut_off(cache: WriteCache) -> None:
    size = 16 * BLOCK
    cache.write(b"x" * 20, size - 10, 1)
    cache.flush(1)
    assert os.path.getsize(Path(f"/proc/self/fd/{cache.fd}")) == size
    assert cache.read(100, size - 10) == b"x" * 10


# Holds N open files (as many as its hard limit allows) until its stdin closes.
HOLDER = """
import os, resource, sys
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(int(sys.argv[1]))]
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def file_holders() -> Iterator[list[Proc]]:
    """Processes holding more open files in all than `kernel.SCAN_LIMIT`, as many processes
    of a host can; killed at teardown."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    each = min(hard, 16384) - 16
    started: list[subprocess.Popen[str]] = []
    try:
        for _ in range(kernel.SCAN_LIMIT // each + 1):
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLDER, str(each)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            started.append(holder)
            assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        yield [Proc(h.pid, kernel.start_time(h.pid) or 0) for h in started]
    finally:
        for holder in started:
            holder.kill()
            holder.wait()


def test_the_arena_reads_a_bounded_number_of_open_files_to_find_a_ports_holder(
    file_holders: list[Proc],
) -> None:
    """A host can hold millions of open files (1024 processes of 8192 each); finding who
    holds its port reads them all, so past `SCAN_LIMIT` the facts are refused, the
    competitor's failure, instead of spending the arena's CPU on its behalf."""
    me = Proc(os.getpid(), kernel.start_time(os.getpid()) or 0)
    assert kernel.socket_owners([me], {1}) == []  # within the bound: read
    with pytest.raises(HostFactsTooLargeError, match=f"more than {kernel.SCAN_LIMIT} open files"):
        kernel.socket_owners([me, *file_holders], {1})
    assert classify_error(HostFactsTooLargeError("x")).reason == "port_not_owned_by_unit"
