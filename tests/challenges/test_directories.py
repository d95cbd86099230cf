"""Challenge directories: a checks file, a setup, files placed, added failure reasons,
several ports and units, per-milestone params, images per recipe, finding one again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opsarena.challenges import Verdict, builtin_challenge, find_challenge, load_challenge
from opsarena.challenges.catalog import challenge_source, placed_files
from opsarena.errors import ChallengeError
from opsarena.hosts.image import DEFAULT_IMAGE, image_for, recipe_hash
from opsarena.referee.contract import brief_for
from opsarena.referee.failures import REASONS, reason_problems, table_for
from opsarena.referee.referee import enforce_table

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]

TOML = '''
name = "outside-{tag}"
title = "A challenge authored outside the package"
image = "localhost/opsarena-host:bookworm"
port = 8443
ports = [8443, 8080]
unit = "gateway.service"
units = ["gateway.service", "renew.timer"]
time_limit_s = 60
checks_file = "checks.py"
setup = "outside-{tag}"
packages = ["jq"]
brief = """Serve {{{{greeting}}}} on port 8443."""

[failure_reasons]
greeting_wrong_{tag} = "the service answered another greeting"

[[milestones]]
id = "greets"
title = "It greets"
points = 7
check = "outside-greets-{tag}"
[milestones.params]
greeting_len = 12
ciphers = ["a", "b"]
'''

CHECKS = '''
"""Checks of a challenge authored outside the package."""
import hashlib
from opsarena.challenges import Verdict, register_check
from opsarena.referee.contract import Setup, register_setup


def variables(seed: bytes) -> dict[str, str]:
    return {{"greeting": "hello-" + hashlib.sha256(seed).hexdigest()[:6]}}


async def place(host, seed):
    await host.write_file("/etc/greeting", variables(seed)["greeting"].encode())


register_setup("outside-{tag}", Setup(variables=variables, place=place))


@register_check("outside-greets-{tag}")
async def greets(host, ctx):
    return Verdict.failed("greeting_wrong_{tag}", str(ctx.milestone.param("greeting_len", 0)))
'''


def make(tmp_path: Path, tag: str, *, toml: str = TOML, checks: str = CHECKS) -> Path:
    directory = tmp_path / f"outside-{tag}"
    (directory / "files" / "etc" / "outside").mkdir(parents=True)
    (directory / "challenge.toml").write_text(toml.format(tag=tag))
    (directory / "checks.py").write_text(textwrap.dedent(checks.format(tag=tag)))
    planted = directory / "files" / "etc" / "outside" / "planted.sh"
    planted.write_bytes(b"#!/bin/sh\necho planted\n")
    planted.chmod(0o750)
    return directory


def opsarena(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OPSARENA, *args], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def test_a_directory_brings_its_checks_setup_files_and_reasons(tmp_path: Path) -> None:
    challenge = load_challenge(make(tmp_path, "a"))
    assert challenge.all_ports == [8443, 8080]
    assert challenge.all_units == ["gateway.service", "renew.timer"]
    assert challenge.milestones[0].params == {"greeting_len": 12, "ciphers": ["a", "b"]}
    assert challenge.milestones[0].param("greeting_len", 0) == 12
    assert challenge.milestones[0].param("greeting_len", "x") == "x"  # wrong type: default
    seed = bytes(range(32))
    brief = brief_for(challenge, seed)
    assert brief.startswith("Serve hello-") and "{{" not in brief
    assert brief != brief_for(challenge, bytes(32))  # the variant derives from the seed
    files = placed_files(challenge)
    assert [(f.path, f.mode) for f in files] == [("/etc/outside/planted.sh", 0o750)]
    assert files[0].data == b"#!/bin/sh\necho planted\n"


def test_the_reasons_a_challenge_adds_join_the_one_table(tmp_path: Path) -> None:
    challenge = load_challenge(make(tmp_path, "b"))
    table = table_for(challenge)
    assert set(table) == set(REASONS) | {"greeting_wrong_b"}
    assert table["greeting_wrong_b"].category == "verification_failed"
    added = Verdict.failed("greeting_wrong_b", "hello-x")
    assert enforce_table(added, table) == added
    # Another challenge's verdict may not use it: outside its table it is our bug.
    assert enforce_table(added).failure_reason == "internal_error"
    as_ours = Verdict.referee_error("greeting_wrong_b", "x")
    assert enforce_table(as_ours, table).failure_reason == "internal_error"
    assert reason_problems(challenge) == []
    clash = challenge.model_copy(update={"failure_reasons": {"timeout": "mine"}})
    assert len(reason_problems(clash)) == 1 and "timeout" in reason_problems(clash)[0]


def test_images_are_per_recipe_and_the_default_tag_never_changes() -> None:
    assert image_for([]) == DEFAULT_IMAGE
    assert recipe_hash() == recipe_hash(extra=())
    tagged = image_for(["jq"])
    assert tagged.startswith("localhost/opsarena-host:bookworm-") and tagged != DEFAULT_IMAGE
    assert image_for(["jq", "jq"]) == tagged  # the same additions share one image
    assert image_for(["socat"]) != tagged


def test_a_challenge_is_found_again_from_its_source(tmp_path: Path) -> None:
    builtin = builtin_challenge("durable-records")
    assert challenge_source(builtin) == "durable-records"
    directory = make(tmp_path, "c")
    outside = find_challenge(str(directory))
    source = challenge_source(outside)
    assert source == str(directory.resolve())
    again = find_challenge(source)
    assert again == outside and again.directory == directory.resolve()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("{{{{greeting}}}}", "{{{{farewell}}}}"), "brief: {{farewell}} is not provided"),
        (('checks_file = "checks.py"', 'checks_file = "absent.py"'), "checks_file: no file"),
        (('setup = "outside-{tag}"', 'setup = "nobody"'), "setup: no setup named 'nobody'"),
        (("ports = [8443, 8080]", "ports = [8080]"), "ports must include port 8443"),
        (('units = ["gateway.service", "renew.timer"]', 'units = ["x.conf"]'), "units[0]"),
        (("greeting_len = 12", "greeting_len = {{ a = 1 }}"), "params.greeting_len"),
    ],
)
def test_validate_names_each_problem_in_one_line(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    tag = f"v{abs(hash(change)) % 10**6}"
    directory = make(tmp_path, tag, toml=TOML.replace(*change))
    with pytest.raises(ChallengeError) as caught:
        load_challenge(directory)
    assert any(expected in line for line in caught.value.problems), caught.value.problems
    shown = opsarena("challenges", "validate", str(directory))
    assert shown.returncode == 2 and shown.stdout == ""
    assert expected in shown.stderr
    assert all(line.startswith("opsarena: error: ") for line in shown.stderr.splitlines())


def test_validate_refuses_a_reason_the_referee_has_already(tmp_path: Path) -> None:
    toml = TOML.replace("greeting_wrong_{tag} =", "timeout =")
    directory = make(tmp_path, "d", toml=toml)
    shown = opsarena("challenges", "validate", str(directory))
    assert shown.returncode == 2
    assert "failure_reasons.timeout: the referee's table has this reason already" in shown.stderr
    good = opsarena("challenges", "validate", str(make(tmp_path, "e")))
    assert good.returncode == 0 and "1 files placed" in good.stdout


def test_ls_shows_milestones_points_and_faults() -> None:
    listed = opsarena("challenges", "ls")
    assert listed.returncode == 0
    text = listed.stdout
    assert "durable-records" in text
    assert "service-up (10)" in text and "host-reboot (40)" in text
    assert "restart, reboot" in text


def test_every_reason_a_builtin_challenge_adds_is_documented() -> None:
    import re

    from opsarena.challenges import builtin_names

    text = (Path(__file__).resolve().parents[2] / "docs" / "REFEREE.md").read_text()
    for name in builtin_names():
        for reason in builtin_challenge(name).failure_reasons:
            heading = re.search(rf"^### `{reason}` \(verification_failed\)$", text, re.MULTILINE)
            assert heading, f"docs/REFEREE.md lacks a section for {name}'s {reason}"
            section = text[heading.end() :].split("\n### ", 1)[0]
            assert "Example detail:" in section, reason
