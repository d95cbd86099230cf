"""The arena's D-Bus line to a host's systemd: its private socket, reached without trusting
the host's filesystem, and the few manager calls the arena needs.

Nothing from the host's filesystem is executed: the socket `/run/systemd/private` is
found by walking from `/proc/<init>/root` one component at a time with
`O_PATH|O_NOFOLLOW` (a symlink the competitor planted is refused, never followed) and
connected through `/proc/self/fd/N`. The peer is then checked with `SO_PEERCRED`: it
must be the host's init as this machine numbers it, so a socket some other program of
the competitor put there is refused. The connecting thread takes the host's root uid and
gid (as this machine maps them) for the `connect` only, so the host's systemd sees a
root peer in its own user namespace; the thread ends right after.

What systemd answers here is used to ask for things (readiness, restart) and to find a
unit's cgroup; it is never the evidence of a fault's effect (`hosts.kernel` is). Every
call is blocking and bounded by `timeout`; callers run it in a thread.

Messages are marshalled with `jeepney` (a small, pure-Python D-Bus wire library); the
SASL handshake is the three lines of `EXTERNAL` with the uid the server sees (0).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from jeepney import (  # type: ignore[import-untyped]
    DBusAddress,
    HeaderFields,
    Message,
    MessageType,
    Parser,
    new_method_call,
)

from opsarena.errors import HostUnavailableError

PRIVATE_SOCKET = ("run", "systemd", "private")
"""Path of systemd's private bus socket below the host's root, one component each."""

SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
UNIT = "org.freedesktop.systemd1.Unit"
SERVICE = "org.freedesktop.systemd1.Service"
JOB = "org.freedesktop.systemd1.Job"
PROPERTIES = "org.freedesktop.DBus.Properties"
PEER = "org.freedesktop.DBus.Peer"
PING_INTERVAL = 0.02
"""Seconds between Pings while the host's systemd has not answered a new connection."""
NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"
UNKNOWN_OBJECT = ("org.freedesktop.DBus.Error.UnknownObject", "org.freedesktop.systemd1.NoSuchJob")
MAX_MESSAGE = 1024 * 1024
"""Largest reply accepted from a host's systemd (its answers here are a few hundred bytes)."""

T = TypeVar("T")

CONNECTOR = str(Path(__file__).with_name("bus_connector.py"))
"""The arena's own connector program (see `bus_connector`), run by path from the package."""


class BusError(HostUnavailableError):
    """The host's systemd could not be reached over its private socket, or refused a
    call; `name` is the D-Bus error name when systemd answered with one."""

    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)
        self.name = name


def host_root_ids(init_pid: int) -> tuple[int, int]:
    """The uid and gid, as this machine numbers them, of root inside the host of
    `init_pid` (0, 0 when the host shares the machine's user namespace)."""
    found = []
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{init_pid}/{name}") as mapping:
            for line in mapping:
                inside, outside, _count = (int(part) for part in line.split())
                if inside == 0:
                    found.append(outside)
                    break
            else:
                raise BusError(f"root of the host of pid {init_pid} is not mapped ({name})")
    return found[0], found[1]


def _run_connector(
    init_pid: int, start: int, channel: socket.socket, extra: list[str], *, timeout: float
) -> None:
    """Run `bus_connector` for the host of `init_pid` (started at `start`), handing it
    `channel`; raises `BusError` with its last line when it fails."""
    uid, gid = host_root_ids(init_pid)
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", CONNECTOR, str(init_pid), str(start), str(uid),
             str(gid), str(channel.fileno()), *extra],
            pass_fds=(channel.fileno(),), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout,
            env={}, cwd="/", check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise BusError(f"reaching the host's systemd took over {timeout:g}s") from exc
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines() or ["(no output)"]
        raise BusError(lines[-1][:300])


def connect_private_bus(init_pid: int, *, timeout: float) -> socket.socket:
    """A connected, authenticated socket to the systemd running as `init_pid`.

    The socket is made by `bus_connector` (see there why a separate process) and
    checked here: its peer must be `init_pid` with the start time it had before.
    """
    start = _start_time(init_pid)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _run_connector(init_pid, start, theirs, [], timeout=timeout)
        ours.settimeout(timeout)
        _msg, fds, _flags, _addr = socket.recv_fds(ours, 16, 1)
    except TimeoutError as exc:
        raise BusError(f"the bus connector handed no socket within {timeout:g}s") from exc
    finally:
        ours.close()
        theirs.close()
    if not fds:
        raise BusError("the bus connector handed no socket back")
    sock = socket.socket(fileno=fds[0])
    try:
        sock.settimeout(timeout)
        peer_pid, _uid, _gid = struct.unpack(
            "3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        )
        if peer_pid != init_pid or _start_time(init_pid) != start:
            raise BusError(
                f"the host's bus socket is served by pid {peer_pid}, not by its init "
                f"({init_pid}): refused"
            )
        _authenticate(sock)
        return sock
    except TimeoutError as exc:  # a systemd busy booting under load: not up yet
        sock.close()
        raise BusError(f"the host's systemd did not authenticate within {timeout:g}s") from exc
    except OSError as exc:  # reset or closed by a systemd going away
        sock.close()
        raise BusError(f"the host's systemd dropped the bus: {exc}") from exc
    except BaseException:
        sock.close()
        raise


def report_empty_cgroup(init_pid: int, cgroup: str, *, timeout: float) -> None:
    """Tell the systemd running as `init_pid` that `cgroup` (its own name for it, e.g.
    `/libpod_parent/libpod-ID/system.slice/x.service`) may have emptied, as systemd's
    cgroups agent would.

    Why: on a cgroup v1 machine a host's systemd gets no kernel notice when a unit's
    cgroup empties (the release agent is masked in containers) and falls back to
    watching pids, which races: seen here, one crash in ten under load left a unit in
    `stop-sigterm` until its 90 s stop timeout, so a correct `Restart=` unit looked
    "not restarted". systemd checks the cgroup itself before acting on the message, so
    a needless one does nothing. Raises `BusError`."""
    if not cgroup.startswith("/") or "\0" in cgroup or len(cgroup) > 4000:
        raise ValueError(f"{cgroup!r} is not a cgroup path")
    start = _start_time(init_pid)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _run_connector(init_pid, start, theirs, [cgroup], timeout=timeout)
    finally:
        ours.close()
        theirs.close()


def _start_time(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            return int(stat_file.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError) as exc:
        raise BusError(f"the host's init (pid {pid}) is gone") from exc


def _authenticate(sock: socket.socket) -> None:
    # EXTERNAL with uid 0: the uid the host's systemd sees for this socket's creds.
    sock.sendall(b"\0AUTH EXTERNAL " + b"0".hex().encode() + b"\r\n")
    line = _read_line(sock)
    if not line.startswith(b"OK "):
        raise BusError(f"the host's systemd refused the arena: {line[:80]!r}")
    sock.sendall(b"BEGIN\r\n")


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = sock.recv(1)
        if not chunk or len(data) > 512:
            raise BusError("the host's systemd closed the bus during authentication")
        data += chunk
    return data


def buffered_messages(parser: Parser) -> Iterator[Message]:
    """The complete messages `parser` holds. What the host's bus sends is the host's
    choice (its init may be anything its root installed): a message the parser cannot
    read, a string that is not UTF-8 say, raises `BusError`, never a parser's error."""
    while True:
        try:
            message = parser.get_next_message()
        except Exception as exc:
            raise BusError(
                "the host's systemd sent a message the arena cannot read: "
                f"{type(exc).__name__}: {str(exc)[:200]}"
            ) from None
        if message is None:
            return
        yield message


class SystemdBus:
    """One connection to a host's systemd manager. Use as a context manager."""

    def __init__(self, init_pid: int, *, timeout: float) -> None:
        self.init_pid = init_pid
        self.timeout = timeout
        self.sock = connect_private_bus(init_pid, timeout=timeout)
        self.parser = Parser()
        self.serial = 0
        try:
            self._wait_until_heard(timeout)
        except OSError as exc:  # reset or closed by a systemd going away
            self.sock.close()
            raise BusError(f"the host's systemd dropped the bus: {exc}") from exc
        except BaseException:
            self.sock.close()
            raise

    def _wait_until_heard(self, timeout: float) -> None:
        """Ping until systemd answers. systemd drops what a client sends in the moments
        after BEGIN while it is still setting the connection up (seen on systemd 252),
        so nothing that changes state is sent before a harmless Ping came back."""
        deadline = time.monotonic() + timeout
        pings: set[int] = set()
        while time.monotonic() < deadline:
            self.serial += 1
            pings.add(self.serial)
            ping = new_method_call(DBusAddress(MANAGER_PATH, SYSTEMD, PEER), "Ping")
            self.sock.sendall(ping.serialise(serial=self.serial))
            wait_until = min(deadline, time.monotonic() + PING_INTERVAL)
            while (remaining := wait_until - time.monotonic()) > 0:
                for message in self._buffered():
                    if message.header.fields.get(HeaderFields.reply_serial) in pings:
                        return
                self.sock.settimeout(remaining)
                try:
                    chunk = self.sock.recv(65536)
                except TimeoutError:
                    break
                if not chunk:
                    raise BusError("the host's systemd closed the bus")
                self.parser.add_data(chunk)
            for message in self._buffered():
                if message.header.fields.get(HeaderFields.reply_serial) in pings:
                    return
        raise BusError(f"the host's systemd did not answer within {timeout:g}s")

    def open(self) -> bool:
        """Whether the connection is still up: systemd has not closed it (a daemon-reexec,
        its host's reboot) and nothing unasked-for is waiting on it."""
        if self.sock.fileno() < 0:
            return False
        try:
            self.sock.setblocking(False)
            self.sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True  # nothing to read: open and quiet
        except OSError:
            return False
        finally:
            self.sock.settimeout(self.timeout)
        return False  # closed (EOF), or bytes nobody asked for: start afresh

    def __enter__(self) -> SystemdBus:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def call(
        self,
        path: str,
        interface: str,
        method: str,
        signature: str = "",
        body: tuple[Any, ...] = (),
    ) -> tuple[Any, ...]:
        """Call `method` and return the reply's body; raises `BusError` (with the D-Bus
        error name) when systemd answers with an error."""
        self.serial += 1
        message = new_method_call(DBusAddress(path, SYSTEMD, interface), method, signature, body)
        try:
            self.sock.sendall(message.serialise(serial=self.serial))
            reply = self._reply(self.serial)
        except OSError as exc:  # reset or closed by a systemd going away
            raise BusError(f"the host's systemd dropped the bus: {exc}") from exc
        if reply.header.message_type == MessageType.error:
            name = str(reply.header.fields.get(HeaderFields.error_name, ""))
            text = str(reply.body[0]) if reply.body else name
            raise BusError(f"systemd in the host: {text}", name)
        body_out: tuple[Any, ...] = tuple(reply.body)
        return body_out

    def _reply(self, serial: int) -> Message:
        deadline = time.monotonic() + self.timeout
        received = 0
        while True:
            for message in self._buffered():
                if message.header.fields.get(HeaderFields.reply_serial) == serial:
                    return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BusError(f"the host's systemd did not answer within {self.timeout:g}s")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError as exc:
                raise BusError(
                    f"the host's systemd did not answer within {self.timeout:g}s"
                ) from exc
            if not chunk:
                raise BusError("the host's systemd closed the bus")
            received += len(chunk)
            if received > MAX_MESSAGE:
                raise BusError("the host's systemd sent more than the arena reads")
            self.parser.add_data(chunk)

    def _buffered(self) -> Iterator[Message]:
        return buffered_messages(self.parser)

    def get(self, path: str, interface: str, name: str) -> Any:
        """One property (its value, unwrapped from the variant)."""
        (variant,) = self.call(path, PROPERTIES, "Get", "ss", (interface, name))
        return variant[1]

    def system_state(self) -> str:
        """The manager's `SystemState` (what `systemctl is-system-running` prints)."""
        return str(self.get(MANAGER_PATH, MANAGER, "SystemState"))

    def load_unit(self, unit: str) -> str:
        """The object path of `unit` (loaded on demand, as `systemctl show` does)."""
        (path,) = self.call(MANAGER_PATH, MANAGER, "LoadUnit", "s", (unit,))
        return str(path)

    def unit_state(self, unit: str) -> UnitState:
        """LoadState, ActiveState, MainPID (the host's numbering), ControlGroup, and for a
        service its NRestarts (restarts systemd made by itself, its `Restart=`)."""
        path = self.load_unit(unit)
        load = str(self.get(path, UNIT, "LoadState"))
        active = str(self.get(path, UNIT, "ActiveState"))
        main_pid = 0
        cgroup = ""
        restarts = 0
        if load == "loaded":
            with contextlib.suppress(BusError):  # not a service: no MainPID
                main_pid = int(self.get(path, SERVICE, "MainPID"))
            with contextlib.suppress(BusError):
                cgroup = str(self.get(path, SERVICE, "ControlGroup"))
            with contextlib.suppress(BusError):
                restarts = int(self.get(path, SERVICE, "NRestarts"))
        return UnitState(load, active, main_pid, cgroup, restarts)

    def reset_failed(self, unit: str) -> None:
        with contextlib.suppress(BusError):  # a unit that never failed has nothing to reset
            self.call(MANAGER_PATH, MANAGER, "ResetFailedUnit", "s", (unit,))

    def restart_unit(self, unit: str) -> str:
        """Queue a restart of `unit` (mode "replace"); returns the job's object path."""
        (job,) = self.call(MANAGER_PATH, MANAGER, "RestartUnit", "ss", (unit, "replace"))
        return str(job)

    def job_running(self, job: str) -> bool:
        """Whether the job `job` is still queued or running (gone once it finished)."""
        try:
            self.get(job, JOB, "State")
        except BusError as exc:
            if exc.name in UNKNOWN_OBJECT:
                return False
            raise
        return True


class KeptBus:
    """One host's connection to its systemd, kept between questions (one per question
    started the connector program and authenticated each time: at 32 hosts, with a
    health check a second each, that was a good part of the controller's CPU).

    `ask` runs one question at a time (from any thread) on the connection to the
    systemd running as `init_pid`, connecting first when there is none, when the host
    booted again (another init) or when systemd closed it; a question that fails
    drops the connection (the next one connects again) and raises."""

    def __init__(self) -> None:
        self._bus: SystemdBus | None = None
        self._lock = threading.Lock()

    def ask(self, init_pid: int, timeout: float, question: Callable[[SystemdBus], T]) -> T:
        with self._lock:
            bus = self._bus
            if bus is not None and (bus.init_pid != init_pid or not bus.open()):
                bus.close()
                bus = self._bus = None
            if bus is None:
                bus = self._bus = SystemdBus(init_pid, timeout=timeout)
            bus.timeout = timeout
            try:
                return question(bus)
            except BaseException:
                bus.close()
                self._bus = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._bus is not None:
                self._bus.close()
                self._bus = None


@dataclass(frozen=True)
class UnitState:
    """What the host's systemd says about one unit (a claim, not evidence)."""

    load: str
    active: str
    main_pid: int
    cgroup: str
    restarts: int = 0
