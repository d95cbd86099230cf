"""Every built-in challenge as an Inspect sample, on real hosts: the `opsarena` sandbox
makes the host for the challenge (its setup placed with a seed drawn for the sample, a
power-cut disk when a milestone cuts the power), the setup step gives the agent the
brief rendered with that seed, and the scorer judges with the same seed and reveals it.

Nothing here names a challenge: each test runs for every challenge in the catalog, and
what the setup should have placed is found by running the challenge's own
`place_challenge` against a recording host. One host per challenge, all made at once
and shared by the module's tests (CI time: a host costs about a second).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import pytest
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessageUser, ModelName
from inspect_ai.scorer import Score
from inspect_ai.solver import TaskState

from opsarena.challenges.catalog import builtin_names, place_challenge
from opsarena.hosts import ExecResult, Host
from opsarena.integrations.inspect.sandbox import (
    OpsarenaSandboxConfig,
    OpsarenaSandboxEnvironment,
    needs_power_cut,
)
from opsarena.integrations.inspect.scorer import prepare_sample, sample_input, score_sample
from opsarena.integrations.inspect.tasks import challenge_task
from opsarena.match.commitment import reveal_problem
from opsarena.referee.contract import brief_for
from opsarena.referee.model import Challenge
from tests.conftest import new_match_id
from tests.integrations.conftest import TEST_IMAGE, sweep

pytestmark = pytest.mark.hosts

CHALLENGES = builtin_names()


class RecordingHost:
    """Stands in for a host to see what a challenge's setup writes: files are recorded,
    commands succeed without running."""

    name = match_id = "recording"
    territory = "default"

    def __init__(self) -> None:
        self.written: dict[str, bytes] = {}

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self.written[path] = data

    async def exec(self, *args: object, **kwargs: object) -> ExecResult:
        return ExecResult(exit_code=0, stdout=b"", stderr=b"", truncated=False, duration_ms=0)


async def writes_of(challenge: Challenge, seed: bytes) -> dict[str, bytes]:
    """What `place_challenge` writes on a host with `seed`, by path."""
    recording = RecordingHost()
    await place_challenge(challenge, cast(Host, recording), seed)
    return recording.written


@pytest.fixture(scope="module")
async def sandboxes() -> AsyncIterator[dict[str, OpsarenaSandboxEnvironment]]:
    """One sandbox per built-in challenge, made as Inspect makes a sample's."""
    prefix = f"inspect-{new_match_id()}-"

    async def make(name: str) -> OpsarenaSandboxEnvironment:
        config = OpsarenaSandboxConfig(challenge=name, image=TEST_IMAGE, match_prefix=prefix)
        await OpsarenaSandboxEnvironment.task_init("test", config)
        environment = (await OpsarenaSandboxEnvironment.sample_init("test", config, {}))["default"]
        assert isinstance(environment, OpsarenaSandboxEnvironment)
        return environment

    try:
        made = await asyncio.gather(*(make(name) for name in CHALLENGES))
        yield dict(zip(CHALLENGES, made, strict=True))
    finally:
        await asyncio.shield(sweep(prefix))


def the(sandboxes: dict[str, OpsarenaSandboxEnvironment], name: str) -> Challenge:
    challenge = sandboxes[name].challenge
    assert challenge is not None and challenge.name == name
    return challenge


@pytest.mark.parametrize("name", CHALLENGES)
async def test_the_host_is_made_for_the_challenge_with_a_secret_seed(
    sandboxes: dict[str, OpsarenaSandboxEnvironment], name: str
) -> None:
    environment = sandboxes[name]
    challenge = the(sandboxes, name)
    seed = environment.seed
    assert seed is not None and seed.match_id == environment.host.match_id
    assert seed.seed.hex() not in repr(seed)
    # A disk that can lose power exactly when one of the challenge's milestones cuts the
    # power (every host has a fixed-size disk of its own).
    disk = getattr(environment.host, "disk", None)
    assert (disk is not None and disk.power) == needs_power_cut(challenge)
    # What the setup writes with this seed is on the host, byte for byte, wherever it
    # depends on the seed (the rest may be changed by the setup's own commands, as
    # incident-repair breaks its deployment after placing it).
    ours = await writes_of(challenge, seed.seed)
    other = await writes_of(challenge, bytes(b ^ 0xFF for b in seed.seed))
    seeded = {path: data for path, data in ours.items() if other.get(path) != data}
    host = environment.host
    found = await asyncio.gather(*(host.read_file(path) for path in seeded))
    wrong = [path for path, data in zip(seeded, found, strict=True) if data != seeded[path]]
    assert wrong == [], f"{name}: not as the setup writes them with the sample's seed"
    listed = await host.exec(
        ["sh", "-c", 'for p; do test -e "$p" && echo "$p"; done', "sh", *ours], timeout=30.0
    )
    present = listed.stdout.decode().split()
    assert bool(present) == bool(ours), f"{name}: nothing the setup wrote is on the host"


def fresh_state(name: str) -> TaskState:
    """The state Inspect starts the task's one sample with."""
    [sample] = cast(list[Sample], list(challenge_task(name, image=TEST_IMAGE).dataset))
    assert isinstance(sample.input, str)
    return TaskState(
        model=ModelName("mockllm/model"),
        sample_id=name,
        epoch=1,
        input=sample.input,
        messages=[ChatMessageUser(content=sample.input)],
        metadata=dict(sample.metadata or {}),
    )


Judged = tuple[TaskState, Score]


@pytest.fixture(scope="module")
async def judged(
    sandboxes: dict[str, OpsarenaSandboxEnvironment],
) -> dict[str, Judged | BaseException]:
    """Each sandbox through the task's setup step (the prompt, the commitment, the
    preflight: about 2 s) and its scorer (no settle window), all at once."""

    async def run(name: str) -> Judged:
        environment = sandboxes[name]
        challenge = the(sandboxes, name)
        state = fresh_state(name)
        await prepare_sample(challenge, environment, state)
        return state, await score_sample(challenge, environment, state, {}, settle_s=0.0)

    results = await asyncio.gather(*(run(n) for n in CHALLENGES), return_exceptions=True)
    return dict(zip(CHALLENGES, results, strict=True))


@pytest.mark.parametrize("name", CHALLENGES)
async def test_the_agent_reads_the_brief_of_the_seed_and_the_scorer_judges_with_it(
    sandboxes: dict[str, OpsarenaSandboxEnvironment],
    judged: dict[str, Judged | BaseException],
    name: str,
) -> None:
    environment = sandboxes[name]
    challenge = the(sandboxes, name)
    assert environment.seed is not None
    assert "{{" not in fresh_state(name).input_text  # the dataset's, before any seed
    result = judged[name]
    if isinstance(result, BaseException):
        raise result  # the setup step (e.g. its preflight) or the scorer failed
    state, score = result

    prompt = state.user_prompt.text
    assert "{{" not in prompt
    assert prompt == sample_input(
        brief_for(challenge, environment.seed.seed), challenge.total_points, challenge.settle_s
    )
    assert environment.seed.seed.hex() not in prompt
    assert state.metadata["seed_commitment"] == environment.seed.commitment
    assert state.metadata["match_id"] == environment.host.match_id

    assert score.metadata is not None
    assert score.metadata["seed"] == environment.seed.seed.hex()
    assert score.metadata["seed_commitment"] == state.metadata["seed_commitment"]
    published = (state.metadata["match_id"], state.metadata["seed_commitment"])
    revealed = (score.metadata["seed"], score.metadata["seed_nonce"])
    assert reveal_problem(*published, *revealed) is None
