"""The command agent with real programs on real hosts: one deploys a durable service through
$OPSARENA_EXEC / $OPSARENA_PUT, one exits 3, one ignores SIGTERM and is killed with its group."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from pathlib import Path
from typing import Any

import pytest

from opsarena.agents import AgentContext
from opsarena.agents.command import CommandAgent
from opsarena.errors import AgentConfigError
from opsarena.hosts import Host, HostDriver
from opsarena.store import encode_event_data
from tests.agents.contexts import Events, alive, cmdline, recording_context, script
from tests.agents.records_service import APP, UNIT, WAIT_HEALTHY, assert_durable
from tests.conftest import HostFactory


def make_ctx(host: Host) -> tuple[AgentContext, Events]:
    return recording_context(host, match_id="m2", territory="builder-two")


def output(events: Events, stream: str) -> str:
    return "".join(d["text"] for k, d in events if k == "output" and d["stream"] == stream)


@pytest.mark.hosts
async def test_a_script_deploys_a_durable_service_through_exec_and_put(
    host_factory: HostFactory, tmp_path: Path
) -> None:
    host = await host_factory("builder-two")
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "records.service").write_text(UNIT)
    agent_script = script(
        tmp_path / "my-agent.sh",
        f"""
        #!/bin/bash
        set -euo pipefail
        echo "brief: $(cat "$OPSARENA_BRIEF_FILE")"
        echo "match $OPSARENA_MATCH territory $OPSARENA_TERRITORY"
        $OPSARENA_PUT "$SOURCES/app.py" /opt/records/app.py
        $OPSARENA_PUT "$SOURCES/records.service" /etc/systemd/system/records.service
        $OPSARENA_EXEC 'systemctl daemon-reload && systemctl enable --now records'
        printf piped | $OPSARENA_EXEC 'cat > /tmp/piped; echo to-stderr >&2; exit 7' ||
          echo "code $?"
        $OPSARENA_EXEC '{WAIT_HEALTHY}'
        """,
    )
    sources = [str(tmp_path / "app.py"), str(tmp_path / "records.service")]
    agent = CommandAgent([str(agent_script)], env={"SOURCES": str(tmp_path)}, paths=sources)
    ctx, events = make_ctx(host)
    outcome = await agent.run(ctx)

    assert (outcome.terminal_state, outcome.successful) == ("completed", True), events
    assert outcome.terminal_detail == "exited with code 0"
    stdout = output(events, "stdout")
    assert "brief: Deploy a durable records service on port 8080." in stdout
    assert "match m2 territory builder-two" in stdout
    assert "code 7" in stdout
    assert stdout.endswith("ready")
    assert output(events, "stderr").endswith("records.service.\nto-stderr\n")
    assert await host.read_file("/tmp/piped") == b"piped"
    transcript = [d["entry"] for k, d in events if k == "transcript"]
    # Each request is recorded before it is acted on, its result after.
    assert [e["kind"] for e in transcript] == ["put_request", "put"] * 2 + [
        "exec_request",
        "exec",
    ] * 3
    assert transcript[7]["exit_code"] == 7 and transcript[6]["stdin_bytes"] == len("piped")
    await assert_durable(host)


@pytest.mark.hosts
async def test_the_example_agent_in_the_docs_deploys_a_durable_service(
    host_factory: HostFactory,
) -> None:
    host = await host_factory("example")
    example = Path(__file__).parents[2] / "examples" / "command-agent.sh"
    ctx, events = make_ctx(host)
    outcome = await CommandAgent([str(example)]).run(ctx)
    assert outcome.terminal_state == "completed", output(events, "stderr")
    assert output(events, "stdout").endswith("deployed; the service answers\n")
    await assert_durable(host)


@pytest.mark.hosts
async def test_exec_works_from_another_language(agents_host: Host, tmp_path: Path) -> None:
    program = script(
        tmp_path / "agent.py",
        """
        #!/usr/bin/python3
        import os, subprocess, sys
        done = subprocess.run([os.environ["OPSARENA_EXEC"], "uname -s; exit 4"],
                              capture_output=True)
        print(done.returncode, done.stdout.decode().strip())
        sys.exit(0 if done.returncode == 4 else 1)
        """,
    )
    ctx, events = make_ctx(agents_host)
    outcome = await CommandAgent([str(program)]).run(ctx)
    assert outcome.terminal_state == "completed", output(events, "stderr")
    assert output(events, "stdout") == "4 Linux\n"


@pytest.mark.hosts
async def test_a_nonzero_exit_is_the_players_failure(agents_host: Host, tmp_path: Path) -> None:
    program = script(tmp_path / "fails.sh", "#!/bin/sh\necho 'cannot do it' >&2\nexit 3\n")
    ctx, events = make_ctx(agents_host)
    outcome = await CommandAgent([str(program)]).run(ctx)
    assert (outcome.terminal_state, outcome.successful) == ("failed", False)
    assert (outcome.failure_source, outcome.terminal_detail) == ("player", "exited with code 3")
    assert output(events, "stderr") == "cannot do it\n"


def running(argv: bytes) -> list[int]:
    """Processes of the machine whose command line is `argv` (NUL-separated)."""
    pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    return alive([pid for pid in pids if cmdline(pid) == argv])


@pytest.mark.hosts
@pytest.mark.parametrize(
    ("orphan", "code", "outcome"),
    [
        ("setsid sleep {n} &", 3, ("failed", "exited with code 3")),  # holds the pipes too
        ("setsid sleep {n} </dev/null >/dev/null 2>&1 &", 0, ("completed", "exited with code 0")),
    ],
)
async def test_a_program_that_exits_ends_there_and_its_orphans_are_killed(
    agents_host: Host, tmp_path: Path, orphan: str, code: int, outcome: tuple[str, str]
) -> None:
    """An orphan the program daemonised keeps the sandbox's pid 1 (and maybe its output)
    alive after the program exits: the agent still ends with the program's own exit, not
    `terminated` at the wall limit or the drain, and the orphan is killed."""
    n = 1_000_000 + secrets.randbelow(8_999_999)  # this test's own sleeper, on a shared machine
    body = f"#!/bin/bash\n{orphan.format(n=n)}\necho started\nexit {code}\n"
    ctx, events = make_ctx(agents_host)
    agent = CommandAgent([str(script(tmp_path / "daemonises.sh", body))], wall_s=30)
    try:
        ended = await agent.run(ctx)
    finally:
        for pid in running(f"sleep\0{n}\0".encode()):  # only if the agent left it
            os.kill(pid, signal.SIGKILL)
    assert (ended.terminal_state, ended.terminal_detail) == outcome, ended
    assert output(events, "stdout") == "started\n"
    assert agent.cage is not None and not agent.cage.path.exists(), "the cgroup is removed"
    assert running(f"sleep\0{n}\0".encode()) == []


@pytest.mark.hosts
async def test_a_program_ignoring_sigterm_is_killed_with_everything_it_started(
    agents_host: Host, tmp_path: Path
) -> None:
    program = script(
        tmp_path / "stubborn.sh",
        """
        #!/bin/bash
        trap '' TERM
        bash -c 'trap "" TERM; exec sleep 1000' &
        setsid sleep 1000 &
        while true; do sleep 0.2; done
        """,
    )
    agent = CommandAgent([str(program)], grace_s=0.5)
    ctx, _ = make_ctx(agents_host)
    task = asyncio.create_task(agent.run(ctx))
    started: list[int] = []
    for _ in range(200):
        started = agent.cage.pids() if agent.cage is not None else []
        if len([p for p in started if b"sleep\x001000" in cmdline(p)]) == 2:
            break
        await asyncio.sleep(0.05)
    sleepers = [p for p in started if b"sleep\x001000" in cmdline(p)]
    assert len(sleepers) == 2, [cmdline(p) for p in started]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):  # SIGKILL was sent; the kernel finishes them off
        if not alive(started):
            break
        await asyncio.sleep(0.05)
    assert alive(started) == []
    assert agent.cage is not None and not agent.cage.path.exists(), "the cgroup is removed"


@pytest.mark.hosts
async def test_the_wall_limit_stops_the_program(agents_host: Host, tmp_path: Path) -> None:
    program = script(tmp_path / "slow.sh", "#!/bin/sh\nsleep 1000\n")
    ctx, _ = make_ctx(agents_host)
    outcome = await CommandAgent([str(program)], wall_s=0.5, grace_s=0.5).run(ctx)
    assert (outcome.terminal_state, outcome.terminal_detail) == (
        "terminated",
        "wall time limit (0.5s) reached",
    )


@pytest.mark.hosts
async def test_output_is_bounded(agents_host: Host, tmp_path: Path) -> None:
    program = script(tmp_path / "loud.sh", "#!/bin/sh\nhead -c 200000 /dev/zero | tr '\\0' x\n")
    ctx, events = make_ctx(agents_host)
    outcome = await CommandAgent([str(program)], output_limit=1000).run(ctx)
    assert outcome.terminal_state == "completed"
    assert output(events, "stdout") == "x" * 1000 + "\n[stdout cut after 1000 bytes]\n"


@pytest.mark.hosts
async def test_exec_says_when_the_host_is_unreachable(
    host_factory: HostFactory, podman_driver: HostDriver, tmp_path: Path
) -> None:
    host = await host_factory("gone")
    await podman_driver.remove(host.name)
    program = script(tmp_path / "a.sh", '#!/bin/sh\n$OPSARENA_EXEC true\necho "code $?"\n')
    ctx, events = make_ctx(host)
    assert (await CommandAgent([str(program)]).run(ctx)).terminal_state == "completed"
    assert output(events, "stdout") == "code 255\n"
    assert "the host is not reachable (it may be rebooting)" in output(events, "stderr")


@pytest.mark.hosts
async def test_a_request_that_cannot_be_recorded_is_refused_and_not_run(
    agents_host: Host, tmp_path: Path
) -> None:
    """Whatever makes recording fail (here the log itself), the command and the put are
    refused with a clear error and never reach the host; the gate goes on serving."""
    program = script(
        tmp_path / "a.sh",
        """
        #!/bin/sh
        $OPSARENA_EXEC 'touch /tmp/unrecorded-exec'; echo "exec $?"
        echo data > "$TMPDIR/f"; $OPSARENA_PUT "$TMPDIR/f" /tmp/unrecorded-put; echo "put $?"
        """,
    )
    ctx, events = make_ctx(agents_host)
    recorded = ctx.report

    async def failing_log(kind: str, data: dict[str, Any]) -> None:
        if kind == "transcript":
            raise OSError(28, "No space left on device")
        await recorded(kind, data)

    ctx.report = failing_log
    assert (await CommandAgent([str(program)]).run(ctx)).terminal_state == "completed"
    assert output(events, "stdout") == "exec 2\nput 2\n"
    assert output(events, "stderr").count("the arena cannot record this request") == 2
    found = await agents_host.exec("ls /tmp/unrecorded-exec /tmp/unrecorded-put", timeout=30)
    assert found.exit_code == 2, found


@pytest.mark.hosts
async def test_a_command_and_a_path_that_are_not_utf8_are_recorded_before_they_run(
    agents_host: Host, tmp_path: Path
) -> None:
    """A `\\xff` in a command or a put's path reaches the gate as a lone surrogate, which
    no JSON encoder writes: the transcript shows it escaped (with the SHA-256 of the
    exact bytes), recorded before it runs."""
    program = script(
        tmp_path / "a.sh",
        """
        #!/bin/bash
        $OPSARENA_EXEC $'echo ran > /tmp/ff-exec-\\xff'; echo "exec $?"
        echo data > "$TMPDIR/f"; $OPSARENA_PUT "$TMPDIR/f" $'/tmp/ff-put-\\xff'; echo "put $?"
        """,
    )
    ctx, events = make_ctx(agents_host)
    recorded = ctx.report

    async def store_like(kind: str, data: dict[str, Any]) -> None:
        encode_event_data(kind, data)  # what every store does with an event's data
        await recorded(kind, data)

    ctx.report = store_like
    assert (await CommandAgent([str(program)]).run(ctx)).terminal_state == "completed"
    assert output(events, "stdout") == "exec 0\nput 0\n"
    transcript = [d["entry"] for k, d in events if k == "transcript"]
    assert [e["kind"] for e in transcript] == ["exec_request", "exec", "put_request", "put"]
    assert transcript[0]["command"].startswith("echo ran > /tmp/ff-exec-\\xff\n[not UTF-8:")
    assert transcript[2]["path"].startswith("/tmp/ff-put-\\xff\n[not UTF-8:")
    found = await agents_host.exec(
        ["ls", b"/tmp/ff-exec-\xff".decode(errors="surrogateescape")], timeout=30
    )
    assert found.exit_code == 0, found


async def test_preflight_finds_missing_programs(tmp_path: Path) -> None:
    await CommandAgent(["sh", "-c", "true"]).preflight()
    with pytest.raises(AgentConfigError, match=r"'\./no-such-agent\.sh' is not found"):
        await CommandAgent(["./no-such-agent.sh"]).preflight()
    not_executable = tmp_path / "plain.sh"
    not_executable.write_text("true\n")
    with pytest.raises(AgentConfigError, match="not executable"):
        await CommandAgent([str(not_executable)]).preflight()


def test_env_may_not_reach_the_arenas_interface_or_its_loader() -> None:
    CommandAgent(["true"], env={"MODEL": "x", "_private": "y"})
    for name in ("OPSARENA_EXEC", "OPSARENA_DB", "LD_PRELOAD", "LD_LIBRARY_PATH", "1BAD", "A-B"):
        with pytest.raises(AgentConfigError, match=f"env {name} cannot be given"):
            CommandAgent(["true"], env={name: "/tmp/evil"})


@pytest.mark.hosts
async def test_files_named_on_the_command_line_are_shared_read_only(
    agents_host: Host, tmp_path: Path
) -> None:
    data = tmp_path / "data.txt"
    data.write_text("from the arena\n")
    program = tmp_path / "agent.py"
    program.write_text(
        "import sys\n"
        "print(open(sys.argv[1]).read(), end='')\n"
        "try:\n"
        "    open(sys.argv[1], 'a').write('changed')\n"
        "except OSError as exc:\n"
        "    print('write refused', exc.errno in (13, 30))\n"
    )
    ctx, events = make_ctx(agents_host)
    outcome = await CommandAgent(["/usr/bin/python3", str(program), str(data)]).run(ctx)
    assert outcome.terminal_state == "completed", output(events, "stderr")
    assert output(events, "stdout") == "from the arena\nwrite refused True\n"  # EACCES/EROFS
    assert data.read_text() == "from the arena\n"
