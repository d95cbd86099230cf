"""zero-downtime-deploy's scripted builders: install a placed release, and a deploy command.

Each installs the arena's release v1 (`/opt/releases/<v1>/server.py`, named by the
brief's variables in `ctx.params`) as `builder-app.service` and writes the deploy
command `/usr/local/bin/deploy-release`, acting only through `Host`. Designed verdicts:

| builder               | v1-up         | write-read | deploy          | rollback-and-forward |
|-----------------------|---------------|------------|-----------------|----------------------|
| reference             | pass          | pass       | pass            | pass                 |
| deploy-stop-start     | pass          | pass       | requests_failed |                      |
| deploy-fresh-data     | pass          | pass       | record_missing  |                      |
| deploy-newest-only    | pass          | pass       | pass            | wrong_version        |
| deploy-v2-first       | wrong_version |            |                 |                      |
| deploy-no-command     | pass          | pass       | deploy_failed   |                      |

`reference` keeps port 8080 open across deploys with systemd socket activation: the socket unit
owns the listening socket, `systemctl restart` lets the old release finish its requests
on SIGTERM while new connections wait in the socket's queue for the new release.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

from opsarena.agents.base import AgentContext, AgentOutcome
from opsarena.agents.scripted import IdleBuilder, ScriptedBuilder
from opsarena.agents.scripted.deploy import ServiceTarget, activation_script
from opsarena.hosts import ExecResult, Host

RELEASES_DIR = "/opt/releases"
DEPLOY_COMMAND = "/usr/local/bin/deploy-release"


def current_link(target: ServiceTarget) -> str:
    """The symlink naming the running release (outside the arena's releases)."""
    return f"{target.config_dir}/current"


def data_dir(target: ServiceTarget) -> str:
    return f"{target.state_dir}/records"


def socket_unit(target: ServiceTarget) -> str:
    """A socket unit that owns port 8080 for the service (socket activation)."""
    return (
        "[Unit]\n"
        f"Description=listening socket of {target.unit}\n\n"
        "[Socket]\n"
        f"ListenStream=0.0.0.0:{target.port}\n"
        "Backlog=4096\n"
        "ReusePort=no\n\n"
        "[Install]\n"
        "WantedBy=sockets.target\n"
    )


def release_unit(target: ServiceTarget, *, socket: bool, exec_start: str) -> str:
    """The service running the release `current_link` names."""
    needs = f"Requires={target.stem}.socket\nAfter={target.stem}.socket\n" if socket else ""
    return (
        "[Unit]\n"
        "Description=records service (the release under "
        f"{current_link(target)})\n"
        f"{needs}\n"
        "[Service]\n"
        f"ExecStart={exec_start}\n"
        f"StateDirectory={target.stem}\n"
        "KillSignal=SIGTERM\n"
        "TimeoutStopSec=20\n"
        "Restart=on-failure\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def deploy_script(target: ServiceTarget, *, flaw: str | None) -> str:
    """Bash for `deploy-release VERSION`: point the link at the release atomically,
    restart (or, with the `stop-start` flaw, stop then start), and wait until /version
    answers VERSION. With `newest-only` it deploys the newest release whatever it is
    asked for."""
    link = current_link(target)
    choose = 'v="$1"\n'
    if flaw == "newest-only":
        choose = f'v="$(ls {RELEASES_DIR} | sort -V | tail -n 1)"\n'
    switch = f"systemctl restart {target.unit}\n"
    if flaw == "stop-start":
        switch = f"systemctl stop {target.unit}\nsystemctl start {target.unit}\n"
    return (
        "#!/bin/bash\n"
        "set -eu\n"
        '[ $# -eq 1 ] || { echo "usage: deploy-release VERSION" >&2; exit 2; }\n'
        f"{choose}"
        f'[ -f "{RELEASES_DIR}/$v/server.py" ] || {{ echo "no release $v" >&2; exit 2; }}\n'
        f'ln -sfn "{RELEASES_DIR}/$v" {link}.new\n'
        f"mv -T {link}.new {link}\n"
        f"{switch}"
        "for _ in $(seq 200); do\n"
        f'  [ "$(curl -s --max-time 1 http://127.0.0.1:{target.port}/version)" = "$v" ]'
        " && exit 0\n"
        "  sleep 0.1\n"
        "done\n"
        'echo "release $v did not answer /version" >&2\n'
        "exit 1\n"
    )


def run_script(target: ServiceTarget) -> str:
    """The `fresh-data` flaw's start script: a data directory per release."""
    return (
        "#!/bin/bash\n"
        f'v="$(basename "$(readlink {current_link(target)})")"\n'
        f'exec /usr/bin/python3 {current_link(target)}/server.py --data "{data_dir(target)}/$v"\n'
    )


class ReleaseBuilder(ScriptedBuilder):
    """Installs release v1 (or v2, with `install = "v2"`) and the deploy command."""

    flaw: ClassVar[str | None] = None
    socket: ClassVar[bool] = True
    install: ClassVar[str] = "v1"

    def __init__(self) -> None:
        self.params: Mapping[str, Any] = {}

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        self.params = ctx.params
        return await super().run(ctx)

    async def deploy(
        self, host: Host, target: ServiceTarget, *, wait_seconds: float
    ) -> ExecResult | None:
        version = str(self.params.get(self.install, ""))
        link = current_link(target)
        exec_start = (
            f"/usr/bin/python3 {link}/server.py --data {data_dir(target)}"
            if self.flaw != "fresh-data"
            else f"{target.config_dir}/run"
        )
        if self.flaw == "fresh-data":
            await host.write_file(
                f"{target.config_dir}/run", run_script(target).encode(), mode=0o755
            )
        if self.flaw != "no-command":
            await host.write_file(DEPLOY_COMMAND, deploy_script(target, flaw=self.flaw).encode(),
                                  mode=0o755)  # fmt: skip
        if self.socket:
            await host.write_file(
                f"/etc/systemd/system/{target.stem}.socket", socket_unit(target).encode()
            )
        await host.write_file(
            target.unit_path,
            release_unit(target, socket=self.socket, exec_start=exec_start).encode(),
        )
        # One exec (each costs a podman round trip): link v1, start the socket, then the
        # service, and wait for it to answer.
        sockets = (
            f"systemctl daemon-reload\nsystemctl enable --now {target.stem}.socket\n"
            if self.socket
            else ""
        )
        script = (
            "set -eu\n"
            f"mkdir -p {shlex.quote(target.config_dir)}\n"
            f"ln -sfn {shlex.quote(f'{RELEASES_DIR}/{version}')} {shlex.quote(link)}\n"
            f"{sockets}" + activation_script(target, enable=True, wait_seconds=wait_seconds)
        )
        return await host.exec(script, timeout=wait_seconds + 30.0)

    def describe(self, target: ServiceTarget) -> str:
        how = "socket-activated" if self.socket else "binding its own port"
        flaw = f"; flaw {self.flaw}" if self.flaw else ""
        return (
            f"{self.name}: release {self.params.get(self.install)} as {target.unit} "
            f"({how}), deploy command {DEPLOY_COMMAND}{flaw}"
        )


class ReleaseReferenceBuilder(ReleaseBuilder):
    """Socket activation and a restart: passes every milestone."""

    name = "reference"


class StopStartBuilder(ReleaseBuilder):
    """The service binds 8080 itself; the deploy stops it, then starts the new one."""

    name = "deploy-stop-start"
    socket = False
    flaw = "stop-start"


class FreshDataBuilder(ReleaseBuilder):
    """Each release gets its own data directory: the records vanish at the deploy."""

    name = "deploy-fresh-data"
    flaw = "fresh-data"


class NewestOnlyDeployBuilder(ReleaseBuilder):
    """The deploy ignores its argument and deploys the newest release: no rollback."""

    name = "deploy-newest-only"
    flaw = "newest-only"


class V2FirstBuilder(ReleaseBuilder):
    """Installs release v2 from the start."""

    name = "deploy-v2-first"
    install = "v2"


class NoCommandBuilder(ReleaseBuilder):
    """Installs release v1 well but never writes the deploy command."""

    name = "deploy-no-command"
    flaw = "no-command"


BUILDERS: tuple[type[ScriptedBuilder], ...] = (
    ReleaseReferenceBuilder,
    IdleBuilder,
    StopStartBuilder,
    FreshDataBuilder,
    NewestOnlyDeployBuilder,
    V2FirstBuilder,
    NoCommandBuilder,
)
