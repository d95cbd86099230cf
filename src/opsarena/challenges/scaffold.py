"""`opsarena challenges new PATH`: a challenge directory that validates and calibrates as made.

The scaffold is the smallest whole challenge: `challenge.toml` (one milestone judged by a
check of its own), `checks.py` (that check), `builders.py` (its `reference` oracle and
`idle`), `calibration.toml` (what each must measure) and `files/` (a greeting the arena
places on every host, which the service must serve). Every name in it derives from the
directory's name, so two scaffolds never collide in one process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from opsarena.errors import UsageError
from opsarena.referee.model import is_valid_name

GREETING = "hello from the arena"

_CHALLENGE = '''\
name = "{name}"
title = "{name}: a service that serves the greeting the arena placed"
image = "localhost/opsarena-host:bookworm"
port = 8080
unit = "builder-app.service"
time_limit_s = 600
cadence_s = 1.0
feedback = true
checks_file = "checks.py"

brief = """
You are root on your own host: Debian 12 (bookworm) with systemd, python3 (standard
library only) and curl. The host has no network route anywhere.

YOUR TASK
Deploy an HTTP/1.1 service as the systemd unit builder-app.service, listening on TCP
port 8080, enabled so that it starts at boot:

  GET /health     answer 200 with the body `ready`.
  GET /greeting   answer 200 with the exact content of /etc/{name}/greeting.

The referee checks it from outside the host, again and again, until it passes.
"""

[failure_reasons]
{reason} = "GET /greeting answered something other than the placed greeting"

# Each milestone names a check (registered in checks.py, or a built-in one); a fault
# (`fault = "restart"`, "reboot", ...) makes the referee inject it before judging.
[[milestones]]
id = "greeting"
title = "The service serves the placed greeting"
points = 100
check = "{check}"
'''

_CHECKS = '''\
"""{name}'s checks: registered under names of this challenge's own."""

from __future__ import annotations

from opsarena.challenges import CheckContext, Verdict, register_check
from opsarena.hosts import Host

GREETING_PATH = "/etc/{name}/greeting"
CURL_COULDNT_CONNECT = 7


@register_check("{check}")
async def greeting(host: Host, ctx: CheckContext) -> Verdict:
    """GET /greeting, from inside the host, answers the file the arena placed."""
    url = f"http://127.0.0.1:{{ctx.challenge.port}}/greeting"
    reproduce = f"curl -s {{url}}"
    curl = ["curl", "-s", "--max-time", "5", "-o", "/tmp/.greeting"]
    got = await host.exec([*curl, "-w", "%{{http_code}}", url], timeout=30.0)
    if got.exit_code == CURL_COULDNT_CONNECT:
        nothing = f"nothing listens: reproduce: {{reproduce}}"
        return Verdict.failed("connection_refused", nothing)
    body = await host.exec(["cat", "/tmp/.greeting"], timeout=30.0)
    expected = await host.exec(["cat", GREETING_PATH], timeout=30.0)
    status = got.stdout.decode(errors="replace").strip()
    if status != "200" or body.stdout != expected.stdout:
        return Verdict.failed(
            "{reason}",
            f"GET /greeting answered {{status}} with {{body.stdout[:80]!r}}, expected "
            f"{{expected.stdout[:80]!r}}: reproduce: {{reproduce}}",
        )
    text = expected.stdout.decode(errors="replace").strip()
    return Verdict.passed({{"greeting": text}})
'''

_BUILDERS = '''\
"""{name}'s scripted builders: its `reference` oracle and `idle` (add flawed ones here,
each with a row in calibration.toml)."""

from __future__ import annotations

from opsarena.agents.scripted import IdleBuilder, ScriptedBuilder, ServiceTarget
from opsarena.agents.scripted.deploy import activation_script
from opsarena.hosts import ExecResult, Host

SERVER = b"""\\
import http.server, sys

GREETING = "/etc/{name}/greeting"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            body = b"ready"
        elif self.path == "/greeting":
            with open(GREETING, "rb") as f:
                body = f.read()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
"""


def unit(target: ServiceTarget, program: str) -> str:
    return (
        "[Unit]\\nDescription=greeting service\\n\\n"
        f"[Service]\\nUser={{target.stem}}\\n"
        f"ExecStart=/usr/bin/python3 {{program}} {{target.port}}\\n"
        "Restart=always\\n\\n[Install]\\nWantedBy=multi-user.target\\n"
    )


class ReferenceBuilder(ScriptedBuilder):
    """Serves the greeting, enabled: passes every milestone."""

    name = "reference"

    async def deploy(
        self, host: Host, target: ServiceTarget, *, wait_seconds: float
    ) -> ExecResult | None:
        program = f"{{target.program_dir}}/server.py"
        await host.write_file(program, SERVER)
        await host.write_file(target.unit_path, unit(target, program).encode())
        return await host.exec(
            activation_script(target, enable=True, wait_seconds=wait_seconds),
            timeout=wait_seconds + 30.0,
        )

    def describe(self, target: ServiceTarget) -> str:
        return f"reference: the greeting service on port {{target.port}}, {{target.unit}} enabled"


BUILDERS: tuple[type[ScriptedBuilder], ...] = (ReferenceBuilder, IdleBuilder)
'''

_CALIBRATION = """\
# {name}'s calibration: each builder of builders.py alone on a fresh host, and what the
# referee must measure (`opsarena challenges calibrate PATH`). A builder that passes
# every milestone has no stops_at.
preflight = "connection_refused"

[builders.reference]
points = 100

[builders.idle]
points = 0
stops_at = "greeting"
reason = "connection_refused"
"""


def scaffold(path: str | Path) -> Path:
    """Write a new challenge directory at `path` (its name is the directory's). Raises
    `UsageError` when the name is not a valid challenge name or `path` exists; nothing
    is written then."""
    directory = Path(path)
    name = directory.name
    if not is_valid_name(name):
        raise UsageError(
            f"{path}: the directory's name {name!r} is the challenge's name: use lowercase "
            "letters, digits and '-'"
        )
    if directory.exists() or directory.is_symlink():
        raise UsageError(f"{path}: exists already; give a new directory")
    if not directory.parent.is_dir():
        raise UsageError(f"{path}: no directory {directory.parent} to create it in")
    fields = {
        "name": name,
        "check": f"{name}-greeting",
        "reason": "wrong_greeting",
    }
    texts = {
        "challenge.toml": _CHALLENGE,
        "checks.py": _CHECKS,
        "builders.py": _BUILDERS,
        "calibration.toml": _CALIBRATION,
    }
    staging = directory.parent / f".{name}.new"
    try:
        staging.mkdir()
    except OSError as exc:
        raise UsageError(f"{path}: cannot create it: {exc.strerror}") from None
    try:
        for file, template in texts.items():
            (staging / file).write_text(template.format(**fields))
        greeting = staging / "files" / "etc" / name / "greeting"
        greeting.parent.mkdir(parents=True)
        greeting.write_text(f"{GREETING} ({name})\n")
        greeting.chmod(0o644)
        staging.rename(directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory
