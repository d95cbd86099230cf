"""Sockets opened inside another process's network namespace, for `Host.connect`.

A socket belongs to the network namespace it was created in, for its whole life.
So one thread of the arena's, kept for nothing else, enters the host's namespace with
setns(2), creates the socket and waits for the next request (in whichever namespace it
entered last); the socket is then used from the event loop as usual. The main thread's
namespace, and every other thread's, is never touched. Linux only; needs CAP_SYS_ADMIN
(root).

One long-lived thread, not one per socket: a referee probing 32 hosts opens hundreds of
sockets a second, and starting a thread for each was a tenth of the controller's CPU
(docs/PERFORMANCE.md, "One machine's ceiling").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import socket
import threading
from typing import Any

CLONE_NEWNET = 0x40000000
THREAD_NAME = "opsarena-netns"

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class _SocketMaker:
    """The thread that makes sockets in other network namespaces, one request at a time.
    A request hands over the namespace's fd (the thread closes it) and a queue for the
    answer: a socket or the exception to raise."""

    def __init__(self) -> None:
        self.requests: queue.SimpleQueue[tuple[int, int, queue.SimpleQueue[Any]]] = (
            queue.SimpleQueue()
        )
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            ns_fd, pid, reply = self.requests.get()
            try:
                if _libc.setns(ns_fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into the network of pid {pid}: {os.strerror(err)}")
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                reply.put(sock)
            except BaseException as exc:  # handed to the caller's thread
                reply.put(exc)
            finally:
                os.close(ns_fd)

    def usable(self) -> bool:
        """False in a child forked from the process that started the thread (it has no
        such thread)."""
        return self.pid == os.getpid() and self.thread.is_alive()


_maker: _SocketMaker | None = None
_maker_lock = threading.Lock()


def _socket_maker() -> _SocketMaker:
    global _maker
    maker = _maker
    if maker is not None and maker.usable():
        return maker
    with _maker_lock:
        if _maker is None or not _maker.usable():
            _maker = _SocketMaker()
        return _maker


def socket_in_netns(pid: int) -> socket.socket:
    """Return a non-blocking TCP socket created in the network namespace of `pid`.

    Raises `ProcessLookupError` when `pid` is gone, `PermissionError` without
    CAP_SYS_ADMIN, `OSError` for any other failure of setns(2).
    """
    try:
        ns_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise ProcessLookupError(f"process {pid} is gone") from exc
    reply: queue.SimpleQueue[socket.socket | BaseException] = queue.SimpleQueue()
    try:
        maker = _socket_maker()
    except BaseException:
        os.close(ns_fd)
        raise
    maker.requests.put((ns_fd, pid, reply))  # the thread closes `ns_fd`
    outcome = reply.get()
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome
