"""The records service of one release of zero-downtime-deploy (placed on the host).

The arena copies this file to `/opt/releases/<version>/server.py` next to a `VERSION`
file, once per release. It runs under the host's python3 (standard library only) and
imports nothing of opsarena's:

    python3 /opt/releases/<version>/server.py --data DIR [--port 8080] [--reuse-port]

- Records are files in DIR, each written to a temporary file, fsynced, renamed over the
  record and DIR fsynced: a 2xx answer means the record is on disk. Releases share the
  format, so any release reads what another wrote.
- `GET /health` -> 200 `ready`; `GET /version` -> 200 and the release's version;
  `PUT /records/<id>` -> 204; `GET /records/<id>` -> 200 with the bytes, or 404.
- The listening socket: when systemd passes one (socket activation, `LISTEN_FDS`), the
  server accepts on it; otherwise it binds 0.0.0.0:PORT itself (with `--reuse-port`,
  SO_REUSEPORT, so two releases can listen at once).
- SIGTERM: stop accepting, finish every request in flight, then exit 0. Connections not
  yet accepted stay in the socket's queue (the next release accepts them when the socket
  is systemd's; they are reset when the process owned the socket).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RECORD_ID = re.compile(r"/records/([A-Za-z0-9_-][A-Za-z0-9._-]{0,127})")
MAX_BODY = 8 * 1024 * 1024
SD_LISTEN_FDS_START = 3


def release_version() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "VERSION"), encoding="utf-8") as version:
        return version.read().strip()


class Records:
    """Records as files in one directory, each replaced atomically and durably."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)

    def get(self, record_id: str) -> bytes | None:
        try:
            with open(os.path.join(self.directory, record_id), "rb") as record:
                return record.read()
        except FileNotFoundError:
            return None

    def put(self, record_id: str, body: bytes) -> None:
        fd, temp_path = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as temp:
                temp.write(body)
                temp.flush()
                os.fsync(temp.fileno())
            os.replace(temp_path, os.path.join(self.directory, record_id))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp_path)
            raise
        dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ReleaseServer

    def log_message(self, format: str, *args: object) -> None:
        return None

    def _answer(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)
        self.close_connection = True

    def do_GET(self) -> None:
        if self.path == "/health":
            self._answer(200, b"ready\n")
        elif self.path == "/version":
            self._answer(200, self.server.version.encode() + b"\n")
        elif match := _RECORD_ID.fullmatch(self.path):
            value = self.server.records.get(match.group(1))
            if value is None:
                self._answer(404, b"not found\n")
            else:
                self._answer(200, value)
        else:
            self._answer(404, b"not found\n")

    do_HEAD = do_GET

    def do_PUT(self) -> None:
        match = _RECORD_ID.fullmatch(self.path)
        if match is None:
            self._answer(404, b"not found\n")
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._answer(411, b"length required\n")
            return
        if int(length) > MAX_BODY:
            self._answer(413, b"too large\n")
            return
        body = self.rfile.read(int(length))
        if len(body) != int(length):
            self.close_connection = True
            return
        self.server.records.put(match.group(1), body)
        self._answer(204)


class ReleaseServer(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    request_queue_size = 1024
    reuse_port = False

    def __init__(self, sock: socket.socket | None, port: int, records: Records) -> None:
        self.records = records
        self.version = release_version()
        if sock is None:
            super().__init__(("0.0.0.0", port), Handler)
        else:
            super().__init__(sock.getsockname()[:2], Handler, bind_and_activate=False)
            self.socket.close()
            self.socket = sock

    def server_bind(self) -> None:
        if self.reuse_port:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


def inherited_socket() -> socket.socket | None:
    """The listening socket systemd passed (socket activation), if any."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    if int(os.environ.get("LISTEN_FDS", "0")) < 1:
        return None
    return socket.socket(fileno=SD_LISTEN_FDS_START)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="the records directory")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--reuse-port", action="store_true")
    args = parser.parse_args()
    ReleaseServer.reuse_port = args.reuse_port
    server = ReleaseServer(inherited_socket(), args.port, Records(args.data))

    def stop(signum: int, frame: object) -> None:
        # shutdown() waits for serve_forever to return: not from its own thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    server.serve_forever(poll_interval=0.1)
    server.server_close()  # joins every request thread still answering


if __name__ == "__main__":
    main()
