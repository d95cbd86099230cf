#!/bin/bash
# A command agent for the durable-records challenge, in plain bash.
#
#   opsarena run --challenge durable-records --builder a=command:examples/command-agent.sh
#
# opsarena runs it outside the host with OPSARENA_BRIEF_FILE, OPSARENA_MATCH,
# OPSARENA_TERRITORY, OPSARENA_EXEC (run a command in the host) and OPSARENA_PUT (copy a
# file into the host). Exit 0 means "finished"; the referee decides what it is worth.
set -euo pipefail

echo "playing $OPSARENA_TERRITORY in match $OPSARENA_MATCH"
head -n 3 "$OPSARENA_BRIEF_FILE"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat > "$work/app.py" <<'APP'
import os
import pathlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = pathlib.Path("/var/lib/builder-app")
ID = re.compile(r"/records/([A-Za-z0-9-]{1,128})")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

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
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not match:
            return self.send(404)
        # One temporary file per request: parallel PUTs to one id must not share one.
        tmp = ROOT / f".{match[1]}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, ROOT / match[1])
        directory = os.open(ROOT, os.O_RDONLY)
        os.fsync(directory)
        os.close(directory)
        self.send(204)


ROOT.mkdir(parents=True, exist_ok=True)
ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
APP

cat > "$work/builder-app.service" <<'UNIT'
[Unit]
Description=durable records service

[Service]
ExecStart=/usr/bin/python3 /opt/builder-app/app.py
Restart=always

[Install]
WantedBy=multi-user.target
UNIT

# Program, then unit, then enable, then start: never a half-working service.
$OPSARENA_PUT "$work/app.py" /opt/builder-app/app.py
$OPSARENA_PUT "$work/builder-app.service" /etc/systemd/system/builder-app.service
$OPSARENA_EXEC 'systemctl daemon-reload && systemctl enable --now builder-app.service'
$OPSARENA_EXEC 'for i in $(seq 50); do curl -sf http://127.0.0.1:8080/health && exit 0; sleep 0.1; done; exit 1'
echo
echo "deployed; the service answers"
