"""Sockets made in other processes' network namespaces (`hosts/netns.py`), without hosts:
each namespace here is a process of the test's own made with `unshare --net`, holding
only its loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from opsarena.hosts import netns
from opsarena.hosts.netns import socket_in_netns

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setns(2) needs root")

# Listens on 127.0.0.1:PORT of its own namespace and says "ready" once it does.
SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(64)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"here")
    c.close()
"""
PORT = 8123

Namespace = Callable[[bool], int]


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    """`namespace(serving)`: the pid of a process alone in a new network namespace
    (loopback up), serving on PORT when `serving`; every one killed at teardown."""
    started: list[subprocess.Popen[str]] = []

    def make(serving: bool) -> int:
        program = [sys.executable, "-c", SERVER, str(PORT)] if serving else ["sleep", "300"]
        process = subprocess.Popen(
            ["unshare", "--net", "sh", "-c", 'ip link set lo up && echo up && exec "$@"', "ns",
             *program],
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        started.append(process)
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "up"
        if serving:
            assert process.stdout.readline().strip() == "ready"
        return process.pid

    try:
        yield make
    finally:
        for process in started:
            process.kill()
            process.wait()


def answer(pid: int) -> bytes | str:
    """What connecting to PORT in `pid`'s namespace gives: the server's word or the error."""
    sock = socket_in_netns(pid)
    try:
        sock.setblocking(True)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", PORT))
        return sock.recv(4)
    except OSError as exc:
        return type(exc).__name__
    finally:
        sock.close()


def socket_makers() -> list[threading.Thread]:
    """The threads of this process that make sockets in other namespaces."""
    return [t for t in threading.enumerate() if t.name == netns.THREAD_NAME]


def test_each_socket_is_in_its_own_namespace_however_requests_alternate(
    namespace: Namespace,
) -> None:
    serving, silent = namespace(True), namespace(False)
    assert answer(serving) == b"here"
    maker = socket_makers()
    assert len(maker) == 1  # one thread kept for making them
    answers = [answer(pid) for _ in range(20) for pid in (serving, silent)]

    assert answers == [b"here", "ConnectionRefusedError"] * 20
    # Never this test's own namespace: nothing listens on PORT here.
    mine = socket.socket()
    assert mine.connect_ex(("127.0.0.1", PORT)) != 0
    mine.close()
    # The same thread made all 40, alive and waiting for the next: none started per socket.
    assert socket_makers() == maker and maker[0].is_alive()


def test_a_process_gone_is_process_lookup_error(namespace: Namespace) -> None:
    with pytest.raises(ProcessLookupError):
        socket_in_netns(2**22 + 1)  # above pid_max: never a process
    assert answer(namespace(True)) == b"here"  # and the next one still works


def test_a_forked_child_makes_its_own_thread(namespace: Namespace) -> None:
    pid = namespace(True)
    assert answer(pid) == b"here"  # the parent's thread exists now
    child = os.fork()
    if child == 0:  # the child has no such thread: it must start one, not wait forever
        signal.alarm(60)
        os._exit(0 if answer(pid) == b"here" else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
