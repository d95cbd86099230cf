"""The podman driver: each host is a podman container running systemd as PID 1.

Containers have no network (`--network none`), so a host has only its own loopback;
the arena reaches servers in it through `connect()` (a socket made in the
container's network namespace) and runs commands through `podman exec`.

What a machine needs is detected when the driver starts, never assumed: a hybrid
cgroup hierarchy needs the runc runtime (crun refuses it), and ulimits are capped
at the arena's own hard limits (raising them needs CAP_SYS_RESOURCE).

Trust: the arena never runs a program from a host's filesystem with its own
privileges. Readiness and restarts go over the host's private systemd bus
(`systemd_bus`); the effect of a restart and of a disk freeze is confirmed with
kernel facts read from outside (`kernel`); the freeze itself is mount(2) from a thread
that entered the host's mount namespace. Only `exec`, `read_file` and `write_file` run
inside a host, through `podman exec`, exactly as confined as the competitor's own
commands, and their output is never evidence.

The modules, each importing only those above it in this list:
- `confine`: the seccomp profile, the start hook's configuration, the machine checks;
- `cli`: `Podman` (the podman command line) and the labels on what the arena makes;
- `disk`: a host's own disk and the id range it is shifted into;
- `core`: a host's state, init (its boot id), systemd bus and readiness;
- `facts`: unit members, port owners and disk use, read from outside;
- `faults`: restart, crash, reboot, power cut, directory loss, disk freeze;
- `host`: `PodmanHost` (commands, files and connections on top of the above);
- `driver`: `PodmanDriver` (create, get, list, remove, cleanup).
Everything other packages use is importable from `opsarena.hosts.podman` itself.
"""

from opsarena.hosts.podman.cli import (
    DISK_KINDS,
    LABEL_DISK,
    LABEL_IDS_MATCH,
    LABEL_IDS_OF,
    LABEL_IMAGE,
    LABEL_MATCH,
    LABEL_TERRITORY,
    PODMAN_TIMEOUT,
    RUNC_ROOT,
    Podman,
)
from opsarena.hosts.podman.confine import CLONE_NEWUSER, DEFAULT_SECCOMP, seccomp_profile
from opsarena.hosts.podman.core import printable_state
from opsarena.hosts.podman.disk import disk_kind, ids_name
from opsarena.hosts.podman.driver import PodmanDriver
from opsarena.hosts.podman.faults import remount_root_read_only
from opsarena.hosts.podman.host import PodmanHost

__all__ = [
    "CLONE_NEWUSER",
    "DEFAULT_SECCOMP",
    "DISK_KINDS",
    "LABEL_DISK",
    "LABEL_IDS_MATCH",
    "LABEL_IDS_OF",
    "LABEL_IMAGE",
    "LABEL_MATCH",
    "LABEL_TERRITORY",
    "PODMAN_TIMEOUT",
    "RUNC_ROOT",
    "Podman",
    "PodmanDriver",
    "PodmanHost",
    "disk_kind",
    "ids_name",
    "printable_state",
    "remount_root_read_only",
    "seccomp_profile",
]
