"""Sockets opened inside another process's network namespace, for `Host.connect`.

A socket belongs to the network namespace it was created in, for its whole life.
So a short-lived thread enters the host's namespace with setns(2), creates the
socket and ends; the socket is then used from the event loop as usual. The main
thread's namespace is never touched. Linux only; needs CAP_SYS_ADMIN (root).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import threading

CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def socket_in_netns(pid: int) -> socket.socket:
    """Return a non-blocking TCP socket created in the network namespace of `pid`.

    Raises `ProcessLookupError` when `pid` is gone, `PermissionError` without
    CAP_SYS_ADMIN, `OSError` for any other failure of setns(2).
    """
    try:
        ns_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise ProcessLookupError(f"process {pid} is gone") from exc
    result: list[socket.socket | BaseException] = []

    def enter_and_create() -> None:
        try:
            if _libc.setns(ns_fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into the network of pid {pid}: {os.strerror(err)}")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            result.append(sock)
        except BaseException as exc:  # handed to the caller's thread below
            result.append(exc)

    try:
        # A fresh thread every time: it must die with the namespace it entered, so it
        # is never reused for anything else.
        thread = threading.Thread(target=enter_and_create, name=f"netns-{pid}", daemon=True)
        thread.start()
        thread.join()
    finally:
        os.close(ns_fd)
    outcome = result[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome
