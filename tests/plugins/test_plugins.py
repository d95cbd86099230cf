"""Plug-ins found through package entry points: a throw-away package (tests/plugins/
package.py) on a subprocess's PYTHONPATH adds a challenge and a fault that `opsarena`
lists, shows and checks like its own; a broken or clashing plug-in is a one-line error."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.plugins.package import CHALLENGE, FAULT, GREETING, plugin_env, write_plugin

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]


def opsarena(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OPSARENA, *args], capture_output=True, text=True, timeout=120, check=False,
        env={**plugin_env(root), "COLUMNS": "250"},
    )  # fmt: skip


def python(root: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        timeout=120, check=False, env=plugin_env(root),
    )  # fmt: skip


def test_an_installed_package_adds_a_challenge_and_a_fault(tmp_path: Path) -> None:
    root = write_plugin(tmp_path / "site")
    listed = opsarena(root, "challenges", "ls")
    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if CHALLENGE in line)
    assert FAULT in line and "durable-records" in listed.stdout
    shown = opsarena(root, "challenges", "show", CHALLENGE)
    assert shown.returncode == 0, shown.stderr
    assert GREETING in shown.stdout
    found = python(
        root,
        f"""
        from opsarena.challenges.catalog import challenge_source, find_challenge
        from opsarena.hosts import get_driver
        from opsarena.referee.nemesis import fault_names, get_fault, missing_faults
        challenge = find_challenge({CHALLENGE!r})
        # the plug-in's fault is restart_service's: podman offers it without naming it
        assert {FAULT!r} not in get_driver("podman").faults
        print(missing_faults(challenge, get_driver("podman").faults, "podman"))
        print(missing_faults(challenge, {{"reboot"}}, "toy"))
        print(challenge_source(challenge), get_fault({FAULT!r}).host_method)
        print({FAULT!r} in fault_names())
        """,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines() == [
        "None",
        f"challenge {CHALLENGE!r} needs the faults {FAULT}, which the host driver 'toy' "
        "does not support (it offers: reboot)",
        f"{CHALLENGE} restart_service",
        "True",
    ]


def test_without_the_package_its_challenge_is_unknown(tmp_path: Path) -> None:
    shown = opsarena(tmp_path, "challenges", "show", CHALLENGE)
    assert shown.returncode == 2
    assert f"no built-in challenge named {CHALLENGE!r}, nor one an installed package" in (
        shown.stderr
    )
    assert len(shown.stderr.strip().splitlines()) == 1


def add_dist(root: Path, name: str, entry_points: str) -> None:
    dist = root / f"{name}-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_a_plugin_that_cannot_load_is_one_line_naming_it_at_every_ask(tmp_path: Path) -> None:
    root = write_plugin(tmp_path / "site")
    add_dist(
        root,
        "broken_plugin",
        """
        [opsarena.challenges]
        flaky = broken_plugin.nowhere
        [opsarena.faults]
        flaky = broken_plugin.nowhere
        """,
    )
    for args in (["challenges", "ls"], ["challenges", "show", CHALLENGE]):
        result = opsarena(root, *args)
        assert result.returncode == 2, result.stdout
        assert "the opsarena.challenges entry point 'flaky' (broken_plugin.nowhere) cannot be " in (
            result.stderr
        )
        assert len(result.stderr.strip().splitlines()) == 1
    again = python(
        root,
        """
        from opsarena.errors import RegistryError
        from opsarena.referee.nemesis import fault_names
        for _ in range(2):
            try:
                fault_names()
            except RegistryError as exc:
                print("refused:", exc.__class__.__name__)
        """,
    )
    assert again.stdout.splitlines() == ["refused: RegistryError"] * 2, again.stderr


def test_a_plugin_challenge_named_like_a_builtin_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "site"
    clash = root / "clash_plugin" / "durable-records"
    clash.mkdir(parents=True)
    (root / "clash_plugin" / "__init__.py").write_text("")
    (clash / "challenge.toml").write_text("name = 'durable-records'\n")
    add_dist(root, "clash_plugin", "[opsarena.challenges]\nclash = clash_plugin\n")
    listed = opsarena(root, "challenges", "ls")
    assert listed.returncode == 2
    assert "a challenge named 'durable-records' is registered already" in listed.stderr
    assert str(clash.resolve()) in listed.stderr
    assert len(listed.stderr.strip().splitlines()) == 1
