"""hardened-service's checks and setup: who listens, as whom, and what it may write,
all read from the kernel on the arena side.

The setup plants a listener before the agents start: `legacy-admin.service`, enabled,
a small program listening on a port derived from the seed. The checks read kernel facts
of the host from outside it, never a program's output: the host's TCP socket table
(`/proc/<init>/net/tcp{,6}` of the host's init, i.e. its network namespace), which of
the host's processes hold each listening socket (their fds), their credentials
(`/proc/<pid>/status`, translated through the host's uid map), and which files of the
host's disk their user could write (an lstat-only walk of `/proc/<init>/root`, memory
filesystems skipped, capabilities that pass permissions counted as writing anything).
systemd's ProtectSystem= cannot work on these hosts (no mount namespaces to give),
so the sandbox is judged by permissions, as the kernel would enforce them. The host's
init pid comes from the host-trust interface (`Host.init_process`, refreshed by
`Host.port_owners`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import stat
from dataclasses import dataclass

import opsarena.referee.checks  # noqa: F401  (registers the built-in checks used below)
from opsarena.challenges.checks import CheckContext, Verdict, get_check, register_check
from opsarena.challenges.setup import Setup, register_setup
from opsarena.errors import HostError
from opsarena.hosts import Host
from opsarena.referee.failures import Observation

PLANTED_UNIT = "legacy-admin.service"
DATA_DIR = "/var/lib/builder-app"
NOBODY = 65534
LISTEN = "0A"
API_FILESYSTEMS = frozenset(
    {"proc", "sysfs", "devtmpfs", "devpts", "mqueue", "cgroup", "cgroup2", "tmpfs",
     "hugetlbfs", "bpf", "tracefs", "debugfs", "securityfs", "pstore", "binfmt_misc",
     "fusectl", "configfs", "ramfs", "nsfs"}
)  # fmt: skip
"""Memory or kernel-API filesystems: writable ones are not the disk."""


def planted_port(seed: bytes) -> int:
    digest = hmac.new(seed, b"opsarena-hardened:planted-port", hashlib.sha256).digest()
    return 9000 + int.from_bytes(digest[:2], "big") % 900


PLANTED_PROGRAM = b'''import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", int(sys.argv[1])))
s.listen(8)
while True:
    c, _ = s.accept()
    c.sendall(b"legacy admin console\\n")
    c.close()
'''


def planted_unit(port: int) -> bytes:
    return (
        "[Unit]\nDescription=legacy admin console (left by a previous admin)\n\n"
        "[Service]\nExecStart=/usr/bin/python3 /usr/local/lib/legacy-admin/console.py "
        f"{port}\nRestart=always\n\n[Install]\nWantedBy=multi-user.target\n"
    ).encode()


def variables(seed: bytes) -> dict[str, str]:
    return {"data_dir": DATA_DIR}


async def place(host: Host, seed: bytes) -> None:
    """Plant the listener (before the agents start, inside the host's confinement)."""
    await host.write_file("/usr/local/lib/legacy-admin/console.py", PLANTED_PROGRAM)
    await host.write_file(f"/etc/systemd/system/{PLANTED_UNIT}", planted_unit(planted_port(seed)))
    result = await host.exec(f"systemctl enable --now {PLANTED_UNIT}", timeout=30.0)
    if not result.ok:
        raise HostError(f"planting {PLANTED_UNIT} failed: {result.stderr.decode()[-200:]}")


register_setup("hardened-service", Setup(variables=variables, place=place))


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket of the host and the host's processes holding it."""

    port: int
    inode: int
    owners: tuple[tuple[int, str, int], ...]
    """(pid on this machine, comm, uid as the host sees it) per holding process."""


def parse_tcp_table(text: str) -> list[tuple[int, int]]:
    """(port, inode) of every LISTEN row of a /proc/net/tcp{,6} table. Pure."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        found.append((int(fields[1].rsplit(":", 1)[1], 16), int(fields[9])))
    return found


def host_uid(uid: int, uid_map: str) -> int:
    """`uid` (as this machine sees it) as the host sees it, through its uid_map. Pure."""
    for line in uid_map.splitlines():
        parts = line.split()
        if len(parts) == 3:
            inside, outside, count = (int(p) for p in parts)
            if outside <= uid < outside + count:
                return inside + uid - outside
    return -1


WRITE_CAPABILITIES = {0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 3: "CAP_FOWNER", 21: "CAP_SYS_ADMIN"}
"""Capabilities that let a process write past file permissions."""


def memory_mounts(mountinfo: str) -> list[str]:
    """Mount points of memory or kernel-API filesystems (not the disk). Pure."""
    points = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and tail and tail[0] in API_FILESYSTEMS:
            points.append(fields[4].replace("\\040", " "))
    return points


def permitted(
    mode: int, owner: int, group: int, uid: int, gids: frozenset[int], bit: int = 0o2
) -> bool:
    """Whether permission bits `mode` of a file owned by `owner`:`group` give `uid` (with
    groups `gids`) the permission `bit` (0o2 write, 0o1 search) (POSIX: the first
    matching class decides). Pure."""
    if owner == uid:
        return bool(mode & (bit << 6))
    if group in gids:
        return bool(mode & (bit << 3))
    return bool(mode & bit)


def writable_by(mode: int, owner: int, group: int, uid: int, gids: frozenset[int]) -> bool:
    """Whether `uid` may write a file of these permissions. Pure."""
    return permitted(mode, owner, group, uid, gids, 0o2)


def write_capabilities(cap_eff_hex: str) -> list[str]:
    """The capabilities of `WRITE_CAPABILITIES` set in a CapEff mask. Pure."""
    mask = int(cap_eff_hex, 16)
    return [name for bit, name in WRITE_CAPABILITIES.items() if mask >> bit & 1]


def _walk_writable(root: str, skip: list[str], data_dir: str, uid: int, gids: frozenset[int],
                   limit: int = 20) -> list[str]:
    """Blocking: paths under `root` (a /proc/<pid>/root) on disk, outside `data_dir`,
    that `uid` may reach (search permission on every directory above) and write. Only
    lstat: nothing is followed, opened or read."""
    found: list[str] = []
    data = data_dir.rstrip("/")
    stack = ["/"]
    while stack and len(found) < limit:
        directory = stack.pop()
        try:
            names = os.listdir(root + directory)
        except OSError:
            continue
        for name in names:
            path = (directory.rstrip("/") + "/" + name)
            if path == data or path.startswith(data + "/") or path in skip:
                continue
            try:
                st = os.lstat(root + path)
            except OSError:
                continue
            kind = stat.S_IFMT(st.st_mode)
            if kind == stat.S_IFLNK:
                continue
            if writable_by(st.st_mode, st.st_uid, st.st_gid, uid, gids):
                found.append(f"{path} ({stat.filemode(st.st_mode)} {st.st_uid}:{st.st_gid})")
            if kind == stat.S_IFDIR and permitted(st.st_mode, st.st_uid, st.st_gid, uid, gids, 1):
                stack.append(path)
    return found


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as file:
        return file.read()


def _listeners_of(init_pid: int) -> list[Listener]:
    """Blocking: the host's listening sockets and their holders, from this machine's
    /proc (kernel facts; nothing of the host's runs)."""
    sockets: dict[int, int] = {}
    for table in ("tcp", "tcp6"):
        for port, inode in parse_tcp_table(_read(f"/proc/{init_pid}/net/{table}")):
            sockets[inode] = port
    netns = os.readlink(f"/proc/{init_pid}/ns/net")
    uid_map = _read(f"/proc/{init_pid}/uid_map")
    holders: dict[int, list[tuple[int, str, int]]] = {inode: [] for inode in sockets}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.readlink(f"/proc/{pid}/ns/net") != netns:
                continue
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            status = _read(f"/proc/{pid}/status")
        except OSError:
            continue  # gone meanwhile
        uid_line = next((ln for ln in status.splitlines() if ln.startswith("Uid:")), "Uid: -1")
        uid = host_uid(int(uid_line.split()[2]), uid_map)  # the effective uid
        names = [ln.split(None, 1)[1] for ln in status.splitlines() if ln.startswith("Name:")]
        comm = names[0] if names else "?"
        for inode in sockets:
            if f"socket:[{inode}]" in links:
                holders[inode].append((pid, comm, uid))
    ordered = sorted(sockets, key=lambda i: sockets[i])
    return [Listener(sockets[i], i, tuple(holders[i])) for i in ordered]


async def host_init_pid(host: Host, port: int) -> int:
    """The host's init as this machine numbers it (the host-trust interface: asking for
    `port_owners` refreshes the driver's view of the host's init, after a reboot too)."""
    await host.port_owners(port)
    init = host.init_process
    if init is None:
        raise HostError("the driver shows no init process for this host")
    return init.pid


async def listeners(host: Host, port: int = 8080) -> list[Listener]:
    init_pid = await host_init_pid(host, port)
    return await asyncio.to_thread(_listeners_of, init_pid)


def _fail(reason: str, step: str, detail: str, reproduce: str) -> Verdict:
    return Verdict.failed(
        reason, Observation(step=step, elapsed_ms=0, error=detail, reproduce=reproduce).render()
    )


def judge_user(owners: tuple[tuple[int, str, int], ...], port: int) -> tuple[str, str] | None:
    """None when every process holding `port` runs as one dedicated non-root user; else
    (reason, why). Pure."""
    if not owners:
        return "service_not_running", f"no process of the host holds the socket on {port}"
    uids = {uid for _pid, _comm, uid in owners}
    described = ", ".join(f"pid {pid} {comm} uid {uid}" for pid, comm, uid in owners)
    if 0 in uids:
        return "service_runs_as_root", f"the listener on {port} runs as root: {described}"
    if NOBODY in uids or -1 in uids or len(uids) != 1:
        return "service_user_not_dedicated", f"not one dedicated user: {described}"
    return None


def judge_others(found: list[Listener], allowed: set[int]) -> str | None:
    """None when nothing but `allowed` ports listens; else which do. Pure."""
    others = [x for x in found if x.port not in allowed]
    if not others:
        return None
    return "; ".join(
        f"port {x.port} held by "
        + (", ".join(f"pid {p} {c} uid {u}" for p, c, u in x.owners) or "no process")
        for x in others
    )


async def _facts(host: Host, ctx: CheckContext) -> tuple[list[Listener], Verdict | None]:
    try:
        return await listeners(host, ctx.challenge.port), None
    except (OSError, HostError, AttributeError) as exc:
        return [], Verdict.referee_error("host_unavailable", f"kernel facts unreadable: {exc}")


async def user_verdict(host: Host, ctx: CheckContext) -> Verdict:
    found, error = await _facts(host, ctx)
    if error:
        return error
    port = ctx.challenge.port
    owners = tuple(o for x in found if x.port == port for o in x.owners)
    problem = judge_user(owners, port)
    if problem:
        return _fail(problem[0], f"owner of the socket listening on {port}", problem[1],
                     f"ss -ltnp 'sport = :{port}'; ps -o user,pid,comm -p $(pidof python3)")
    return Verdict.passed({"uid": owners[0][2], "pids": [o[0] for o in owners]})


async def others_verdict(host: Host, ctx: CheckContext) -> Verdict:
    found, error = await _facts(host, ctx)
    if error:
        return error
    problem = judge_others(found, set(ctx.challenge.all_ports))
    if problem:
        return _fail("unexpected_listener", "the host's listening TCP sockets", problem, "ss -ltnp")
    return Verdict.passed({"listening": sorted({x.port for x in found})})


def _sandbox_facts(init_pid: int, pid: int) -> list[str]:
    """Blocking: what `pid` (a process of the host) may write on disk outside the data
    directory, from its credentials and the host's files' permissions."""
    status = _read(f"/proc/{pid}/status").splitlines()
    field = {ln.split(":", 1)[0]: ln.split(":", 1)[1].split() for ln in status if ":" in ln}
    capabilities = write_capabilities(field.get("CapEff", ["0"])[0])
    if capabilities:
        return [f"it holds {', '.join(capabilities)}: it may write anything"]
    uid = int(field["Uid"][1])
    gids = frozenset(int(g) for g in [field["Gid"][1], *field.get("Groups", [])])
    skip = memory_mounts(_read(f"/proc/{init_pid}/mountinfo"))
    # Ids compared as this machine sees them, on both sides (status and lstat).
    return _walk_writable(f"/proc/{init_pid}/root", skip, DATA_DIR, uid, gids)


async def sandbox_verdict(host: Host, ctx: CheckContext) -> Verdict:
    found, error = await _facts(host, ctx)
    if error:
        return error
    owners = [o for x in found if x.port == ctx.challenge.port for o in x.owners]
    if not owners:
        return _fail("service_not_running", "what the service may write",
                     f"no process holds port {ctx.challenge.port}", "ss -ltnp")
    problems: list[str] = []
    try:
        init_pid = await host_init_pid(host, ctx.challenge.port)
        for pid, comm, _uid in owners[:1]:
            problems += [f"pid {pid} {comm}: {m}"
                         for m in await asyncio.to_thread(_sandbox_facts, init_pid, pid)]
    except (OSError, HostError, KeyError, ValueError) as exc:
        return Verdict.referee_error("host_unavailable", f"what the service may write: {exc}")
    if problems:
        return _fail("writable_outside_data", "what the service may write (permissions, disk)",
                     "writable outside " + DATA_DIR + ": " + "; ".join(problems[:5]),
                     "find / -xdev -writable -not -path '/proc/*' (as the service's user)")
    return Verdict.passed({"writable": DATA_DIR})


@register_check("service-user")
async def service_user(host: Host, ctx: CheckContext) -> Verdict:
    """Whoever holds the service's listening socket runs as one dedicated non-root user."""
    return await user_verdict(host, ctx)


@register_check("only-listener")
async def only_listener(host: Host, ctx: CheckContext) -> Verdict:
    """No TCP socket of the host listens on any port but the challenge's."""
    return await others_verdict(host, ctx)


@register_check("write-sandbox")
async def write_sandbox(host: Host, ctx: CheckContext) -> Verdict:
    """The service's processes can write nothing on disk outside the data directory:
    their own mount table shows every other disk filesystem read-only."""
    return await sandbox_verdict(host, ctx)


@register_check("hardened-reboot")
async def hardened_reboot(host: Host, ctx: CheckContext) -> Verdict:
    """Reboot durability (the built-in check), then the user, the listeners and the
    sandbox once more: the planted listener must stay gone."""
    verdict = await get_check("fault-durability")(host, ctx)
    for after in (user_verdict, others_verdict, sandbox_verdict):
        if verdict.outcome != "passed":
            return verdict
        nxt = await after(host, ctx)
        verdict = nxt if nxt.outcome != "passed" else verdict
    return verdict
