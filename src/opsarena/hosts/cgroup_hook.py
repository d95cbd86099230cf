"""An OCI `createRuntime` hook of the arena's own: hands a host its systemd cgroup.

On a cgroup v1/hybrid machine, runc creates a host's directory in the named `systemd`
hierarchy owned by the machine's root; a host in a user namespace of its own then
cannot create its units' cgroups there and its systemd refuses to boot. This hook,
run by podman (as the arena's user) every time a host starts, gives that one
directory and what is in it to the uid and gid that are root inside the host, so its
systemd manages its own subtree and nothing above it.

Run as `python -I -S cgroup_hook.py` with the OCI state on stdin; imports only the
standard library and executes nothing from the host.
"""

import json
import os
import sys

HIERARCHY = "/sys/fs/cgroup/systemd"


def _root_of(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/{name}") as mapping:
        for line in mapping:
            inside, outside, _count = (int(part) for part in line.split())
            if inside == 0:
                return outside
    raise SystemExit(f"root of pid {pid} is not mapped in its {name}")


def main() -> None:
    state = json.load(sys.stdin)
    pid = int(state["pid"])
    if not os.path.exists(f"{HIERARCHY}/cgroup.procs"):
        return  # cgroup v2: podman delegates the host's cgroup itself
    path = ""
    with open(f"/proc/{pid}/cgroup") as cgroup:
        for line in cgroup:
            _number, controllers, where = line.rstrip("\n").split(":", 2)
            if controllers == "name=systemd":
                path = where
    parts = [part for part in path.split("/") if part]
    if not parts or any(part in (".", "..") for part in parts):
        raise SystemExit(f"pid {pid} has no cgroup of its own in {HIERARCHY} ({path!r})")
    uid, gid = _root_of(pid, "uid_map"), _root_of(pid, "gid_map")
    if uid == 0:
        return  # the host shares the machine's user namespace: nothing to hand over
    top = HIERARCHY + "/" + "/".join(parts)
    for directory, dirs, files in os.walk(top, followlinks=False):
        os.chown(directory, uid, gid, follow_symlinks=False)
        for name in files:
            if name != "release_agent":
                os.chown(os.path.join(directory, name), uid, gid, follow_symlinks=False)
        dirs[:] = [name for name in dirs if not os.path.islink(os.path.join(directory, name))]


if __name__ == "__main__":
    main()
