"""hardened-service's scripted builders: the records service run least-privileged.

`reference` removes the planted listener for good, closes what its user could write
besides its data, and runs the server as its own user with no new privileges; each
flawed builder is `reference` with one of `HARDENED_FLAWS` (`calibration.toml` says
where each stops and why).
"""

from __future__ import annotations

import shlex
from typing import Any, ClassVar

from opsarena.agents.scripted import IdleBuilder, RecordsServiceBuilder, ScriptedBuilder
from opsarena.agents.scripted.deploy import ServiceTarget
from opsarena.hosts import ExecResult, Host

HARDENED_FLAWS = (
    "root", "planted-left", "stopped-only", "writable", "saved-root", "acl-writable"
)  # fmt: skip
"""Deliberate `hardened-service` flaws: the service runs as root; the planted listener
left running; stopped but still enabled (back after a reboot); no write sandbox; started
as root and dropped to its user with root kept as the saved uid and gid (its effective
ids are the user's, and it can become root again: `SAVED_ROOT_LAUNCHER`); its program
directory root's and 0755 as the reference's, but a POSIX ACL entry lets the service's
user write there (only the ACL says so: the mode's group bits show its mask)."""

ACL_GRANT = """\
import os, pwd, struct, sys
path, user = sys.argv[1], sys.argv[2]
mode = os.stat(path).st_mode
# struct posix_acl_xattr: version 2, then (tag, permissions, id) per entry, in tag order.
entries = [(0x01, mode >> 6 & 7, 0xFFFFFFFF), (0x02, 7, pwd.getpwnam(user).pw_uid),
           (0x04, mode >> 3 & 7, 0xFFFFFFFF), (0x10, 7, 0xFFFFFFFF), (0x20, mode & 7, 0xFFFFFFFF)]
value = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
os.setxattr(path, "system.posix_acl_access", value)
"""
"""What `setfacl -m u:USER:rwx PATH` does (the hosts have no setfacl), in the host's
python3: PATH USER."""

SAVED_ROOT_LAUNCHER = b"""\
# opsarena scripted builder hardened-saved-root: a flawed privilege drop, on purpose.
# Run as root: USER DATA_DIR -- /usr/bin/python3 SERVER ARGS...
import os, pwd, runpy, sys

user, data = sys.argv[1], sys.argv[2]
command = sys.argv[sys.argv.index("--") + 1 :]
pw = pwd.getpwnam(user)
for directory, _dirs, files in os.walk(data):  # StateDirectory= made it root's
    for path in [directory, *(os.path.join(directory, f) for f in files)]:
        os.chown(path, pw.pw_uid, pw.pw_gid)
os.setgroups([pw.pw_gid])
os.setresgid(pw.pw_gid, pw.pw_gid, 0)  # the saved gid stays root's
os.setresuid(pw.pw_uid, pw.pw_uid, 0)  # the saved uid too: setresuid(0, 0, 0) works later
sys.argv = command[1:]
runpy.run_path(command[1], run_name="__main__")
"""
"""What `hardened-saved-root` runs as root in front of the records server: the server
then runs with effective ids of the service's user, saved ids root's and the permitted
capabilities kept (the kernel clears only the effective set)."""

PLANTED_UNIT = "legacy-admin.service"
"""The listener `hardened-service` plants before the agents start."""

SANDBOX_LINES = "NoNewPrivileges=yes\n"
"""No privileges ever gained: no set-user-ID or file-capability program can make the
service root again (mount-namespace sandboxing cannot work on these hosts)."""


def hardened_script(flaw: str | None) -> str:
    """Bash removing the planted listener for good (or, as a flaw, not, or only until
    the next boot)."""
    if flaw == "planted-left":
        return "true\n"
    if flaw == "stopped-only":
        return f"systemctl stop {PLANTED_UNIT}\n"
    return (
        f"systemctl disable --now {PLANTED_UNIT}\n"
        f"rm -f /etc/systemd/system/{PLANTED_UNIT} && systemctl daemon-reload\n"
    )


def sandbox_script(flaw: str | None, target: ServiceTarget | None = None) -> str:
    """Bash closing what the service's user could write on disk besides its data: the
    world-writable /var/tmp (systemd's ProtectSystem= cannot work without mount
    namespaces, which these hosts do not give). The `writable` flaw leaves it; the
    `acl-writable` flaw then grants the user its program directory by an ACL entry."""
    if flaw == "writable":
        return "true\n"
    closed = "chmod 1770 /var/tmp\n"
    if flaw != "acl-writable" or target is None:
        return closed
    user = target.stem
    return (
        closed + f"id -u {user} >/dev/null 2>&1 || useradd --system --no-create-home "
        f"--home-dir /nonexistent --shell /usr/sbin/nologin {user}\n"
        + f"install -d -m 0755 {target.program_dir}\n"
        + f"python3 -c {shlex.quote(ACL_GRANT)} {target.program_dir} {user}\n"
    )


class HardenedBuilder(RecordsServiceBuilder):
    """The records server hardened, with the subclass's `hardened_flaw` (none by default)."""

    hardened_flaw: ClassVar[str | None] = None

    async def prepare(self, host: Host, target: ServiceTarget) -> ExecResult | None:
        removed = await host.exec(
            hardened_script(self.hardened_flaw) + sandbox_script(self.hardened_flaw, target),
            timeout=60.0,
        )
        if removed.ok and self.hardened_flaw == "saved-root":
            await host.write_file(f"{target.program_dir}/launch.py", SAVED_ROOT_LAUNCHER)
        return removed

    def unit_options(self, target: ServiceTarget) -> dict[str, Any]:
        # SANDBOX_LINES also for `writable`: its flaw is /var/tmp alone.
        options: dict[str, Any] = {"service_lines": SANDBOX_LINES}
        if self.hardened_flaw in ("root", "saved-root"):
            options["user"] = "root"
        if self.hardened_flaw == "saved-root":
            launch = f"{target.program_dir}/launch.py"
            options["launcher"] = ("/usr/bin/python3", launch, target.stem, target.state_dir)
        return options


class ReferenceBuilder(HardenedBuilder):
    """Its own user, no new privileges, the planted listener gone: passes every milestone."""

    name = "reference"


class HardenedRootBuilder(HardenedBuilder):
    """The service runs as root (fails `service-user`)."""

    name = "hardened-root"
    hardened_flaw = "root"


class HardenedPlantedLeftBuilder(HardenedBuilder):
    """Leaves the planted listener (fails `only-listener`)."""

    name = "hardened-planted-left"
    hardened_flaw = "planted-left"


class HardenedStoppedOnlyBuilder(HardenedBuilder):
    """Stops the planted listener but leaves it enabled (fails
    `host-reboot`: it is back after the reboot)."""

    name = "hardened-stopped-only"
    hardened_flaw = "stopped-only"


class HardenedWritableBuilder(HardenedBuilder):
    """No write sandbox (fails `write-sandbox`)."""

    name = "hardened-writable"
    hardened_flaw = "writable"


class HardenedAclWritableBuilder(HardenedBuilder):
    """Its program directory looks root's (0755) but a POSIX ACL entry
    lets the service's user write there (fails `write-sandbox`)."""

    name = "hardened-acl-writable"
    hardened_flaw = "acl-writable"


class HardenedSavedRootBuilder(HardenedBuilder):
    """Starts the server as root and drops to its user keeping root as
    the saved uid and gid (and the permitted capabilities): its effective uid is the
    user's, but it can become root again (fails `service-user`)."""

    name = "hardened-saved-root"
    hardened_flaw = "saved-root"


BUILDERS: tuple[type[ScriptedBuilder], ...] = (
    ReferenceBuilder,
    IdleBuilder,
    HardenedRootBuilder,
    HardenedPlantedLeftBuilder,
    HardenedStoppedOnlyBuilder,
    HardenedWritableBuilder,
    HardenedSavedRootBuilder,
    HardenedAclWritableBuilder,
)
