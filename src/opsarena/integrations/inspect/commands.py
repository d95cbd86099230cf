"""How an Inspect sandbox request becomes one argv run in a host, and what its result means.

Pure functions only; `sandbox.py` runs what they build through `Host.exec` and raises
what they decide. Everything here runs *inside* the host, as confined as the
competitor: the wrappers are launched by absolute path (never through the image's
`PATH`, which the competitor controls), the caller's own command is resolved through
the sandbox's `PATH` with the caller's `env` applied first, as Inspect's `exec`
contract asks.

An exec runs as:

    /usr/bin/env -C CWD /usr/bin/systemd-run --scope --unit=SCOPE ... \
        [/usr/sbin/runuser -u USER --] /usr/bin/env -- K=V ... CMD...

(a numeric user is first turned into its name with `getent passwd` in the host).

`env -C` changes directory as root, so a user who may not list the working directory
still starts in it (as `docker exec --workdir` does). The transient systemd scope
holds every process the command starts, even one that calls `setsid` or daemonizes,
so a command past its timeout is killed as a whole tree (`systemctl kill SCOPE`), not
only its process group.
"""

from __future__ import annotations

import errno
import posixpath
import re
import shlex
from dataclasses import dataclass

from opsarena.hosts.registry import DEFAULT_DRIVER

ENV = "/usr/bin/env"
SYSTEMD_RUN = "/usr/bin/systemd-run"
SYSTEMCTL = "/usr/bin/systemctl"
RUNUSER = "/usr/sbin/runuser"
SHELL = "/bin/sh"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""The only directories the provider's own scripts take utilities from."""

ROOT_USERS = ("root", "0")

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def resolve_path(workdir: str, path: str) -> str:
    """`path` made absolute against the sandbox's working directory. Pure."""
    return posixpath.normpath(posixpath.join(workdir, path)) if path else workdir


def scope_unit(token: str) -> str:
    """The transient scope unit one exec runs in."""
    return f"inspect-exec-{token}.scope"


def exec_argv(
    cmd: list[str],
    *,
    workdir: str,
    scope: str,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    user: str | None = None,
) -> list[str]:
    """The argv that runs `cmd` in the host (see the module docstring). Pure.

    Raises `ValueError` for an empty `cmd`, an environment variable name that is not
    a shell identifier, or a command whose first word contains `=` (env would take it
    for an assignment).
    """
    if not cmd:
        raise ValueError("exec needs a command")
    if "=" in cmd[0]:
        raise ValueError(f"the command name {cmd[0]!r} contains '=': run it through a shell")
    assignments = []
    for name, value in (env or {}).items():
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a valid environment variable name")
        assignments.append(f"{name}={value}")
    directory = resolve_path(workdir, cwd or "")
    return [
        ENV, "-C", directory,
        SYSTEMD_RUN, "--scope", "--quiet", "--collect", f"--unit={scope}",
        *user_switch(user),
        ENV, "--", *assignments, *cmd,
    ]  # fmt: skip


NUMERIC_USER_SCRIPT = f"""image_path=$PATH
PATH={SYSTEM_PATH}
name=$(getent passwd "$0" | cut -d: -f1)
if [ -z "$name" ]; then echo "runuser: user $0 does not exist" >&2; exit 1; fi
PATH=$image_path
exec {RUNUSER} -u "$name" -- "$@"
"""
"""Switches to the user with UID `$0` (runuser takes only names); the command keeps
the `PATH` it would have had, the lookup uses only the system directories."""


def user_switch(user: str | None) -> list[str]:
    """The argv prefix that runs the rest as `user` (a name or a UID); none for root.
    Pure."""
    if user is None or user in ROOT_USERS:
        return []
    if user.isdigit():
        return [SHELL, "-c", NUMERIC_USER_SCRIPT, user]
    return [RUNUSER, "-u", user, "--"]


def kill_scope_argv(scope: str) -> list[str]:
    """Kill every process left in `scope` (after a timeout). Pure."""
    return [SYSTEMCTL, "kill", "--signal=KILL", "--", scope]


def is_exec_permission_error(cmd: list[str], exit_code: int, stderr: str) -> bool:
    """True when env could not execute `cmd[0]` because it is not executable (GNU env
    exits 126 and says so in one line naming the file). Pure."""
    if exit_code != 126 or not cmd:
        return False
    lines = stderr.strip().splitlines()
    if len(lines) != 1:
        return False
    # GNU quotes the name with U+2018/U+2019 in a UTF-8 locale, ASCII quotes otherwise.
    quoted = rf"[\u2018']{re.escape(cmd[0])}[\u2019']"
    return re.fullmatch(rf"{re.escape(ENV)}: {quoted}: Permission denied", lines[0]) is not None


def is_scope_refused(exit_code: int, stdout: str, stderr: str) -> bool:
    """True when systemd in the host refused to start the command's scope (e.g. it is
    shutting down), so the command never ran: the host cannot run commands. Pure."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    return (
        exit_code != 0
        and not stdout
        and len(lines) == 1
        and lines[0].startswith("Failed to start transient scope unit:")
    )


# ---- files ---------------------------------------------------------------------------

READ_SCRIPT = f"""PATH={SYSTEM_PATH}
f=$1
if [ -d "$f" ]; then exit 21; fi
if [ ! -e "$f" ]; then exit 2; fi
if [ ! -f "$f" ]; then exit 22; fi
info=$(stat -L -c '%A %s' -- "$f") || exit 5
mode=${{info% *}}
size=${{info#* }}
case "$mode" in ?r*) ;; *) exit 13;; esac
if [ "$size" -gt "$2" ]; then exit 27; fi
printf '%s %s\\n' "$mode" "$size"
exec cat -- "$f"
"""
"""Prints `MODE SIZE` on a line, then the file's bytes; exits with the errno of what
made the read impossible (a file whose owner may not read it counts as unreadable,
as for Inspect's docker provider, since the arena reads as root)."""

WRITE_SCRIPT = f"""PATH={SYSTEM_PATH}
f=$1
if [ -d "$f" ]; then exit 21; fi
if [ -e "$f" ]; then
  mode=$(stat -L -c '%A' -- "$f") || exit 5
  case "$mode" in ??w*) ;; *) exit 13;; esac
fi
parent=$(dirname -- "$f")
mkdir -p -- "$parent" || exit 20
cat > "$f" || exit 5
"""
"""Writes stdin to the file, creating parents; exits with the errno of what made the
write impossible (a file whose owner may not write it counts as read-only)."""


@dataclass(frozen=True)
class FileFailure:
    """Why a file operation failed, as the exception the contract names."""

    kind: type[OSError]
    code: int
    message: str

    def error(self, path: str) -> OSError:
        return self.kind(self.code, self.message, path)


_FAILURES: dict[int, FileFailure] = {
    2: FileFailure(FileNotFoundError, errno.ENOENT, "No such file or directory"),
    13: FileFailure(PermissionError, errno.EACCES, "Permission denied"),
    20: FileFailure(NotADirectoryError, errno.ENOTDIR, "A parent of the path is not a directory"),
    21: FileFailure(IsADirectoryError, errno.EISDIR, "Is a directory"),
    22: FileFailure(OSError, errno.EINVAL, "Not a regular file"),
}

FILE_TOO_LARGE = 27


def file_failure(exit_code: int, stderr: str) -> FileFailure:
    """The failure a file script's exit code stands for. Pure."""
    known = _FAILURES.get(exit_code)
    if known is not None:
        return known
    detail = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit code {exit_code}"
    return FileFailure(OSError, errno.EIO, f"the host refused the file operation: {detail}")


def split_read_output(stdout: bytes) -> tuple[int, bytes]:
    """The size line and the bytes of `READ_SCRIPT`'s output. Pure. Raises `ValueError`
    when the output is not shaped as the script prints it."""
    header, newline, data = stdout.partition(b"\n")
    fields = header.split()
    if not newline or len(fields) != 2 or not fields[1].isdigit():
        raise ValueError(f"unexpected read_file output header {header[:80]!r}")
    size = int(fields[1])
    if len(data) != size:
        raise ValueError(f"read_file read {len(data)} bytes of a {size} byte file")
    return size, data


def connection_command(host_name: str, driver: str, user: str | None) -> str:
    """The shell command that opens an interactive login shell in the host, as `user`
    (root by default): `opsarena hosts shell`, which asks the host's driver for it
    (`Host.shell_argv`). Pure."""
    command = ["opsarena", "hosts", "shell", host_name]
    if user is not None and user not in ROOT_USERS:
        command += ["--user", user]
    return shlex.join(command if driver == DEFAULT_DRIVER else [*command, "--driver", driver])
