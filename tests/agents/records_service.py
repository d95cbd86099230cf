"""What the competitor tests deploy, and how they check it from inside the host with curl.

`APP` and `UNIT` are a correct durable records service (the kind of thing a model writes):
GET /health → "ready"; PUT /records/ID stores the body on disk (atomically); GET returns
it. `assert_durable` proves it works and survives a host reboot.
"""

from __future__ import annotations

from opsarena.hosts import Host

APP_PATH = "/opt/records/app.py"
UNIT_PATH = "/etc/systemd/system/records.service"

APP = """\
import os
import pathlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = pathlib.Path("/var/lib/records")
ID = re.compile(r"/records/([A-Za-z0-9_-][A-Za-z0-9._-]{0,127})")


class Handler(BaseHTTPRequestHandler):
    def send(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            return self.send(200, b"ready")
        match = ID.fullmatch(self.path)
        if match and (ROOT / match[1]).is_file():
            return self.send(200, (ROOT / match[1]).read_bytes())
        self.send(404)

    def do_PUT(self):
        match = ID.fullmatch(self.path)
        if not match:
            return self.send(404)
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        # A temporary file per request: parallel PUTs to one id must not share one.
        tmp = ROOT / f".{match[1]}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, ROOT / match[1])
        self.send(204)


ROOT.mkdir(parents=True, exist_ok=True)
ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
"""

UNIT = """\
[Unit]
Description=durable records service

[Service]
ExecStart=/usr/bin/python3 /opt/records/app.py
Restart=always

[Install]
WantedBy=multi-user.target
"""

WAIT_HEALTHY = (
    "for i in $(seq 100); do curl -sf http://127.0.0.1:8080/health && exit 0; sleep 0.1; done;"
    " exit 1"
)


async def curl(host: Host, args: str, data: bytes | None = None) -> bytes:
    result = await host.exec(f"curl -sf {args}", timeout=30, input=data)
    assert result.exit_code == 0, result
    return result.stdout


async def assert_durable(host: Host) -> None:
    """The service answers, keeps a record, and still has it after a host reboot."""
    assert (await host.exec(WAIT_HEALTHY, timeout=30)).stdout == b"ready"
    value = b"opaque-\x00\xff-value"
    await curl(host, "-X PUT --data-binary @- http://127.0.0.1:8080/records/rec-1", value)
    assert await curl(host, "http://127.0.0.1:8080/records/rec-1") == value
    await host.reboot()
    assert (await host.exec(WAIT_HEALTHY, timeout=30)).stdout == b"ready"
    assert await curl(host, "http://127.0.0.1:8080/records/rec-1") == value
