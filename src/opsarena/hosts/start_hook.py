"""An OCI `createRuntime` hook of the arena's own: sets a host's per-host kernel limits
and hands it its systemd cgroup, before its init runs.

Kernel limits: per-user limits such as inotify instances are counted in each user
namespace and again for the namespace's owner in the parent namespace, and podman
(as root) owns every host's namespace; so a host's own limit is what keeps it from
spending the machine root's budget. This hook enters the host's new user namespace and
sets `LIMITS` there (the host's root has no CAP_SYS_RESOURCE to raise them again).

Cgroup: on a cgroup v1/hybrid machine, runc creates a host's directory in the named `systemd`
hierarchy owned by the machine's root; a host in a user namespace of its own then
cannot create its units' cgroups there and its systemd refuses to boot. This hook,
run by podman (as the arena's user) every time a host starts, gives that one
directory and what is in it to the uid and gid that are root inside the host, so its
systemd manages its own subtree and nothing above it.

Disk writes: a host whose state carries the `opsarena.disk-io` annotation gets a write
bandwidth and IOPS cap on its disk's loop device in its own blkio (v1) or io (v2)
cgroup, read from `<disk>/loop` at every start (a power cut attaches a new loop
device). A cap it cannot set stops the host from starting (`hosts/disk.py`).

Every host the arena starts has a user namespace of its own (power-cut hosts too: the
driver maps their disk into a reserved range). A host that shares the machine's user
namespace would be root on the machine with the machine root's limits, so the hook
refuses to let it start.

Run as `python -I -S start_hook.py` with the OCI state on stdin; imports only the
standard library and executes nothing from the host.
"""

import ctypes
import json
import os
import stat
import sys

HIERARCHY = "/sys/fs/cgroup/systemd"
CLONE_NEWUSER = 0x10000000
IO_ANNOTATION = "opsarena.disk-io"
CGROUPS = "/sys/fs/cgroup"
LIMITS = {
    "/proc/sys/user/max_inotify_instances": 64,
    "/proc/sys/user/max_inotify_watches": 65536,
}
"""Per-host limits, set in the host's own user namespace (ample for any service)."""


def _root_of(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/{name}") as mapping:
        for line in mapping:
            inside, outside, _count = (int(part) for part in line.split())
            if inside == 0:
                return outside
    raise SystemExit(f"root of pid {pid} is not mapped in its {name}")


def set_limits(pid: int) -> None:
    """Enter the user namespace of `pid` (this program is single-threaded, as setns
    requires) and write `LIMITS` there: sysctls of that namespace, not the machine's."""
    if os.readlink(f"/proc/{pid}/ns/user") == os.readlink("/proc/self/ns/user"):
        raise SystemExit(f"pid {pid} shares the machine's user namespace: refusing to start it")
    fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWUSER) != 0:
        error = os.strerror(ctypes.get_errno())
        raise SystemExit(f"setns into the user namespace of {pid}: {error}")
    for path, value in LIMITS.items():
        if os.path.exists(path):
            with open(path, "w") as limit:
                limit.write(str(value))


def main() -> None:
    state = json.load(sys.stdin)
    pid = int(state["pid"])
    hand_over_cgroup(pid)
    limit_disk_writes(pid, (state.get("annotations") or {}).get(IO_ANNOTATION))
    set_limits(pid)  # last: after it this program's credentials are the host's


def hand_over_cgroup(pid: int) -> None:
    if not os.path.exists(f"{HIERARCHY}/cgroup.procs"):
        return  # cgroup v2: podman delegates the host's cgroup itself
    path = ""
    with open(f"/proc/{pid}/cgroup", errors="surrogateescape") as cgroup:
        for line in cgroup:
            _number, controllers, where = line.rstrip("\n").split(":", 2)
            if controllers == "name=systemd":
                path = where
    parts = [part for part in path.split("/") if part]
    if not parts or any(part in (".", "..") for part in parts):
        raise SystemExit(f"pid {pid} has no cgroup of its own in {HIERARCHY} ({path!r})")
    uid, gid = _root_of(pid, "uid_map"), _root_of(pid, "gid_map")
    if uid == 0 or gid == 0:
        raise SystemExit(f"the root of pid {pid} is the machine's root: refusing to start it")
    top = HIERARCHY + "/" + "/".join(parts)
    for directory, dirs, files in os.walk(top, followlinks=False):
        os.chown(directory, uid, gid, follow_symlinks=False)
        for name in files:
            if name != "release_agent":
                os.chown(os.path.join(directory, name), uid, gid, follow_symlinks=False)
        dirs[:] = [name for name in dirs if not os.path.islink(os.path.join(directory, name))]


def device_number(path: str) -> str:
    """`MAJOR:MINOR` of block device `path`."""
    info = os.stat(path)
    if not stat.S_ISBLK(info.st_mode):
        raise SystemExit(f"{path} is not a block device")
    return f"{os.major(info.st_rdev)}:{os.minor(info.st_rdev)}"


def cap_lines(controller: str, device: str, wbps: int, wiops: int) -> dict[str, str]:
    """The cgroup files (of `controller`, `blkio` or `io`) to write, and what, to cap
    writes to block device `device` (`MAJOR:MINOR`) at `wbps` bytes and `wiops`
    requests a second (0: no cap)."""
    if controller == "blkio":
        lines = {}
        if wbps:
            lines["blkio.throttle.write_bps_device"] = f"{device} {wbps}"
        if wiops:
            lines["blkio.throttle.write_iops_device"] = f"{device} {wiops}"
        return lines
    return {"io.max": f"{device} wbps={wbps or 'max'} wiops={wiops or 'max'}"}


def cgroup_dir(pid: int, root: str = CGROUPS) -> tuple[str, str]:
    """(controller, directory) of the cgroup that caps the I/O of `pid`: its v1 `blkio`
    cgroup, else its v2 cgroup when that has `io.max`."""
    unified = ""
    with open(f"/proc/{pid}/cgroup") as cgroup:
        for line in cgroup:
            _number, controllers, where = line.rstrip("\n").split(":", 2)
            parts = [part for part in where.split("/") if part]
            if any(part in (".", "..") for part in parts):
                raise SystemExit(f"pid {pid} has a strange cgroup: {where!r}")
            if "blkio" in controllers.split(","):
                directory = os.path.join(root, controllers, *parts)
                if os.path.exists(os.path.join(directory, "blkio.throttle.write_bps_device")):
                    return "blkio", directory
            if controllers == "":
                unified = os.path.join(root, "unified", *parts)
                if not os.path.isdir(os.path.join(root, "unified")):
                    unified = os.path.join(root, *parts)
    if unified and os.path.exists(os.path.join(unified, "io.max")):
        return "io", unified
    raise SystemExit(f"pid {pid} has no cgroup that can cap its disk writes")


def limit_disk_writes(pid: int, annotation: str | None) -> None:
    """Cap the writes of the host of `pid` on its disk as `annotation` (`WBPS WIOPS
    FILE`: bytes and requests a second, the file naming its loop device) says; nothing
    without one."""
    if not annotation:
        return
    wbps, wiops, loop_file = annotation.split(" ", 2)
    with open(loop_file) as named:
        device = device_number(named.read().strip())
    controller, directory = cgroup_dir(pid)
    for name, line in cap_lines(controller, device, int(wbps), int(wiops)).items():
        with open(os.path.join(directory, name), "w") as limit:
            limit.write(line)


if __name__ == "__main__":
    main()
