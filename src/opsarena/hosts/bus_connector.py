"""A one-shot program of the arena's own that connects a socket to a host's systemd bus.

Run as `python -I -S bus_connector.py INIT_PID START_TIME UID GID FD` with FD a unix
socket of the arena's; it sends the connected socket back over FD and exits. With a
sixth argument CGROUP it instead sends CGROUP as one datagram to the host's
`/run/systemd/cgroups-agent` (what systemd's own cgroups agent sends when a unit's
cgroup empties; systemd checks the cgroup itself, so a needless one changes nothing).
It imports only the standard library and executes nothing from the host.

Why a separate process: systemd accepts a private-bus client only when its pid is
visible in systemd's own PID namespace and its uid is root there. So this program
resolves the socket path from outside (one component at a time, no symlink followed),
enters the host's PID namespace (setns affects children only), and forks; the child,
now a member of the host's PID namespace, makes itself non-dumpable (a competitor that
is root in the host cannot ptrace it or read its memory), takes the host's root uid and
gid as this machine maps them (losing every capability), connects, hands the socket
over and exits. It lives a few milliseconds and holds no secret of the arena's.
"""

import ctypes
import os
import socket
import sys

CLONE_NEWPID = 0x20000000
PR_SET_DUMPABLE = 4
BUS = ("run", "systemd", "private")
AGENT = ("run", "systemd", "cgroups-agent")


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return int(stat.read().rsplit(b")", 1)[1].split()[19])


def _fail(message: str) -> None:
    sys.stderr.write(message + "\n")
    os._exit(3)


def main() -> None:
    init_pid, start, uid, gid, channel_fd = (int(arg) for arg in sys.argv[1:6])
    empty_cgroup = sys.argv[6].encode() if len(sys.argv) > 6 else None
    parts = BUS if empty_cgroup is None else AGENT
    channel = socket.socket(fileno=channel_fd)
    libc = ctypes.CDLL(None, use_errno=True)
    root = os.open(f"/proc/{init_pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    pid_ns = os.open(f"/proc/{init_pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    if _start_time(init_pid) != start:
        _fail(f"pid {init_pid} is no longer the host's init")
    fd = root
    for index, part in enumerate(parts):
        flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
        if index < len(parts) - 1:
            flags |= os.O_DIRECTORY
        try:
            fd = os.open(part, flags, dir_fd=fd)
        except OSError as exc:
            _fail(f"cannot open {part!r} on the way to the host's systemd: {exc.strerror}")
    if (os.fstat(fd).st_mode & 0o170000) != 0o140000:
        _fail(f"/{'/'.join(parts)} in the host is not a socket")
    if libc.setns(pid_ns, CLONE_NEWPID) != 0:
        _fail(f"setns into the host's PID namespace: {os.strerror(ctypes.get_errno())}")
    child = os.fork()
    if child == 0:
        try:
            libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
            for number, args in ((116, (0, None)), (119, (gid, gid, gid)), (117, (uid, uid, uid))):
                if libc.syscall(number, *args) != 0:  # setgroups, setresgid, setresuid
                    _fail(f"taking the host's root ids: {os.strerror(ctypes.get_errno())}")
            if empty_cgroup is not None:
                agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                agent.settimeout(5.0)
                agent.connect(f"/proc/self/fd/{fd}")
                agent.send(empty_cgroup)
                os._exit(0)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5.0)
            sock.connect(f"/proc/self/fd/{fd}")
            socket.send_fds(channel, [b"s"], [sock.fileno()])
        except Exception as exc:  # reported to the arena as one line
            _fail(f"cannot connect to the host's systemd: {exc}")
        os._exit(0)
    _pid, status = os.waitpid(child, 0)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
