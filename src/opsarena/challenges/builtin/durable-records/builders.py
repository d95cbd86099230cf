"""durable-records' scripted builders: its `reference` oracle and its flawed builders.

Each deploys (or fails to deploy, by design) an HTTP records service on its host. The
flawed Python ones run the records workload's server with one `--flaw`, storage or
enablement (`calibration.toml` says where each stops and why); `webdav` is the image's
nginx-light with its DAV module (no Python of ours serves requests); `slow-start` is
`reference` whose unit sleeps 6 s before the server starts and whose agent ends right
after `systemctl enable --now`, without waiting: only the settle window of a real match
lets it reach its verdict (tests/referee/test_settle.py), so it is not calibrated here.
"""

from __future__ import annotations

from opsarena.agents.scripted import IdleBuilder, RecordsServiceBuilder, ScriptedBuilder
from opsarena.agents.scripted.deploy import (
    MAX_BODY_BYTES,
    ServiceTarget,
    activation_script,
)
from opsarena.hosts import ExecResult, Host

NGINX_RECORD_LOCATION = r"^/records/[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"
"""The records server's `valid_record_id` rule, in nginx's regex syntax."""


class ReferenceBuilder(RecordsServiceBuilder):
    """Durable and enabled: passes every milestone."""

    name = "reference"


def nginx_config(target: ServiceTarget) -> str:
    """An nginx configuration serving the records contract with its DAV module.

    PUT writes the body to a temporary file in the state directory and renames it over
    the record (201 new, 204 replaced); GET serves the file, 404 when absent. nginx does
    not fsync, so a record survives a service restart and a clean or container-level
    reboot, not a power cut before the kernel wrote it back.
    """
    state = target.state_dir
    temp_paths = "".join(
        f"    {kind}_temp_path {state}/{kind}-temp;\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return (
        f"# Written by opsarena's scripted builder webdav for {target.unit}.\n"
        "daemon off;\n"
        "worker_processes 1;\n"
        f"pid {target.runtime_dir}/nginx.pid;\n"
        "error_log stderr warn;\n\n"
        "events {\n    worker_connections 256;\n}\n\n"
        "http {\n"
        "    access_log off;\n"
        f"{temp_paths}"
        "    server {\n"
        f"        listen {target.port};\n"
        f"        client_max_body_size {MAX_BODY_BYTES};\n"
        "        location = /health {\n"
        "            default_type text/plain;\n"
        "            return 200 'ready';\n"
        "        }\n"
        f'        location ~ "{NGINX_RECORD_LOCATION}" {{\n'
        f"            root {state};\n"
        "            dav_methods PUT;\n"
        "            create_full_put_path on;\n"
        "            dav_access user:rw;\n"
        "            log_not_found off;\n"
        "            types { }\n"
        "            default_type application/octet-stream;\n"
        "            limit_except GET PUT {\n                deny all;\n            }\n"
        "        }\n"
        "        location / {\n            return 404;\n        }\n"
        "    }\n"
        "}\n"
    )


def nginx_unit(target: ServiceTarget, config_path: str) -> str:
    """The unit running nginx in the foreground with `config_path`, as its own user."""
    return (
        "[Unit]\n"
        "Description=records service on nginx WebDAV (opsarena scripted builder webdav)\n\n"
        "[Service]\n"
        "Type=exec\n"
        f"User={target.stem}\n"
        f"StateDirectory={target.stem}\n"
        f"RuntimeDirectory={target.stem}\n"
        f"ExecStart=/usr/sbin/nginx -c {config_path}\n"
        f"ExecReload=/usr/sbin/nginx -c {config_path} -s reload\n"
        "Restart=always\n"
        "RestartSec=200ms\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


class InMemoryBuilder(RecordsServiceBuilder):
    """Records in a dict: lost at the first service restart."""

    name = "in-memory"
    storage = "memory"


class VolatileBuilder(RecordsServiceBuilder):
    """Records under /run: kept across a restart, lost at a reboot."""

    name = "volatile"
    storage = "run"


class NotEnabledBuilder(RecordsServiceBuilder):
    """Durable but never enabled: nothing listens after a reboot."""

    name = "not-enabled"
    enable = False


class WrongHealthBuilder(RecordsServiceBuilder):
    """/health answers "ok" instead of "ready"."""

    name = "wrong-health"
    health_body = "ok"


class IgnoreIdsBuilder(RecordsServiceBuilder):
    """Answers every GET with the last body PUT, whatever the id."""

    name = "ignore-ids"
    flaw = "ignore-ids"


class NewestOnlyBuilder(RecordsServiceBuilder):
    """Keeps only the most recent record."""

    name = "newest-only"
    flaw = "newest-only"


class BinaryUnsafeBuilder(RecordsServiceBuilder):
    """Decodes bodies as UTF-8 text: binary values come back changed."""

    name = "binary-unsafe"
    flaw = "utf8"


class SizeLimitedBuilder(RecordsServiceBuilder):
    """Cuts bodies at 64 KiB."""

    name = "size-limited"
    flaw = "size-limit"


class FoundForMissingBuilder(RecordsServiceBuilder):
    """Answers 200 (empty body) for ids never written."""

    name = "found-for-missing"
    flaw = "found-for-missing"


class NoOverwriteBuilder(RecordsServiceBuilder):
    """Ignores a PUT to an id that exists (first write wins)."""

    name = "no-overwrite"
    flaw = "no-overwrite"


class RacyBuilder(RecordsServiceBuilder):
    """Not safe under concurrent writes: parallel PUTs store each other's bodies."""

    name = "racy"
    flaw = "racy"


class SlowStartBuilder(RecordsServiceBuilder):
    """Correct, but its unit sleeps 6 s before the server starts, and the agent ends
    right after `systemctl enable --now` without waiting for it."""

    name = "slow-start"
    start_delay_s = 6
    wait = False


class WebdavBuilder(ScriptedBuilder):
    """The image's nginx-light with its DAV module as the records service; no Python of
    ours serves requests. Passes every milestone."""

    name = "webdav"

    async def deploy(
        self, host: Host, target: ServiceTarget, *, wait_seconds: float
    ) -> ExecResult | None:
        config_path = f"{target.config_dir}/nginx.conf"
        await host.write_file(config_path, nginx_config(target).encode())
        await host.write_file(target.unit_path, nginx_unit(target, config_path).encode())
        return await host.exec(
            activation_script(target, enable=True, wait_seconds=wait_seconds),
            timeout=wait_seconds + 30.0,
        )

    def describe(self, target: ServiceTarget) -> str:
        return (
            f"webdav: nginx DAV records service on port {target.port}, records under "
            f"{target.state_dir}/records; {target.unit} enabled and started"
        )


BUILDERS: tuple[type[ScriptedBuilder], ...] = (
    ReferenceBuilder,
    WebdavBuilder,
    InMemoryBuilder,
    VolatileBuilder,
    NotEnabledBuilder,
    WrongHealthBuilder,
    IdleBuilder,
    IgnoreIdsBuilder,
    NewestOnlyBuilder,
    BinaryUnsafeBuilder,
    SizeLimitedBuilder,
    FoundForMissingBuilder,
    NoOverwriteBuilder,
    RacyBuilder,
    SlowStartBuilder,
)
