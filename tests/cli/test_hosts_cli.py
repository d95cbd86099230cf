"""`opsarena hosts` and `opsarena image` as a user runs them: a real process, real hosts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import new_match_id

OPSARENA = [sys.executable, "-m", "opsarena.cli.main"]


def opsarena(
    *args: str, input: bytes | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*OPSARENA, *args], input=input, capture_output=True, timeout=timeout, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


NO_SHELL_CLI = """
import sys
from opsarena.cli.main import main
from opsarena.hosts import Host, register_driver
from opsarena.hosts.podman import PodmanDriver, PodmanHost

class NoShellHost(PodmanHost):
    shell_argv = Host.shell_argv  # the contract's own answer: this driver has none

class NoShellDriver(PodmanDriver):
    name = "no-shell"

    async def get(self, name):
        host = await super().get(name)
        return NoShellHost(self.podman, host.name, host.match_id, host.territory)

register_driver("no-shell", NoShellDriver)
main(sys.argv[1:])
"""
"""`opsarena` with a driver whose hosts give no interactive shell (podman hosts that keep
`Host.shell_argv` as the contract defines it), to see `hosts shell` refuse it."""


def one_error_line(result: subprocess.CompletedProcess[bytes]) -> str:
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode == 2, result
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.hosts
def test_host_life_from_the_command_line() -> None:
    name = new_match_id("cli")
    try:
        up = opsarena("hosts", "up", name)
        assert up.returncode == 0, up.stderr
        ready = opsarena("hosts", "exec", name, "--", "systemctl", "is-system-running")
        assert ready.stdout.strip() in (b"running", b"degraded")
        code = opsarena(
            "hosts", "exec", name, "--", "bash", "-c", "cat; echo oops >&2; exit 7", input=b"in"
        )
        assert (code.returncode, code.stdout, code.stderr) == (7, b"in", b"oops\n")
        timed = opsarena("hosts", "exec", "--timeout", "0.5", name, "--", "sleep", "30")
        assert timed.returncode == 124 and b"killed after 0.5s" in timed.stderr
        shell = opsarena("hosts", "shell", name, input=b"hostname; echo in-$0; pwd\n")
        assert shell.returncode == 0, shell.stderr
        assert shell.stdout.split() == [name.encode(), b"in-bash", b"/root"]
        as_nobody = opsarena("hosts", "shell", name, "--user", "nobody", input=b"id -un\n")
        assert (as_nobody.returncode, as_nobody.stdout) == (0, b"nobody\n"), as_nobody.stderr
        assert "'-x' is not a user name" in one_error_line(
            opsarena("hosts", "shell", name, "--user=-x", input=b"id\n")
        )
        no_shell = subprocess.run(
            [sys.executable, "-c", NO_SHELL_CLI, "hosts", "shell", name, "--driver", "no-shell"],
            input=b"id\n", capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        assert f"host opsarena-cli-{name} has no interactive shell" in one_error_line(no_shell)
        listed = opsarena("hosts", "ls")
        assert name in listed.stdout.decode()
        opsarena(
            "hosts", "exec", name, "--", "systemd-run", "--unit", "clitest", "sleep", "infinity"
        )
        restarted = opsarena("hosts", "restart-service", name, "clitest.service")
        assert restarted.returncode == 0 and b"main PID is now" in restarted.stdout
        for flags in ([], ["--hard"]):
            rebooted = opsarena("hosts", "reboot", name, *flags)
            assert rebooted.returncode == 0, rebooted.stderr
        assert "unit clitest.service does not exist" in one_error_line(
            opsarena("hosts", "restart-service", name, "clitest.service")
        )
        assert opsarena("hosts", "exec", f"cli/{name}", "--", "true").returncode == 0
        assert opsarena("hosts", "exec", f"opsarena-cli-{name}", "--", "true").returncode == 0
    finally:
        opsarena("hosts", "rm", name)
    assert "no host named" in one_error_line(opsarena("hosts", "exec", name, "--", "true"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["hosts", "exec", "no-such-host-xyz", "--", "true"], "no host named 'no-such-host-xyz'"),
        (["hosts", "up", "Bad_Name"], "'Bad_Name' is not valid"),
        (["hosts", "exec", "x/Y", "--", "true"], "territory 'Y' is not valid"),
        (["hosts", "exec", "somehost"], "Missing argument 'command'"),
        (["hosts", "exec", "somehost", "--"], "needs a command"),
        (["hosts", "cleanup"], "exactly one of --match MATCH or --all"),
        (["hosts", "cleanup", "--match", "m", "--all"], "exactly one of --match MATCH or --all"),
        (["hosts", "up", "x", "--memory", "1"], "--memory"),
        (["hosts", "reboot"], "Missing argument 'name'"),
        (["hosts", "rm", "no-such-host-xyz"], "no host named"),
        (["hosts", "ls", "--driver", "docker-swarm"], "unknown host driver 'docker-swarm'"),
        (["frobnicate"], "No such command 'frobnicate'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], expected: str) -> None:
    assert expected in one_error_line(opsarena(*args))


@pytest.mark.hosts
def test_image_build_does_nothing_when_the_image_matches_its_recipe() -> None:
    built = opsarena("image", "build")
    assert built.returncode == 0
    assert b"is up to date (recipe " in built.stderr
    listed = opsarena("image", "ls").stdout.decode()
    recipe = built.stderr.decode().split("recipe ")[1].split(")")[0]
    assert "localhost/opsarena-host:bookworm" in listed and recipe in listed


def test_image_build_rejects_a_bad_name_before_building() -> None:
    assert "'Bad Name' is not a valid image name" in one_error_line(
        opsarena("image", "build", "--name", "Bad Name")
    )
