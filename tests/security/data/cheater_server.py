"""A records service that is durable only while it thinks the referee is looking.

Usage: python3 cheater_server.py --trigger KIND [--port 8080] [--dir /var/lib/cheat]

It stores each record as a file (write to a temporary file, rename over the record) and
acknowledges at once, with nothing fsynced, EXCEPT for `WINDOW_S` seconds after it sees
its trigger: then it runs `sync()` once (every earlier write becomes durable) and fsyncs
each record and its directory before acknowledging. The triggers are features of the
referee's traffic a service can observe:

  signature    two PUTs in a row with no GET between (the old fault round's opening)
  body         a PUT of an empty body or of 1 MiB or more
  concurrent   two PUTs in flight at the same time
  overwrite    a PUT to an id already stored
  burst        three requests within 50 ms after 0.5 s without any
  next         (no window) every write becomes durable when the next request arrives:
               `sync()` before that request is handled, so a write is at risk only
               until the service hears from the referee again

Every record it acknowledged survives a restart, a crash and a reboot (the page cache
keeps it); a power cut loses what was acknowledged outside a window. Standard library
only (it runs in the host).
"""

from __future__ import annotations

import argparse
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WINDOW_S = 15.0
LARGE = 1024 * 1024
ID = re.compile(r"^/records/([A-Za-z0-9-]{1,200})$")


class Watch:
    """The trigger's state, shared by the handler threads."""

    def __init__(self, trigger: str) -> None:
        self.trigger = trigger
        self.lock = threading.Lock()
        self.until = 0.0
        self.last_put = False
        self.puts_in_flight = 0
        self.arrivals: list[float] = []
        self.dirty = False

    def careful(self) -> bool:
        return time.monotonic() < self.until

    def _fire(self) -> None:
        if not self.careful():
            os.sync()
        self.until = time.monotonic() + WINDOW_S

    def request(self, method: str, size: int, *, exists: bool = False) -> None:
        now = time.monotonic()
        with self.lock:
            if self.trigger == "next":
                if self.dirty:
                    os.sync()
                    self.dirty = False
            elif self.trigger == "overwrite" and method == "PUT" and exists:
                self._fire()
            elif self.trigger == "signature":
                if method == "PUT" and self.last_put:
                    self._fire()
                self.last_put = method == "PUT"
            elif self.trigger == "body" and method == "PUT" and (size == 0 or size >= LARGE):
                self._fire()
            elif self.trigger == "concurrent" and method == "PUT":
                self.puts_in_flight += 1
                if self.puts_in_flight >= 2:
                    self._fire()
            elif self.trigger == "burst":
                quiet = not self.arrivals or now - self.arrivals[-1] >= 0.5
                self.arrivals = [now] if quiet else [*self.arrivals[-2:], now]
                if len(self.arrivals) == 3 and now - self.arrivals[0] <= 0.05:
                    self._fire()

    def wrote(self) -> None:
        with self.lock:
            self.dirty = True

    def done(self, method: str) -> None:
        if self.trigger == "concurrent" and method == "PUT":
            with self.lock:
                self.puts_in_flight -= 1


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def _answer(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.watch.request("GET", 0)
        if self.path == "/health":
            self._answer(200, b"ready\n")
            return
        match = ID.match(self.path)
        if match is None:
            self._answer(404)
            return
        try:
            with open(os.path.join(self.server.dir, match.group(1)), "rb") as f:
                self._answer(200, f.read())
        except FileNotFoundError:
            self._answer(404)

    def do_PUT(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        watch = self.server.watch
        match = ID.match(self.path)
        path = os.path.join(self.server.dir, match.group(1) if match else "-")
        watch.request("PUT", size, exists=os.path.exists(path))
        try:
            body = self.rfile.read(size)
            if match is None:
                self._answer(404)
                return
            temp = f"{path}.{threading.get_ident()}.tmp"
            careful = watch.careful()
            with open(temp, "wb") as f:
                f.write(body)
                if careful:
                    f.flush()
                    os.fsync(f.fileno())
            os.rename(temp, path)
            watch.wrote()
            if careful:
                fd = os.open(self.server.dir, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self._answer(204)
        finally:
            watch.done("PUT")

    def log_message(self, format: str, *args: object) -> None:
        return


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, directory: str, watch: Watch) -> None:
        super().__init__(("0.0.0.0", port), Handler)
        self.dir = directory
        self.watch = watch


def main() -> None:
    parser = argparse.ArgumentParser()
    triggers = ["signature", "body", "concurrent", "overwrite", "burst", "next"]
    parser.add_argument("--trigger", required=True, choices=triggers)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--dir", default="/var/lib/cheat")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    Server(args.port, args.dir, Watch(args.trigger)).serve_forever()


if __name__ == "__main__":
    main()
