#!/usr/bin/python3
"""The retired records service: answers 503 on the socket systemd hands it (fd 3)."""

import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def _retired(self) -> None:
        body = b"legacy records service retired\n"
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = _retired

    def log_message(self, format: str, *args: object) -> None:
        return


class Inherited(ThreadingHTTPServer):
    def server_bind(self) -> None:
        self.socket = socket.socket(fileno=3)
        self.server_address = self.socket.getsockname()[:2]

    def server_activate(self) -> None:
        return


Inherited(("", 0), Handler, bind_and_activate=True).serve_forever()
