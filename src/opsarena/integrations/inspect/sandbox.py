"""The `opsarena` Inspect sandbox provider: Inspect's `SandboxEnvironment` on our `Host`.

Each sample gets one fresh host from a `HostDriver` (podman by default), labelled with
a match id starting `inspect-`, and removed at sample cleanup; task cleanup and
`inspect sandbox cleanup opsarena` sweep whatever a crash left. With a `challenge` in
the config the host is made for it, as a match makes a territory's: a power-cut disk
when a milestone cuts the power, and a secret seed drawn for the sample (`SampleSeed`)
with which the challenge's setup is placed on the host before anything else runs
there; the seed stays in this process (the brief and the referee use it), only its
commitment is published until the score reveals it. Every request runs
inside the host through `Host.exec`, as confined as the competitor; the arena never
runs a program from the host's filesystem itself. What `Host` lacks (cwd, env,
switching user, killing a whole process tree) is composed in the host by
`commands.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, overload

from inspect_ai.util import ExecResult as InspectExecResult
from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    sandboxenv,
)
from inspect_ai.util._sandbox.environment import SandboxUnavailableError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from opsarena.challenges.catalog import find_challenge, place_challenge
from opsarena.errors import (
    HostError,
    HostNotFoundError,
    HostUnavailableError,
    OpsArenaError,
    ShellUnsupportedError,
)
from opsarena.hosts import (
    DEFAULT_DRIVER,
    DEFAULT_IMAGE,
    ExecResult,
    Host,
    HostDriver,
    HostSpec,
    get_driver,
)
from opsarena.hosts.image import image_for
from opsarena.integrations.inspect import commands
from opsarena.match.commitment import new_nonce, seed_commitment
from opsarena.referee.model import Challenge
from opsarena.referee.nemesis import missing_faults, needs_power_cut_disk

log = logging.getLogger(__name__)

MATCH_PREFIX = "inspect-"
"""Every host this provider makes has a match id starting with this."""

FILE_TIMEOUT_S = 600.0
KILL_TIMEOUT_S = 30.0
SEED_BYTES = 32
_FILE_HEADER_BYTES = 64


@dataclass(frozen=True)
class SampleSeed:
    """The secret seed of one sample's host, drawn when the host is made.

    It renders the brief the agent reads, places the challenge's setup, and keys the
    referee's preflight and its judgement, as a match's seed does. It never enters the
    host; `commitment` (the match commit-reveal, `opsarena.match.commitment`, with the
    host's match id) may be published before the score reveals `seed` and `nonce`.
    """

    match_id: str
    seed: bytes = field(repr=False)
    nonce: bytes = field(repr=False)

    @classmethod
    def draw(cls, match_id: str) -> SampleSeed:
        return cls(match_id, secrets.token_bytes(SEED_BYTES), new_nonce())

    @property
    def commitment(self) -> str:
        return seed_commitment(self.match_id, self.nonce, self.seed)


class OpsarenaSandboxConfig(BaseModel):
    """How the `opsarena` sandbox makes its hosts.

    `challenge` (a built-in name or a path) makes each host for that challenge: its
    image (unless `image` is given too), a power-cut disk when its milestones cut the
    power, and its setup placed with the sample's seed. `exec_timeout_s` bounds a
    command run without a timeout (Inspect allows none; every `Host` call has one).
    `match_prefix` starts the match id of every host (it must start with `inspect-`,
    which cleanup sweeps).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    challenge: str | None = None
    image: str | None = None
    driver: str = DEFAULT_DRIVER
    cpus: float = Field(default=1.0, gt=0)
    memory_mb: int = Field(default=512, ge=64)
    pids_limit: int = Field(default=1024, ge=16)
    workdir: str = "/root"
    exec_timeout_s: float = Field(default=3600.0, gt=0)
    boot_timeout_s: float = Field(default=60.0, gt=0)
    match_prefix: str = MATCH_PREFIX

    @field_validator("workdir")
    @classmethod
    def _workdir_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must be an absolute path")
        return value

    def load_challenge(self) -> Challenge | None:
        """The challenge the hosts are made for, if any. Raises `ChallengeError`."""
        return None if self.challenge is None else find_challenge(self.challenge)

    def host_image(self) -> str:
        """The image: `image`, else the challenge's (with the packages it adds), else
        the default host image."""
        if self.image is not None:
            return self.image
        challenge = self.load_challenge()
        if challenge is not None:
            return image_for(challenge.packages, challenge.image)
        return DEFAULT_IMAGE


def needs_power_cut(challenge: Challenge | None) -> bool:
    """Whether hosts made for `challenge` need a disk that can lose power: a fault one of
    its milestones injects says so (`nemesis.needs_power_cut_disk`, as the match
    controller decides). Pure."""
    return challenge is not None and needs_power_cut_disk(challenge)


def load_config(config: SandboxEnvironmentConfigType | None) -> OpsarenaSandboxConfig:
    """The provider's config from what Inspect hands over: None (defaults), our model,
    or a path to a TOML file of its fields. Raises `OpsArenaError` naming what is wrong."""
    if config is None:
        return OpsarenaSandboxConfig()
    if isinstance(config, OpsarenaSandboxConfig):
        return config
    try:
        if isinstance(config, str):
            try:
                data = tomllib.loads(Path(config).read_text())
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise OpsArenaError(f"cannot read opsarena sandbox config {config}: {exc}") from exc
            return OpsarenaSandboxConfig.model_validate(data)
        return OpsarenaSandboxConfig.model_validate(config.model_dump())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "config"
        raise OpsArenaError(f"opsarena sandbox config: {where}: {first['msg']}") from None


def _driver(config: OpsarenaSandboxConfig) -> HostDriver:
    return get_driver(config.driver)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


@sandboxenv(name="opsarena")
class OpsarenaSandboxEnvironment(SandboxEnvironment):
    """One opsarena host as an Inspect sandbox. The default user is root (as the
    competitor is in its host); the working directory is `config.workdir`."""

    _hosts: ClassVar[dict[str, set[str]]] = {}
    """Names of the hosts made per task in this process, for task cleanup."""

    def __init__(
        self,
        host: Host,
        driver: HostDriver,
        config: OpsarenaSandboxConfig,
        *,
        challenge: Challenge | None = None,
        seed: SampleSeed | None = None,
    ) -> None:
        super().__init__()
        self.host = host
        self.driver = driver
        self.config = config
        self.challenge = challenge
        """The challenge this host was made for (`config.challenge`, loaded), if any."""
        self.seed = seed
        """The sample's secret seed, with which `challenge`'s setup was placed."""

    # ---- lifecycle ---------------------------------------------------------------------

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return OpsarenaSandboxConfig.model_validate(config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        # A host is a whole systemd machine; more at once than cores only queues them.
        return max(1, os.cpu_count() or 1)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        settings = load_config(config)
        if not settings.match_prefix.startswith(MATCH_PREFIX):
            raise OpsArenaError(
                f"opsarena sandbox config: match_prefix must start with {MATCH_PREFIX!r}"
            )
        # A missing challenge, or one needing faults the driver lacks, fails here,
        # before any sample.
        challenge = settings.load_challenge()
        driver = _driver(settings)
        if challenge is not None:
            lacking = missing_faults(challenge, driver.faults, driver.name)
            if lacking is not None:
                raise OpsArenaError(f"opsarena sandbox: {lacking}")
            if challenge.packages and settings.image is None:
                await driver.prepare_image(settings.host_image(), tuple(challenge.packages))
        cls._hosts.setdefault(task_name, set())

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        settings = load_config(config)
        driver = _driver(settings)
        challenge = settings.load_challenge()
        spec = HostSpec(
            match_id=f"{settings.match_prefix}{secrets.token_hex(4)}",
            territory="default",
            image=settings.host_image(),
            cpus=settings.cpus,
            memory_mb=settings.memory_mb,
            pids_limit=settings.pids_limit,
            # Only a challenge that cuts the power pays for a disk that can lose it.
            power_cut=needs_power_cut(challenge),
        )
        host = await driver.create(spec, boot_timeout=settings.boot_timeout_s)
        cls._hosts.setdefault(task_name, set()).add(host.name)
        seed = SampleSeed.draw(spec.match_id) if challenge is not None else None
        environment = cls(host, driver, settings, challenge=challenge, seed=seed)
        try:
            mkdir = await environment._run(
                [
                    commands.ENV,
                    f"PATH={commands.SYSTEM_PATH}",
                    "mkdir",
                    "-p",
                    "--",
                    settings.workdir,
                ]
            )
            if not mkdir.ok:
                raise OpsArenaError(f"cannot create {settings.workdir} in {host.name}")
            if challenge is not None and seed is not None:
                try:
                    await place_challenge(challenge, host, seed.seed)
                except OpsArenaError as exc:
                    raise OpsArenaError(
                        f"the challenge {challenge.name} could not be placed on {host.name}: {exc}"
                    ) from exc
        except BaseException:
            await cls._remove(driver, host.name)
            cls._hosts[task_name].discard(host.name)
            raise
        return {"default": environment}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            if isinstance(environment, OpsarenaSandboxEnvironment):
                await cls._remove(environment.driver, environment.host.name)
                cls._hosts.get(task_name, set()).discard(environment.host.name)

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        names = cls._hosts.pop(task_name, set())
        if cleanup and names:
            driver = _driver(load_config(config))
            await asyncio.gather(*(cls._remove(driver, name) for name in names))

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """`inspect sandbox cleanup opsarena [ID]`: remove every host this provider made
        (or the one named ID, or those of match ID), on the default driver."""
        driver = get_driver(DEFAULT_DRIVER)
        infos = [i for i in await driver.list() if i.match_id.startswith(MATCH_PREFIX)]
        if id is not None:
            infos = [i for i in infos if id in (i.name, i.match_id)]
        await asyncio.gather(*(cls._remove(driver, info.name) for info in infos))
        for info in infos:
            print(f"removed {info.name}")

    @staticmethod
    async def _remove(driver: HostDriver, name: str) -> None:
        with contextlib.suppress(HostNotFoundError):
            try:
                await asyncio.shield(driver.remove(name))
            except HostError as exc:
                log.warning("could not remove host %s: %s", name, exc)

    # ---- exec --------------------------------------------------------------------------

    async def _run(
        self,
        argv: list[str],
        *,
        timeout: float = FILE_TIMEOUT_S,
        input: bytes | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        """`Host.exec` as root, with the host's unavailability as Inspect names it."""
        try:
            if output_limit is None:
                return await self.host.exec(argv, timeout=timeout, input=input)
            return await self.host.exec(
                argv, timeout=timeout, input=input, output_limit=output_limit
            )
        except HostUnavailableError as exc:
            raise SandboxUnavailableError(str(exc)) from exc

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> InspectExecResult[str]:
        # timeout_retry: a command that ran past its time is never run again here, since
        # it may have had effects; Host.exec has no transport hang to retry.
        scope = commands.scope_unit(secrets.token_hex(8))
        argv = commands.exec_argv(
            cmd, workdir=self.config.workdir, scope=scope, cwd=cwd, env=env, user=user
        )
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        data = input.encode("utf-8") if isinstance(input, str) else input
        bound = float(timeout) if timeout is not None else self.config.exec_timeout_s
        result = await self._run(argv, timeout=bound, input=data, output_limit=limit)
        if result.timed_out:
            # The process group is gone; whatever left it (setsid, daemons) is still in
            # the scope. Kill the rest of the tree before saying so.
            with contextlib.suppress(SandboxUnavailableError):
                await self._run(commands.kill_scope_argv(scope), timeout=KILL_TIMEOUT_S)
            error = TimeoutError(f"Command timed out after {timeout} seconds")
            partial = _decode(result.stdout) + _decode(result.stderr)
            if partial:
                error.truncated_output = partial  # type: ignore[attr-defined]
            raise error
        stdout, stderr = _decode(result.stdout), _decode(result.stderr)
        if result.truncated:
            raise OutputLimitExceededError(
                SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, stdout + stderr
            )
        if commands.is_scope_refused(result.exit_code, stdout, stderr):
            raise SandboxUnavailableError(
                f"host {self.host.name} could not start the command: {stderr.strip()}"
            )
        if commands.is_exec_permission_error(cmd, result.exit_code, stderr):
            raise PermissionError(f"Permission denied executing {cmd[0]}: {stderr.strip()}")
        return InspectExecResult(
            success=result.exit_code == 0,
            returncode=result.exit_code,
            stdout=stdout,
            stderr=stderr,
        )

    # ---- files -------------------------------------------------------------------------

    def _path(self, file: str) -> str:
        return commands.resolve_path(self.config.workdir, file)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        argv = [commands.SHELL, "-c", commands.WRITE_SCRIPT, "write_file", self._path(file)]
        result = await self._run(argv, input=data)
        if result.timed_out:
            raise TimeoutError(f"write_file {file} timed out after {FILE_TIMEOUT_S:g}s")
        if result.exit_code != 0:
            raise commands.file_failure(result.exit_code, _decode(result.stderr)).error(file)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        argv = [
            commands.SHELL, "-c", commands.READ_SCRIPT, "read_file", self._path(file), str(limit)
        ]  # fmt: skip
        result = await self._run(argv, output_limit=limit + _FILE_HEADER_BYTES)
        if result.timed_out:
            raise TimeoutError(f"read_file {file} timed out after {FILE_TIMEOUT_S:g}s")
        if result.exit_code == commands.FILE_TOO_LARGE:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        if result.exit_code != 0:
            raise commands.file_failure(result.exit_code, _decode(result.stderr)).error(file)
        try:
            _size, data = commands.split_read_output(result.stdout)
        except ValueError as exc:
            # The file changed while it was read (or grew past the limit): say so.
            raise OSError(f"read_file {file}: {exc}") from exc
        return data.decode("utf-8") if text else data

    # ---- connection --------------------------------------------------------------------

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        try:
            await self.host.wait_ready(5.0)
        except HostError as exc:
            raise ConnectionError(f"host {self.host.name} is not running: {exc}") from exc
        try:  # the command below asks the driver for this very shell
            self.host.shell_argv(user=user)
        except ShellUnsupportedError as exc:
            raise NotImplementedError(str(exc)) from exc
        except HostError as exc:
            raise ValueError(str(exc)) from exc
        return SandboxConnection(
            type="opsarena",
            command=commands.connection_command(self.host.name, self.driver.name, user),
            container=self.host.name,
        )
