"""The `opsarena/<challenge>` Inspect tasks: one per built-in challenge, scored by our referee.

Discovered from `opsarena.challenges` when Inspect loads the entry point: a challenge
named `durable-records` becomes the task `opsarena/durable_records`. Each task has one
sample and runs it in a fresh `opsarena` host made for the challenge (its setup placed
with the sample's secret seed, a power-cut disk when a milestone cuts the power); the
setup step gives the agent the brief rendered with that seed and runs the referee's
preflight; the agent works (by default Inspect's react agent with bash and a text
editor in the host); and the referee scores the host from outside, with the same seed,
once the agent has submitted. Everything per challenge comes from the challenge model
(its setup, its milestones' faults), so a new challenge needs nothing here.
"""

from __future__ import annotations

from collections.abc import Callable

from inspect_ai import Task, task
from inspect_ai.agent import react
from inspect_ai.dataset import Sample
from inspect_ai.solver import Solver
from inspect_ai.tool import bash, text_editor
from inspect_ai.util import SandboxEnvironmentSpec

from opsarena.challenges.catalog import builtin_names, find_challenge
from opsarena.integrations.inspect.sandbox import MATCH_PREFIX, OpsarenaSandboxConfig
from opsarena.integrations.inspect.scorer import brief_template, prepare, referee, sample_input

BASH_TIMEOUT_S = 180
"""Longest one bash or editor call may run before its whole process tree is killed."""

DEFAULT_MESSAGE_LIMIT = 200


def task_name(challenge: str) -> str:
    """The Inspect task name of a challenge (`durable-records` -> `durable_records`)."""
    return challenge.replace("-", "_")


def default_agent(bash_timeout: int = BASH_TIMEOUT_S) -> Solver:
    """Inspect's react agent with bash and the text editor, both in the sample's host."""
    return react(  # type: ignore[return-value]
        tools=[bash(timeout=bash_timeout), text_editor(timeout=bash_timeout)],
    )


def challenge_task(
    challenge: str,
    *,
    solver: Solver | None = None,
    message_limit: int = DEFAULT_MESSAGE_LIMIT,
    image: str | None = None,
    match_prefix: str = MATCH_PREFIX,
    settle_s: float | None = None,
) -> Task:
    """The task of `challenge` (a built-in name or a challenge file's path). `image`
    replaces the challenge's host image; `match_prefix` starts the hosts' match ids;
    `settle_s` replaces the challenge's settle window.

    The sample's `input` is the brief with its seed-derived `{{variables}}` shown as
    `<variable>` (no host, hence no seed, exists yet); the setup step replaces the
    prompt with the brief rendered with the seed the sample's host was made with."""
    loaded = find_challenge(challenge)
    config = OpsarenaSandboxConfig(challenge=challenge, image=image, match_prefix=match_prefix)
    return Task(
        dataset=[
            Sample(
                id=loaded.name,
                input=sample_input(
                    brief_template(loaded),
                    loaded.total_points,
                    loaded.settle_s if settle_s is None else settle_s,
                ),
                metadata={"challenge": loaded.name, "title": loaded.title},
            )
        ],
        setup=prepare(challenge, settle_s),
        solver=solver or default_agent(),
        scorer=referee(challenge, settle_s),
        sandbox=SandboxEnvironmentSpec("opsarena", config),
        time_limit=loaded.time_limit_s,
        message_limit=message_limit,
    )


def _register(challenge: str) -> Callable[..., Task]:
    def make(
        message_limit: int = DEFAULT_MESSAGE_LIMIT,
        image: str | None = None,
        match_prefix: str = MATCH_PREFIX,
        settle_s: float | None = None,
    ) -> Task:
        return challenge_task(
            challenge,
            message_limit=message_limit,
            image=image,
            match_prefix=match_prefix,
            settle_s=settle_s,
        )

    name = task_name(challenge)
    make.__name__ = make.__qualname__ = name
    make.__doc__ = f"The opsarena challenge {challenge!r}, scored by the opsarena referee."
    return task(name=name)(make)


TASKS: dict[str, Callable[..., Task]] = {task_name(n): _register(n) for n in builtin_names()}
"""Every built-in challenge's task factory, by task name (registered with Inspect)."""

globals().update(TASKS)
