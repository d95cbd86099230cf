"""The scripted builders' machinery: competitors whose outcome is known.

Each builder deploys (or fails to deploy, by design) something on its host, acting only
through the `Host` interface, and claims success when its script ran; the referee
decides what it really earned. The builders themselves live with the challenge they
calibrate (`<challenge>/builders.py`, its `reference` oracle and its flawed builders);
this module holds what several challenges share: the `ScriptedBuilder` base, the
`RecordsServiceBuilder` deploying the records workload's server
(`opsarena/workloads/records/server.py`) with hooks a challenge overrides, and `idle`.
`DEFAULT_BUILDERS` play a challenge that has no builders of its own (a lone TOML file).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Mapping
from importlib import resources
from typing import Any, ClassVar

from opsarena.agents.base import Agent, AgentContext, AgentOutcome
from opsarena.agents.scripted.deploy import (
    ServiceTarget,
    Storage,
    activation_script,
    records_unit,
    service_target,
)
from opsarena.hosts import ExecResult, Host

READY_WAIT_SECONDS = 20.0
"""Longest a builder waits for its unit to answer on its port."""

SERVER_SCRIPT = "records_server.py"
"""The records server's file name on a host (under the target's program directory)."""


def records_server_source() -> bytes:
    """The records workload's server, the stdlib-only script builders copy into a host."""
    return resources.files("opsarena.workloads.records").joinpath("server.py").read_bytes()


def _last_line(data: bytes) -> str:
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


async def player_failed(ctx: AgentContext, detail: str) -> AgentOutcome:
    """Report `detail` on stderr and end "failed", the player's fault."""
    await ctx.report("output", {"stream": "stderr", "text": detail})
    return AgentOutcome(
        terminal_state="failed", successful=False, terminal_detail=detail, failure_source="player"
    )


class ScriptedBuilder(Agent, abc.ABC):
    """A builder following a fixed script. `name` is its name among its challenge's
    builders (`scripted:NAME`); `model` what the record shows for it ("scripted/NAME",
    set from `name` unless the class gives one)."""

    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__ and "model" not in cls.__dict__:
            cls.model = f"scripted/{cls.name}"

    def target(self, params: Mapping[str, Any]) -> ServiceTarget:
        """Where the service goes, from the challenge's `params`. Raises `UsageError`."""
        return service_target(params)

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        """Deploy on `ctx.host` and return "completed" (successful) once the unit
        answers HTTP on its port, or "failed" (player's fault) with the reason if it
        did not. Raises `UsageError` for bad `ctx.params`; `HostError`s propagate."""
        target = self.target(ctx.params)
        wait = max(1.0, min(READY_WAIT_SECONDS, ctx.deadline - time.monotonic()))
        result = await self.deploy(ctx.host, target, wait_seconds=wait)
        if result is not None and not result.ok:
            return await player_failed(
                ctx, f"{self.name}: deployment failed: {_last_line(result.stderr)}"
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
    """Deploys the records workload's server as the unit, with the storage, health body
    and enablement of the subclass. A challenge changes what surrounds it through
    `prepare` (commands run before the unit is written) and `unit_options`."""

    storage: ClassVar[Storage] = "disk"
    health_body: ClassVar[str] = "ready"
    enable: ClassVar[bool] = True
    flaw: ClassVar[str | None] = None
    """The server's `--flaw` (`FLAWS` in the records server)."""
    start_delay_s: ClassVar[int] = 0
    wait: ClassVar[bool] = True
    durability: ClassVar[str] = "full"
    """The server's `--durability` mode (see the records server)."""
    restart: ClassVar[bool] = True
    """Whether the unit has `Restart=always`."""

    async def prepare(self, host: Host, target: ServiceTarget) -> ExecResult | None:
        """What runs before the unit is written (a failed result stops the deploy)."""
        return None

    def unit_options(self, target: ServiceTarget) -> dict[str, Any]:
        """Extra keyword arguments of `records_unit` (`extra_args`, `service_lines`,
        `user`, `launcher`)."""
        return {}

    async def deploy(
        self, host: Host, target: ServiceTarget, *, wait_seconds: float
    ) -> ExecResult | None:
        script_path = f"{target.program_dir}/{SERVER_SCRIPT}"
        await host.write_file(script_path, records_server_source())
        prepared = await self.prepare(host, target)
        if prepared is not None and not prepared.ok:
            return prepared
        unit = records_unit(
            target,
            script_path,
            storage=self.storage,
            health_body=self.health_body,
            builder=self.name,
            flaw=self.flaw,
            start_delay_s=self.start_delay_s,
            durability=self.durability,
            restart=self.restart,
            **self.unit_options(target),
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


class RecordsReferenceBuilder(RecordsServiceBuilder):
    """The records server, durable and enabled: the records contract's oracle."""

    name = "reference"


class IdleBuilder(ScriptedBuilder):
    """Does nothing at all: nothing ever listens."""

    name = "idle"

    async def deploy(
        self, host: Host, target: ServiceTarget, *, wait_seconds: float
    ) -> ExecResult | None:
        return None

    def describe(self, target: ServiceTarget) -> str:
        return "idle: did nothing, by design"


DEFAULT_BUILDERS: tuple[type[ScriptedBuilder], ...] = (RecordsReferenceBuilder, IdleBuilder)
"""The builders of a challenge without a `builders.py` (a lone TOML file)."""
