"""What a scripted builder writes into its host: the target, unit files, nginx config.

Pure functions only: each decides the text of one file from a `ServiceTarget`; the
builders (`builders.py`) write them and start the unit.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from opsarena.errors import UsageError

DEFAULT_PORT = 8080
DEFAULT_UNIT = "builder-app.service"
MAX_BODY_BYTES = 8 * 1024 * 1024
"""Largest record the deployed services accept (the challenge needs at least 1 MiB)."""

Storage = Literal["disk", "run", "memory"]
"""Where the records service keeps records: a state directory under /var/lib (survives
restart and reboot), a runtime directory under /run (survives restart only), or the
process's memory (survives neither)."""

# The unit's stem also names the system user and the directories, so it must be a valid
# user name too (useradd: at most 32 characters).
_UNIT_RE = re.compile(r"[a-z][a-z0-9-]{0,30}\.service")
# Same rule as `records_server.valid_record_id`, in nginx's regex syntax.
NGINX_RECORD_LOCATION = r"^/records/[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"


@dataclass(frozen=True)
class ServiceTarget:
    """Where a builder's service lives: its port, its unit, and the paths named after it."""

    port: int = DEFAULT_PORT
    unit: str = DEFAULT_UNIT
    challenge: str = ""
    """The challenge's name ("" when the params do not say): `tls-gateway` serves TLS."""
    server_name: str = ""
    """The name the certificate must carry (`tls-gateway`'s brief variable)."""

    @property
    def tls(self) -> bool:
        return self.challenge == "tls-gateway"

    @property
    def stem(self) -> str:
        """The unit's name without `.service`: the user, and the directories' name."""
        return self.unit.removesuffix(".service")

    @property
    def unit_path(self) -> str:
        return f"/etc/systemd/system/{self.unit}"

    @property
    def program_dir(self) -> str:
        return f"/usr/local/lib/{self.stem}"

    @property
    def config_dir(self) -> str:
        return f"/etc/{self.stem}"

    @property
    def state_dir(self) -> str:
        """Created by systemd (`StateDirectory=`), owned by the service's user."""
        return f"/var/lib/{self.stem}"

    @property
    def runtime_dir(self) -> str:
        """Created by systemd (`RuntimeDirectory=`); /run is emptied at every boot."""
        return f"/run/{self.stem}"

    @property
    def health_url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}/health"


def service_target(params: Mapping[str, Any]) -> ServiceTarget:
    """The target named by a challenge's `params` ("port", "unit"; defaults 8080 and
    builder-app.service). Raises `UsageError` for a port outside 1-65535 or a unit name
    that is not a lowercase `NAME.service` of at most 32 characters before the suffix."""
    port = params.get("port", DEFAULT_PORT)
    unit = params.get("unit", DEFAULT_UNIT)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise UsageError(f"scripted builders need a port in 1-65535, not {port!r}: fix the params")
    if not isinstance(unit, str) or not _UNIT_RE.fullmatch(unit):
        raise UsageError(
            f"scripted builders need a unit like builder-app.service "
            f"(lowercase letters, digits, dashes), not {unit!r}: fix the params"
        )
    challenge = params.get("challenge", "")
    server_name = params.get("server_name", "")
    if not isinstance(challenge, str) or not isinstance(server_name, str):
        raise UsageError("scripted builders need text for the challenge and server_name params")
    if not re.fullmatch(r"[a-z0-9.-]{0,253}", server_name):
        raise UsageError(f"server_name {server_name!r} is not a DNS name: fix the params")
    return ServiceTarget(port=port, unit=unit, challenge=challenge, server_name=server_name)


def records_server_command(
    target: ServiceTarget,
    script_path: str,
    *,
    storage: Storage,
    health_body: str,
    flaw: str | None = None,
    start_delay_s: int = 0,
    extra_args: tuple[str, ...] = (),
    durability: str = "full",
    launcher: tuple[str, ...] = (),
) -> str:
    """The `ExecStart=` line running the shared records server with these choices (a
    deliberate `flaw`; a shell sleeping `start_delay_s` before it starts the server;
    `extra_args` such as the TLS options; a `launcher` command the server's command line
    is given to, after `--`)."""
    argv = ["/usr/bin/python3", script_path, "--port", str(target.port)]
    if storage == "memory":
        argv.append("--in-memory")
    else:
        base = target.state_dir if storage == "disk" else target.runtime_dir
        argv += ["--storage", f"{base}/records"]
        if durability != "full":
            argv += ["--durability", durability]
    argv += ["--health-body", health_body, "--max-body", str(MAX_BODY_BYTES)]
    if flaw is not None:
        argv += ["--flaw", flaw]
    argv += extra_args
    if launcher:
        argv = [*launcher, "--", *argv]
    if start_delay_s:
        argv = ["/bin/sh", "-c", f"sleep {start_delay_s} && exec {shlex.join(argv)}"]
    # systemd splits ExecStart= much like a POSIX shell does for quoted words.
    return shlex.join(argv)


def records_unit(
    target: ServiceTarget,
    script_path: str,
    *,
    storage: Storage,
    health_body: str,
    builder: str,
    flaw: str | None = None,
    start_delay_s: int = 0,
    extra_args: tuple[str, ...] = (),
    service_lines: str = "",
    user: str | None = None,
    durability: str = "full",
    restart: bool = True,
    launcher: tuple[str, ...] = (),
) -> str:
    """The unit file of a Python records service (`Restart=always` unless `restart` is
    false, installable into multi-user.target; whether it is enabled is the builder's
    choice). `durability` is the server's `--durability` mode. With `extra_args` (TLS
    on 443 and 80) the unprivileged user may bind ports below 1024. `service_lines` are
    added to `[Service]` (sandboxing); `user` replaces the unit's own user (a flaw:
    root)."""
    directories = {
        "disk": f"StateDirectory={target.stem}\n",
        # Kept across restarts (the default removes it when the service stops), and
        # still gone after a reboot since /run is a tmpfs.
        "run": f"RuntimeDirectory={target.stem}\nRuntimeDirectoryPreserve=yes\n",
        "memory": "",
    }[storage]
    exec_start = records_server_command(
        target,
        script_path,
        storage=storage,
        health_body=health_body,
        flaw=flaw,
        start_delay_s=start_delay_s,
        extra_args=extra_args,
        durability=durability,
        launcher=launcher,
    )
    bind = "AmbientCapabilities=CAP_NET_BIND_SERVICE\n" if extra_args else ""
    restart_lines = "Restart=always\nRestartSec=200ms\n" if restart else "Restart=no\n"
    return (
        "[Unit]\n"
        f"Description=records service (opsarena scripted builder {builder})\n\n"
        "[Service]\n"
        "Type=exec\n"
        f"User={user or target.stem}\n"
        f"{directories}"
        f"{bind}"
        f"{service_lines}"
        f"ExecStart={exec_start}\n"
        f"{restart_lines}\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


TLS_FLAWS = ("self-signed", "legacy", "no-redirect", "no-hsts")
"""Deliberate `tls-gateway` flaws: a self-signed certificate; TLS 1.0 accepted; the
records API served on plain 80 instead of a redirect; no HSTS header."""

CA_DIR = "/etc/opsarena/ca"
"""Where `tls-gateway` places the arena's CA key and certificate on the host."""


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


def tls_issue_script(target: ServiceTarget, *, self_signed: bool) -> str:
    """Bash issuing the service's key and certificate for `target.server_name` with the
    host's openssl: signed by the arena's CA (or, as a flaw, self-signed), readable by the
    service's user only."""
    user, tls_dir, name = target.stem, f"{target.config_dir}/tls", target.server_name
    head = (
        "set -eu\n"
        f"id -u {user} >/dev/null 2>&1 || useradd --system --no-create-home "
        f"--home-dir /nonexistent --shell /usr/sbin/nologin {user}\n"
        f"install -d -m 0750 -o root -g {user} {tls_dir}\n"
        f"cd {tls_dir}\n"
    )
    new_key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout key.pem"
    ext = f"-subj /CN={name} -addext subjectAltName=DNS:{name}"
    if self_signed:
        issue = f"openssl req -x509 {new_key} {ext} -days 30 -out cert.pem 2>/dev/null\n"
    else:
        issue = (
            f"openssl req -new {new_key} {ext} -out req.csr 2>/dev/null\n"
            f"openssl x509 -req -in req.csr -CA {CA_DIR}/ca.crt -CAkey {CA_DIR}/ca.key "
            "-CAcreateserial -days 30 -copy_extensions copy -out cert.pem 2>/dev/null\n"
        )
    return head + issue + f"chgrp {user} key.pem cert.pem && chmod 0640 key.pem cert.pem\n"


def tls_server_args(target: ServiceTarget, flaw: str | None) -> tuple[str, ...]:
    """The records server's TLS options for `tls-gateway`, with one deliberate flaw."""
    tls_dir = f"{target.config_dir}/tls"
    args = ["--tls-cert", f"{tls_dir}/cert.pem", "--tls-key", f"{tls_dir}/key.pem"]
    args += ["--plain-port", "80", "--server-name", target.server_name]
    args += ["--tls-min", "1.0" if flaw == "legacy" else "1.2"]
    if flaw == "no-redirect":
        args += ["--plain-mode", "serve"]
    if flaw != "no-hsts":
        args.append("--hsts")
    return tuple(args)


def nginx_config(target: ServiceTarget) -> str:
    """An nginx configuration serving the records contract with its DAV module.

    PUT writes the body to a temporary file in the state directory and renames it over
    the record (201 new, 204 replaced); GET serves the file, 404 when absent. nginx does
    not fsync, so a record survives a service restart and a clean or container-level
    reboot, not a power cut before the kernel wrote it back.
    """
    state = target.state_dir
    temp_paths = "".join(
        f"    {kind}_temp_path {state}/{kind}-temp;\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return (
        f"# Written by opsarena's scripted builder webdav for {target.unit}.\n"
        "daemon off;\n"
        "worker_processes 1;\n"
        f"pid {target.runtime_dir}/nginx.pid;\n"
        "error_log stderr warn;\n\n"
        "events {\n    worker_connections 256;\n}\n\n"
        "http {\n"
        "    access_log off;\n"
        f"{temp_paths}"
        "    server {\n"
        f"        listen {target.port};\n"
        f"        client_max_body_size {MAX_BODY_BYTES};\n"
        "        location = /health {\n"
        "            default_type text/plain;\n"
        "            return 200 'ready';\n"
        "        }\n"
        f'        location ~ "{NGINX_RECORD_LOCATION}" {{\n'
        f"            root {state};\n"
        "            dav_methods PUT;\n"
        "            create_full_put_path on;\n"
        "            dav_access user:rw;\n"
        "            log_not_found off;\n"
        "            types { }\n"
        "            default_type application/octet-stream;\n"
        "            limit_except GET PUT {\n                deny all;\n            }\n"
        "        }\n"
        "        location / {\n            return 404;\n        }\n"
        "    }\n"
        "}\n"
    )


def nginx_unit(target: ServiceTarget, config_path: str) -> str:
    """The unit running nginx in the foreground with `config_path`, as its own user."""
    return (
        "[Unit]\n"
        "Description=records service on nginx WebDAV (opsarena scripted builder webdav)\n\n"
        "[Service]\n"
        "Type=exec\n"
        f"User={target.stem}\n"
        f"StateDirectory={target.stem}\n"
        f"RuntimeDirectory={target.stem}\n"
        f"ExecStart=/usr/sbin/nginx -c {config_path}\n"
        f"ExecReload=/usr/sbin/nginx -c {config_path} -s reload\n"
        "Restart=always\n"
        "RestartSec=200ms\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def activation_script(
    target: ServiceTarget, *, enable: bool, wait_seconds: float, wait: bool = True
) -> str:
    """Bash that creates the service user, reloads systemd, enables and starts the unit
    (or only starts it), then polls /health with curl until something answers. Exits 0
    once the port answers HTTP; exits 1 if it did not within `wait_seconds` or the unit
    failed for good, with the unit's last log lines and then a one-line reason on stderr.
    Exits non-zero at once when a systemctl command fails. Without `wait`, it exits 0
    right after systemctl (nothing is polled)."""
    user = target.stem
    start = "enable --now" if enable else "start"
    attempts = max(1, int(wait_seconds / 0.1))
    head = (
        "set -eu\n"
        f"id -u {user} >/dev/null 2>&1 || useradd --system --no-create-home "
        f"--home-dir /nonexistent --shell /usr/sbin/nologin {user}\n"
        "systemctl daemon-reload\n"
        f"systemctl {start} {target.unit}\n"
        # What was installed is made durable, as a careful deployer does: a power cut
        # must find the program, the unit and its enablement (crash-safe-records).
        "sync\n"
    )
    if not wait:
        return head + "exit 0\n"
    return head + (
        f"for _ in $(seq {attempts}); do\n"
        f"  curl -sk -o /dev/null --max-time 1 {target.health_url} && exit 0\n"
        f"  systemctl is-failed --quiet {target.unit} && break\n"
        "  sleep 0.1\n"
        "done\n"
        f"journalctl -u {target.unit} -n 5 --no-pager -o cat >&2 || true\n"
        f'echo "{target.unit} did not answer on port {target.port} '
        f'(unit $(systemctl is-active {target.unit}))" >&2\n'
        "exit 1\n"
    )
