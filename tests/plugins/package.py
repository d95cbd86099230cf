"""A throw-away opsarena plug-in package, written into a temporary directory: a
`*.dist-info` (METADATA and entry_points.txt) beside its code, so a Python with that
directory on its path (PYTHONPATH) finds its entry points as it would an installed
package's, with no pip and no edit to opsarena.

It adds, through `opsarena.challenges`, the challenge `plugin-greeter` (a directory with
its challenge.toml and its own checks file registering the check `plugin-greeting`), and
through `opsarena.faults` the fault `double-restart` (two restarts of the unit in a
row), which the challenge's second milestone injects. `GREETER_AGENT` is a command
agent's script passing both milestones.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

PACKAGE = "opsarena_plugin_greeter"
CHALLENGE = "plugin-greeter"
FAULT = "double-restart"
CHECK = "plugin-greeting"
GREETING = "hello-from-a-plugin"

METADATA = """\
Metadata-Version: 2.1
Name: opsarena-plugin-greeter
Version: 0.1
"""

ENTRY_POINTS = f"""\
[opsarena.challenges]
greeter = {PACKAGE}.challenges

[opsarena.faults]
{FAULT} = {PACKAGE}.faults
"""

FAULTS = f'''
"""The plug-in's fault: two restarts of the unit in a row, each confirmed by the host
driver (`Host.restart_service`: the old processes gone, a new main process)."""

from __future__ import annotations

from opsarena.hosts import Host
from opsarena.referee.nemesis import Fault, FaultRun, register_fault


@register_fault
class DoubleRestartFault(Fault):
    name = "{FAULT}"
    host_method = "restart_service"
    timeout_s = 60.0
    after = "after the two restarts"

    def describe(self, host: Host, unit: str) -> str:
        return f"two restarts of {{unit}} in a row"

    async def inject(self, host: Host, unit: str) -> int:
        first = await host.restart_service(unit, timeout=self.timeout_s / 2)
        second = await host.restart_service(unit, timeout=self.timeout_s / 2)
        self.pids = (first.main_pid, second.main_pid)
        return second.main_pid

    async def confirm(self, host: Host, unit: str, before: int, injected: int) -> FaultRun:
        first, second = self.pids
        if first == second:
            raise RuntimeError(f"{{unit}} kept main PID {{first}} across its second restart")
        return FaultRun(f"{FAULT}: {{unit}} restarted twice, main PID {{first}} then {{second}}")
'''

CHALLENGE_TOML = f'''
name = "{CHALLENGE}"
title = "A greeting served by a challenge an installed package provides"
image = "localhost/opsarena-host:bookworm"
port = 8080
unit = "plugin-greeter.service"
time_limit_s = 300
settle_s = 10.0
checks_file = "checks.py"
brief = """
Serve the text {GREETING} (exactly, no newline) at GET /greeting on TCP port 8080 from
the enabled systemd unit plugin-greeter.service. It must come back by itself after the
unit is restarted twice in a row.
"""

[failure_reasons]
greeting_wrong = "GET /greeting did not answer the greeting"
greeting_gone = "the greeting did not come back after the fault"

[[milestones]]
id = "greets"
title = "The greeting answers"
points = 40
check = "{CHECK}"
[milestones.params]
greeting = "{GREETING}"

[[milestones]]
id = "greets-after-double-restart"
title = "The greeting answers again after two restarts in a row"
points = 60
check = "{CHECK}"
fault = "{FAULT}"
ready_budget_s = 15.0
[milestones.params]
greeting = "{GREETING}"
'''

CHECKS = '''
"""The plug-in challenge's own check: GET /greeting through `Host.connect` answers the
milestone's greeting; when the milestone names a fault, it is injected and the greeting
must answer again within the milestone's ready budget."""

from __future__ import annotations

import asyncio

from opsarena.challenges import CheckContext, Verdict, register_check
from opsarena.hosts import Host


async def greeting(host: Host, port: int) -> str:
    """The body GET /greeting answers with a 200; a description of what went wrong else."""
    try:
        reader, writer = await host.connect(port, timeout=2.0)
    except OSError as exc:
        return f"no connection: {exc.__class__.__name__}"
    try:
        writer.write(b"GET /greeting HTTP/1.0\\r\\nHost: greeter\\r\\n\\r\\n")
        await writer.drain()
        async with asyncio.timeout(5.0):
            answer = await reader.read(65536)
            while chunk := await reader.read(65536 - len(answer)):
                answer += chunk
    except (OSError, TimeoutError) as exc:
        return f"no answer: {exc.__class__.__name__}"
    finally:
        writer.close()
    head, _, body = answer.partition(b"\\r\\n\\r\\n")
    status = head.split(b"\\r\\n", 1)[0]
    if b" 200 " not in status + b" ":
        return f"status {status[:80]!r}"
    return body.decode(errors="replace")


@register_check("plugin-greeting")
async def plugin_greeting(host: Host, ctx: CheckContext) -> Verdict:
    expected = ctx.milestone.param("greeting", "")
    port = ctx.challenge.port
    first = await greeting(host, port)
    if first != expected:
        return Verdict.failed("greeting_wrong", f"GET /greeting answered {first!r}")
    if ctx.milestone.fault is None:
        return Verdict.passed({"greeting": first})
    fault_ms = await ctx.inject_fault(ctx.milestone.fault)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.milestone.ready_budget_s
    while (again := await greeting(host, port)) != expected:
        if loop.time() > deadline:
            return Verdict.failed(
                "greeting_gone", f"after {ctx.milestone.fault}, GET /greeting: {again!r}"
            )
        await asyncio.sleep(0.2)
    return Verdict.passed({"greeting": again, "fault": ctx.milestone.fault, "fault_ms": fault_ms})
'''

GREETER_AGENT = f"""\
#!/bin/sh
# Deploys the greeting plugin-greeter asks for, through $OPSARENA_EXEC.
set -eu
$OPSARENA_EXEC 'mkdir -p /srv/greeter && printf %s {GREETING} > /srv/greeter/greeting'
$OPSARENA_EXEC 'cat > /etc/systemd/system/plugin-greeter.service' <<'UNIT'
[Unit]
Description=The greeting

[Service]
ExecStart=/usr/bin/python3 -m http.server 8080 --bind 127.0.0.1 --directory /srv/greeter
Restart=always

[Install]
WantedBy=multi-user.target
UNIT
$OPSARENA_EXEC 'systemctl daemon-reload && systemctl enable --now plugin-greeter.service'
"""


def write_plugin(root: Path) -> Path:
    """Write the plug-in package into `root` (its sys.path entry) and return `root`."""
    dist = root / "opsarena_plugin_greeter-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(METADATA)
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    package = root / PACKAGE
    challenges = package / "challenges"
    directory = challenges / CHALLENGE
    directory.mkdir(parents=True)
    (package / "__init__.py").write_text('"""A throw-away opsarena plug-in."""\n')
    (package / "faults.py").write_text(textwrap.dedent(FAULTS).lstrip())
    (challenges / "__init__.py").write_text('"""Its challenge directories live here."""\n')
    (directory / "challenge.toml").write_text(textwrap.dedent(CHALLENGE_TOML).lstrip())
    (directory / "checks.py").write_text(textwrap.dedent(CHECKS).lstrip())
    return root


def plugin_env(root: Path) -> dict[str, str]:
    """The environment of an `opsarena` subprocess that has the plug-in installed: `root`
    on its PYTHONPATH after whatever is there (the worktree's src)."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, str(root)) if p)}
