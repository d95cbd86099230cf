"""The scripted builders: competitors whose outcome against `durable-records` is known.

Each deploys (or fails to deploy, by design) an HTTP records service on its host,
acting only through the `Host` interface, and claims success when its script ran; the
referee decides what it really earned. Designed verdicts:

| builder      | service-up            | write-read | service-restart  | host-reboot            |
|--------------|-----------------------|------------|------------------|------------------------|
| reference    | pass                  | pass       | pass             | pass                   |
| webdav       | pass                  | pass       | pass             | pass                   |
| in-memory    | pass                  | pass       | record_missing   |                        |
| volatile     | pass                  | pass       | pass             | record_missing         |
| not-enabled  | pass                  | pass       | pass             | not_ready_after_fault  |
| wrong-health | wrong_body            |            |                  |                        |
| idle         | connection_refused    |            |                  |                        |
| ignore-ids   | pass                  | wrong_record     |            |                  |
| newest-only  | pass                  | record_missing   |            |                  |
| binary-unsafe| pass                  | record_corrupted |            |                  |
| size-limited | pass                  | record_corrupted |            |                  |
| found-missing| pass                  | found_unwritten  |            |                  |
| no-overwrite | pass                  | stale_value      |            |                  |
| racy         | pass                  | wrong_record     |            |                  |
| slow-start   | pass (after 6 s)      | pass       | pass             | pass                   |

`tls-gateway` and `hardened-service` are passed by `reference` too (it reads the
challenge's name and brief variables from `params`); their flawed builders
(tls-self-signed, tls-legacy, tls-no-redirect, tls-no-hsts; hardened-root,
hardened-planted-left, hardened-stopped-only, hardened-writable, hardened-saved-root,
hardened-acl-writable) are
`reference` with one `deploy.TLS_FLAWS` / `deploy.HARDENED_FLAWS` flaw, and their
matrices are in docs/CHALLENGES.md.
`incident-repair`'s `reference` and its flawed builders (repair-wipe, repair-transient,
repair-collateral) are in `scripted/incident.py`; its `reference` runs through
`CHALLENGE_VARIANTS`.

`zero-downtime-deploy` has its own builders (`releases.py`: deploy-stop-start,
deploy-fresh-data, deploy-newest-only, deploy-v2-first, deploy-no-command); `reference`
hands over to `releases.ReleaseReferenceBuilder` there.

The flawed ones (ignore-ids ... racy) run the same durable server with one `--flaw`
(`records_server.FLAWS`); `slow-start` is `reference` whose unit sleeps 6 s before the
server starts and whose agent ends right after `systemctl enable --now`, without waiting:
only the settle window lets it reach its verdict.
"""

from __future__ import annotations

import abc
import time
from importlib import resources
from typing import ClassVar

from opsarena.agents.base import Agent, AgentContext, AgentOutcome
from opsarena.agents.scripted.deploy import (
    SANDBOX_LINES,
    SAVED_ROOT_LAUNCHER,
    ServiceTarget,
    Storage,
    activation_script,
    hardened_script,
    nginx_config,
    nginx_unit,
    records_unit,
    sandbox_script,
    service_target,
    tls_issue_script,
    tls_server_args,
)
from opsarena.hosts import ExecResult, Host

READY_WAIT_SECONDS = 20.0
"""Longest a builder waits for its unit to answer on its port."""

_SERVER_SCRIPT = "records_server.py"

CHALLENGE_VARIANTS: dict[tuple[str, str], type[ScriptedBuilder]] = {}
"""(challenge name, builder name) -> the builder that runs instead when the match's
challenge (`ctx.params["challenge"]`) is that one: `reference` is each challenge's own
reference. A challenge's builders module adds its rows."""


def _last_line(data: bytes) -> str:
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


class ScriptedBuilder(Agent, abc.ABC):
    """A builder following a fixed script. `name` is its registry name; `model` what the
    record shows for it ("scripted/NAME")."""

    name: ClassVar[str]

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        """Deploy on `ctx.host` and return "completed" (successful) once the unit
        answers HTTP on its port, or "failed" (player's fault) with the reason if it
        did not. Raises `UsageError` for bad `ctx.params`; `HostError`s propagate.
        When `CHALLENGE_VARIANTS` has a builder of this name for the match's challenge,
        that builder runs instead."""
        variant = CHALLENGE_VARIANTS.get((str(ctx.params.get("challenge", "")), self.name))
        if variant is not None and type(self) is not variant:
            return await variant().run(ctx)
        target = service_target(ctx.params)
        wait = max(1.0, min(READY_WAIT_SECONDS, ctx.deadline - time.monotonic()))
        result = await self.deploy(ctx.host, target, wait_seconds=wait)
        if result is not None and not result.ok:
            detail = f"{self.name}: deployment failed: {_last_line(result.stderr)}"
            await ctx.report("output", {"stream": "stderr", "text": detail})
            return AgentOutcome(
                terminal_state="failed",
                successful=False,
                terminal_detail=detail,
                failure_source="player",
            )
        detail = self.describe(target)
        await ctx.report("output", {"stream": "stdout", "text": detail})
        return AgentOutcome(terminal_state="completed", successful=True, terminal_detail=detail)

    @abc.abstractmethod
    async def deploy(
        self, host: Host, target: ServiceTarget, *, wait_seconds: float
    ) -> ExecResult | None:
        """Do the builder's work; return the final activation command's result (None
        when there was nothing to activate)."""

    @abc.abstractmethod
    def describe(self, target: ServiceTarget) -> str:
        """One line saying what was deployed."""


class RecordsServiceBuilder(ScriptedBuilder):
    """Deploys the shared stdlib records server (`records_server.py`) as the unit, with
    the storage, health body and enablement of the subclass."""

    storage: ClassVar[Storage] = "disk"
    health_body: ClassVar[str] = "ready"
    enable: ClassVar[bool] = True
    flaw: ClassVar[str | None] = None
    tls_flaw: ClassVar[str | None] = None
    """For `tls-gateway` (`deploy.TLS_FLAWS`); a builder with one deploys like
    `reference` elsewhere."""
    hardened_flaw: ClassVar[str | None] = None
    """For `hardened-service` (`deploy.HARDENED_FLAWS`); likewise."""
    start_delay_s: ClassVar[int] = 0
    wait: ClassVar[bool] = True
    durability: ClassVar[str] = "full"
    """The server's `--durability` mode (see `records_server.py`)."""
    restart: ClassVar[bool] = True
    """Whether the unit has `Restart=always`."""

    async def deploy(
        self, host: Host, target: ServiceTarget, *, wait_seconds: float
    ) -> ExecResult | None:
        script = resources.files("opsarena.agents.scripted").joinpath(_SERVER_SCRIPT).read_bytes()
        script_path = f"{target.program_dir}/{_SERVER_SCRIPT}"
        await host.write_file(script_path, script)
        extra: tuple[str, ...] = ()
        if target.tls:
            issued = await host.exec(
                tls_issue_script(target, self_signed=self.tls_flaw == "self-signed"),
                timeout=60.0,
            )
            if not issued.ok:
                return issued
            extra = tls_server_args(target, self.tls_flaw)
        lines, user = "", None
        launcher: tuple[str, ...] = ()
        if target.challenge == "hardened-service":
            removed = await host.exec(
                hardened_script(self.hardened_flaw) + sandbox_script(self.hardened_flaw, target),
                timeout=60.0,
            )
            if not removed.ok:
                return removed
            lines = SANDBOX_LINES  # also for `writable`: its flaw is /var/tmp alone
            user = "root" if self.hardened_flaw in ("root", "saved-root") else None
            if self.hardened_flaw == "saved-root":
                launch = f"{target.program_dir}/launch.py"
                await host.write_file(launch, SAVED_ROOT_LAUNCHER)
                launcher = ("/usr/bin/python3", launch, target.stem, target.state_dir)
        unit = records_unit(
            target,
            script_path,
            storage=self.storage,
            health_body=self.health_body,
            builder=self.name,
            flaw=self.flaw,
            start_delay_s=self.start_delay_s,
            extra_args=extra,
            service_lines=lines,
            user=user,
            durability=self.durability,
            restart=self.restart,
            launcher=launcher,
        )
        await host.write_file(target.unit_path, unit.encode())
        return await host.exec(
            activation_script(
                target, enable=self.enable, wait_seconds=wait_seconds, wait=self.wait
            ),
            timeout=wait_seconds + 30.0,
        )

    def describe(self, target: ServiceTarget) -> str:
        how = {
            "full": "fsync + atomic rename + directory fsync",
            "no-fsync": "written in place, never fsynced",
            "no-dirsync": "fsync + rename, no directory fsync",
            "ack-before-write": "acknowledged first, stored durably seconds later",
        }[self.durability]
        where = {
            "disk": f"files under {target.state_dir}/records ({how})",
            "run": f"files under {target.runtime_dir}/records",
            "memory": "process memory",
        }[self.storage]
        started = "enabled and started" if self.enable else "started (not enabled)"
        flaw = f"; flaw {self.flaw}" if self.flaw else ""
        delay = f"; the unit sleeps {self.start_delay_s} s first" if self.start_delay_s else ""
        if not self.restart:
            started += ", no Restart="
        return (
            f"{self.name}: stdlib Python records service on port {target.port}, "
            f"records in {where}, /health says {self.health_body!r}; {target.unit} {started}"
            f"{flaw}{delay}"
        )


class ReferenceBuilder(RecordsServiceBuilder):
    """Durable and enabled: passes every milestone. In zero-downtime-deploy it hands
    over to that challenge's reference (`releases.ReleaseReferenceBuilder`)."""

    name = "reference"
    model = "scripted/reference"

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        # Imported here: releases.py builds on this module.
        from opsarena.agents.scripted import releases

        if ctx.params.get("challenge") == releases.CHALLENGE and type(self) is ReferenceBuilder:
            return await releases.ReleaseReferenceBuilder().run(ctx)
        return await super().run(ctx)


class InMemoryBuilder(RecordsServiceBuilder):
    """Records in a dict: lost at the first service restart."""

    name = "in-memory"
    model = "scripted/in-memory"
    storage = "memory"


class VolatileBuilder(RecordsServiceBuilder):
    """Records under /run: kept across a restart, lost at a reboot."""

    name = "volatile"
    model = "scripted/volatile"
    storage = "run"


class NotEnabledBuilder(RecordsServiceBuilder):
    """Durable but never enabled: nothing listens after a reboot."""

    name = "not-enabled"
    model = "scripted/not-enabled"
    enable = False


class WrongHealthBuilder(RecordsServiceBuilder):
    """/health answers "ok" instead of "ready"."""

    name = "wrong-health"
    model = "scripted/wrong-health"
    health_body = "ok"


class IgnoreIdsBuilder(RecordsServiceBuilder):
    """Answers every GET with the last body PUT, whatever the id."""

    name = "ignore-ids"
    model = "scripted/ignore-ids"
    flaw = "ignore-ids"


class NewestOnlyBuilder(RecordsServiceBuilder):
    """Keeps only the most recent record."""

    name = "newest-only"
    model = "scripted/newest-only"
    flaw = "newest-only"


class BinaryUnsafeBuilder(RecordsServiceBuilder):
    """Decodes bodies as UTF-8 text: binary values come back changed."""

    name = "binary-unsafe"
    model = "scripted/binary-unsafe"
    flaw = "utf8"


class SizeLimitedBuilder(RecordsServiceBuilder):
    """Cuts bodies at 64 KiB."""

    name = "size-limited"
    model = "scripted/size-limited"
    flaw = "size-limit"


class FoundForMissingBuilder(RecordsServiceBuilder):
    """Answers 200 (empty body) for ids never written."""

    name = "found-for-missing"
    model = "scripted/found-for-missing"
    flaw = "found-for-missing"


class NoOverwriteBuilder(RecordsServiceBuilder):
    """Ignores a PUT to an id that exists (first write wins)."""

    name = "no-overwrite"
    model = "scripted/no-overwrite"
    flaw = "no-overwrite"


class RacyBuilder(RecordsServiceBuilder):
    """Not safe under concurrent writes: parallel PUTs store each other's bodies."""

    name = "racy"
    model = "scripted/racy"
    flaw = "racy"


class SlowStartBuilder(RecordsServiceBuilder):
    """Correct, but its unit sleeps 6 s before the server starts, and the agent ends
    right after `systemctl enable --now` without waiting for it."""

    name = "slow-start"
    model = "scripted/slow-start"
    start_delay_s = 6
    wait = False


class WebdavBuilder(ScriptedBuilder):
    """The image's nginx-light with its DAV module as the records service; no Python of
    ours serves requests. Passes every milestone."""

    name = "webdav"
    model = "scripted/webdav"

    async def deploy(
        self, host: Host, target: ServiceTarget, *, wait_seconds: float
    ) -> ExecResult | None:
        config_path = f"{target.config_dir}/nginx.conf"
        await host.write_file(config_path, nginx_config(target).encode())
        await host.write_file(target.unit_path, nginx_unit(target, config_path).encode())
        return await host.exec(
            activation_script(target, enable=True, wait_seconds=wait_seconds),
            timeout=wait_seconds + 30.0,
        )

    def describe(self, target: ServiceTarget) -> str:
        return (
            f"webdav: nginx DAV records service on port {target.port}, records under "
            f"{target.state_dir}/records; {target.unit} enabled and started"
        )


class IdleBuilder(ScriptedBuilder):
    """Does nothing at all: nothing ever listens."""

    name = "idle"
    model = "scripted/idle"

    async def deploy(
        self, host: Host, target: ServiceTarget, *, wait_seconds: float
    ) -> ExecResult | None:
        return None

    def describe(self, target: ServiceTarget) -> str:
        return "idle: did nothing, by design"


class TlsSelfSignedBuilder(ReferenceBuilder):
    """`tls-gateway`: a self-signed certificate (fails `tls-up`: certificate_untrusted)."""

    name = "tls-self-signed"
    model = "scripted/tls-self-signed"
    tls_flaw = "self-signed"


class TlsLegacyBuilder(ReferenceBuilder):
    """`tls-gateway`: accepts TLS 1.0 (fails `modern-tls`: old_tls_accepted)."""

    name = "tls-legacy"
    model = "scripted/tls-legacy"
    tls_flaw = "legacy"


class TlsNoRedirectBuilder(ReferenceBuilder):
    """`tls-gateway`: serves the API on plain 80 (fails `http-redirect`: no_redirect)."""

    name = "tls-no-redirect"
    model = "scripted/tls-no-redirect"
    tls_flaw = "no-redirect"


class TlsNoHstsBuilder(ReferenceBuilder):
    """`tls-gateway`: no Strict-Transport-Security header (fails `hsts`: hsts_missing)."""

    name = "tls-no-hsts"
    model = "scripted/tls-no-hsts"
    tls_flaw = "no-hsts"


class HardenedRootBuilder(ReferenceBuilder):
    """`hardened-service`: the service runs as root (fails `service-user`)."""

    name = "hardened-root"
    model = "scripted/hardened-root"
    hardened_flaw = "root"


class HardenedPlantedLeftBuilder(ReferenceBuilder):
    """`hardened-service`: leaves the planted listener (fails `only-listener`)."""

    name = "hardened-planted-left"
    model = "scripted/hardened-planted-left"
    hardened_flaw = "planted-left"


class HardenedStoppedOnlyBuilder(ReferenceBuilder):
    """`hardened-service`: stops the planted listener but leaves it enabled (fails
    `host-reboot`: it is back after the reboot)."""

    name = "hardened-stopped-only"
    model = "scripted/hardened-stopped-only"
    hardened_flaw = "stopped-only"


class HardenedWritableBuilder(ReferenceBuilder):
    """`hardened-service`: no write sandbox (fails `write-sandbox`)."""

    name = "hardened-writable"
    model = "scripted/hardened-writable"
    hardened_flaw = "writable"


class HardenedAclWritableBuilder(ReferenceBuilder):
    """`hardened-service`: its program directory looks root's (0755) but a POSIX ACL entry
    lets the service's user write there (fails `write-sandbox`)."""

    name = "hardened-acl-writable"
    model = "scripted/hardened-acl-writable"
    hardened_flaw = "acl-writable"


class HardenedSavedRootBuilder(ReferenceBuilder):
    """`hardened-service`: starts the server as root and drops to its user keeping root as
    the saved uid and gid (and the permitted capabilities): its effective uid is the
    user's, but it can become root again (fails `service-user`)."""

    name = "hardened-saved-root"
    model = "scripted/hardened-saved-root"
    hardened_flaw = "saved-root"
