"""The pure parts of the Inspect integration: argv building, result and file decisions,
the score of a judgement. No hosts."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from inspect_ai.model import ModelUsage

from opsarena.challenges.catalog import builtin_names
from opsarena.errors import OpsArenaError
from opsarena.hosts import DEFAULT_DRIVER
from opsarena.integrations.inspect import commands
from opsarena.integrations.inspect.sandbox import OpsarenaSandboxConfig, load_config
from opsarena.integrations.inspect.scorer import (
    Judgement,
    MilestoneOutcome,
    explanation_of,
    score_of,
    usage_summary,
)


def test_exec_argv_runs_wrappers_by_absolute_path_and_env_before_the_command() -> None:
    argv = commands.exec_argv(
        ["ls", "-l"], workdir="/root", scope="s.scope", cwd="sub", env={"A": "1 2"}, user="bob"
    )
    assert argv == [
        "/usr/bin/env", "-C", "/root/sub",
        "/usr/bin/systemd-run", "--scope", "--quiet", "--collect", "--unit=s.scope",
        "/usr/sbin/runuser", "-u", "bob", "--",
        "/usr/bin/env", "--", "A=1 2", "ls", "-l",
    ]  # fmt: skip


def test_exec_argv_as_root_switches_no_user_and_keeps_absolute_cwd() -> None:
    for user in (None, "root", "0"):
        argv = commands.exec_argv(["true"], workdir="/root", scope="s", cwd="/tmp", user=user)
        assert commands.RUNUSER not in argv
        assert argv[:3] == ["/usr/bin/env", "-C", "/tmp"]
        assert argv[-2:] == ["--", "true"]


def test_a_numeric_user_is_looked_up_in_the_host_then_switched_to_by_name() -> None:
    argv = commands.exec_argv(["id"], workdir="/root", scope="s", user="65534")
    switch = argv[argv.index("--unit=s") + 1 :]
    assert switch[:4] == [commands.SHELL, "-c", commands.NUMERIC_USER_SCRIPT, "65534"]
    assert switch[4:] == ["/usr/bin/env", "--", "id"]


@pytest.mark.parametrize(
    ("cmd", "env", "message"),
    [
        ([], None, "needs a command"),
        (["A=1"], None, "contains '='"),
        (["true"], {"A=B": "x"}, "not a valid environment variable name"),
        (["true"], {"": "x"}, "not a valid environment variable name"),
    ],
)
def test_exec_argv_refuses_what_env_would_misread(
    cmd: list[str], env: dict[str, str] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        commands.exec_argv(cmd, workdir="/root", scope="s", env=env)


def test_resolve_path() -> None:
    assert commands.resolve_path("/root", "a/../b.txt") == "/root/b.txt"
    assert commands.resolve_path("/root", "/etc/x") == "/etc/x"
    assert commands.resolve_path("/root", "") == "/root"


def test_permission_error_is_env_refusing_the_named_file_only() -> None:
    line = "/usr/bin/env: \u2018/etc/passwd\u2019: Permission denied\n"
    assert commands.is_exec_permission_error(["/etc/passwd"], 126, line)
    assert commands.is_exec_permission_error(["x"], 126, "/usr/bin/env: 'x': Permission denied")
    assert not commands.is_exec_permission_error(["/etc/passwd"], 1, line)
    assert not commands.is_exec_permission_error(["other"], 126, line)
    # The command's own output saying so, among other lines, is the command's result.
    assert not commands.is_exec_permission_error(["/etc/passwd"], 126, "hello\n" + line)


def test_a_refused_scope_means_the_command_never_ran() -> None:
    refused = (
        "Failed to start transient scope unit: Transaction for inspect-exec-1.scope/start is "
        "destructive (shutdown.target has 'start' job queued, but 'stop' is included).\n\n"
    )
    assert commands.is_scope_refused(1, "", refused)
    assert not commands.is_scope_refused(0, "", refused)
    assert not commands.is_scope_refused(1, "output of the command", refused)
    assert not commands.is_scope_refused(1, "", "the command's own error\n" + refused)


def test_file_failures_map_to_the_errors_the_contract_names() -> None:
    cases = {2: FileNotFoundError, 13: PermissionError, 21: IsADirectoryError}
    for code, kind in cases.items():
        error = commands.file_failure(code, "").error("some file")
        assert type(error) is kind
        assert "some file" in str(error)
    other = commands.file_failure(1, "cat: write error: No space left on device\n")
    assert other.kind is OSError and other.code == errno.EIO
    assert "No space left on device" in other.message


def test_split_read_output() -> None:
    assert commands.split_read_output(b"-rw-r--r-- 3\nabc") == (3, b"abc")
    assert commands.split_read_output(b"-rw-r--r-- 0\n") == (0, b"")
    with pytest.raises(ValueError, match="read 2 bytes of a 3 byte file"):
        commands.split_read_output(b"-rw-r--r-- 3\nab")
    with pytest.raises(ValueError, match="unexpected"):
        commands.split_read_output(b"garbage")


def test_connection_command() -> None:
    assert commands.connection_command("h", DEFAULT_DRIVER, None) == "opsarena hosts shell h"
    assert commands.connection_command("h", DEFAULT_DRIVER, "root") == "opsarena hosts shell h"
    assert commands.connection_command("h", DEFAULT_DRIVER, "bob") == (
        "opsarena hosts shell h --user bob"
    )
    assert commands.connection_command("h", "other", "bob") == (
        "opsarena hosts shell h --user bob --driver other"
    )


def test_load_config(tmp_path: Path) -> None:
    assert load_config(None) == OpsarenaSandboxConfig()
    path = tmp_path / "sandbox.toml"
    path.write_text('challenge = "durable-records"\nmemory_mb = 256\n')
    config = load_config(str(path))
    assert (config.challenge, config.memory_mb) == ("durable-records", 256)
    assert config.host_image() == "localhost/opsarena-host:bookworm"
    path.write_text("memory_mb = 1\n")
    with pytest.raises(OpsArenaError, match="memory_mb"):
        load_config(str(path))
    path.write_text("workdir = 'root'\n")
    with pytest.raises(OpsArenaError, match="workdir: Value error, must be an absolute path"):
        load_config(str(path))
    path.write_text("colour = 'red'\n")
    with pytest.raises(OpsArenaError, match="colour"):
        load_config(str(path))
    with pytest.raises(OpsArenaError, match="cannot read"):
        load_config(str(tmp_path / "missing.toml"))


def _judgement(passed: int, reason: str | None) -> Judgement:
    ids = [("service-up", 10), ("write-read", 20), ("service-restart", 30), ("host-reboot", 40)]
    milestones = []
    for index, (mid, points) in enumerate(ids):
        if index < passed:
            milestones.append(MilestoneOutcome(mid, mid, points, points, True, 1, "passed"))
        elif index == passed and reason is not None:
            milestones.append(
                MilestoneOutcome(
                    mid, mid, 0, points, False, 1, "failed", reason, "verification_failed",
                    f"{reason} detail",
                )
            )  # fmt: skip
        else:
            milestones.append(MilestoneOutcome(mid, mid, 0, points, False, 0, None))
    total = sum(m.points for m in milestones)
    return Judgement("durable-records", total, 100, passed == 4, milestones, 0, "00")


def test_score_of_a_durable_host_is_one() -> None:
    score = score_of(_judgement(4, None), {}, "done")
    assert score.value == 1.0
    assert score.metadata is not None and score.metadata["failure_reasons"] == []
    assert score.explanation is not None
    assert score.explanation.startswith("100/100 points (durable)")


def test_score_of_a_service_losing_records_on_restart() -> None:
    score = score_of(_judgement(2, "record_missing"), {}, None)
    assert score.value == pytest.approx(0.3)
    assert score.metadata is not None
    assert score.metadata["failures"] == [
        {"milestone": "service-restart", "reason": "record_missing",
         "detail": "record_missing detail"}
    ]  # fmt: skip
    explanation = explanation_of(_judgement(2, "record_missing"))
    assert "- service-restart: failed (record_missing) after 1 attempt(s)" in explanation
    assert "- host-reboot: not attempted" in explanation


def test_usage_summary_prices_only_when_every_model_has_a_price() -> None:
    priced = {"a": ModelUsage(input_tokens=5, output_tokens=5, total_tokens=10, total_cost=0.25)}
    assert usage_summary(priced)["cost_micro_usd"] == 250_000
    unpriced = {**priced, "b": ModelUsage(total_tokens=3)}
    summary = usage_summary(unpriced)
    assert summary["cost_micro_usd"] is None
    assert summary["total_tokens"] == 13


def test_one_task_per_builtin_challenge_found_through_the_entry_point() -> None:
    from importlib.metadata import entry_points

    from inspect_ai._util.registry import registry_lookup

    from opsarena.challenges.catalog import builtin_names
    from opsarena.integrations.inspect.tasks import TASKS

    [entry] = [e for e in entry_points(group="inspect_ai") if e.name == "opsarena"]
    assert entry.value == "opsarena.integrations.inspect._registry"
    assert sorted(TASKS) == sorted(n.replace("-", "_") for n in builtin_names())
    for name in TASKS:
        assert registry_lookup("task", f"opsarena/{name}") is not None
    assert registry_lookup("sandboxenv", "opsarena/opsarena") is not None


def test_the_sample_input_is_the_brief_and_when_it_is_judged() -> None:
    from opsarena.challenges.catalog import builtin_challenge
    from opsarena.integrations.inspect.scorer import sample_input
    from opsarena.integrations.inspect.tasks import challenge_task

    challenge = builtin_challenge("durable-records")
    text = sample_input(challenge.brief, challenge.total_points, challenge.settle_s)
    assert text.startswith(challenge.brief.strip())
    assert "after you call submit()" in text and "out of 100" in text
    assert f"up to {challenge.settle_s:g} s" in text
    task = challenge_task("durable-records")
    assert [s.input for s in task.dataset] == [text]


@pytest.mark.parametrize("name", builtin_names())
def test_no_dataset_input_holds_a_placeholder(name: str) -> None:
    """Before a host exists there is no seed: the dataset's input shows each of the
    brief's variables as `<name>`; the setup step gives the agent the rendered brief
    (tests/integrations/test_inspect_challenges.py)."""
    from opsarena.challenges.catalog import builtin_challenge
    from opsarena.integrations.inspect.tasks import challenge_task

    challenge = builtin_challenge(name)
    [sample] = list(challenge_task(name).dataset)
    assert isinstance(sample.input, str) and "{{" not in sample.input
    for variable in challenge.brief_variables():
        assert f"<{variable}>" in sample.input


def test_the_sample_seed_hides_itself_and_opens_its_commitment() -> None:
    from opsarena.integrations.inspect.sandbox import SampleSeed
    from opsarena.match.commitment import reveal_problem

    seed = SampleSeed.draw("inspect-abc")
    assert seed.seed.hex() not in repr(seed) and seed.nonce.hex() not in repr(seed)
    assert reveal_problem("inspect-abc", seed.commitment, seed.seed.hex(), seed.nonce.hex()) is None
    assert SampleSeed.draw("inspect-abc").seed != seed.seed
    score = score_of(_judgement(4, None), {}, None, seed)
    assert score.metadata is not None
    assert (score.metadata["seed_nonce"], score.metadata["seed_commitment"]) == (
        seed.nonce.hex(),
        seed.commitment,
    )
    assert score.metadata["match_id"] == "inspect-abc"


def test_a_power_cut_disk_only_for_a_challenge_that_cuts_the_power() -> None:
    from opsarena.challenges.catalog import builtin_challenge
    from opsarena.integrations.inspect.sandbox import needs_power_cut
    from opsarena.referee.nemesis import faults_needed

    assert not needs_power_cut(None)
    for name in builtin_names():
        challenge = builtin_challenge(name)
        assert needs_power_cut(challenge) == ("power-cut" in faults_needed(challenge))
    assert needs_power_cut(builtin_challenge("crash-safe-records"))
    assert not needs_power_cut(builtin_challenge("durable-records"))


def test_a_plug_in_fault_that_needs_a_power_cut_disk_gets_one() -> None:
    """The sandbox asks the fault registry, as the controller does, never a fault's name."""
    from opsarena.challenges.catalog import builtin_challenge
    from opsarena.integrations.inspect.sandbox import needs_power_cut
    from opsarena.referee.model import Milestone
    from tests.faults import BROWNOUT

    challenge = builtin_challenge("durable-records")
    brownout = Milestone(id="chaos", title="t", points=5, check="fault-durability", fault=BROWNOUT)
    assert needs_power_cut(
        challenge.model_copy(update={"milestones": [*challenge.milestones, brownout]})
    )


def test_a_challenge_adding_packages_runs_on_its_own_image(tmp_path: Path) -> None:
    from opsarena.challenges.catalog import builtin_root
    from opsarena.hosts.image import image_for

    text = (builtin_root() / "durable-records" / "challenge.toml").read_text()
    file = tmp_path / "with-packages.toml"
    file.write_text(f'packages = ["jq"]\n{text}')
    config = OpsarenaSandboxConfig(challenge=str(file))
    assert config.host_image() == image_for(["jq"], "localhost/opsarena-host:bookworm")
    assert config.host_image() != "localhost/opsarena-host:bookworm"
    assert OpsarenaSandboxConfig(challenge=str(file), image="x").host_image() == "x"
