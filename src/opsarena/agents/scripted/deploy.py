"""What a scripted builder writes into its host: the target, the records unit, activation.

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


@dataclass(frozen=True)
class ServiceTarget:
    """Where a builder's service lives: its port, its unit, and the paths named after it."""

    port: int = DEFAULT_PORT
    unit: str = DEFAULT_UNIT
    server_name: str = ""
    """The name a certificate must carry (the `server_name` param, when the brief has one)."""
    tls: bool = False
    """Whether the service answers HTTPS (its health is polled over TLS)."""

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
    server_name = params.get("server_name", "")
    if not isinstance(server_name, str):
        raise UsageError("scripted builders need text for the server_name param")
    if not re.fullmatch(r"[a-z0-9.-]{0,253}", server_name):
        raise UsageError(f"server_name {server_name!r} is not a DNS name: fix the params")
    return ServiceTarget(port=port, unit=unit, server_name=server_name)


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
        # must find the program, the unit and its enablement.
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
