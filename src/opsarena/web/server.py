"""Running the scoreboard: a listening socket bound up front, uvicorn serving on it.

The socket is bound before uvicorn starts so a busy port is a one-line `ServeError`
instead of a log line from inside uvicorn, and so port 0 (any free port) gives a known URL.
`serve_forever` is `opsarena serve`; `ScoreboardServer` runs in a background thread with
its own event loop for `opsarena run --serve`, so the match's loop is never shared.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from opsarena.errors import ServeError
from opsarena.web.app import create_app

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7700
STOP_TIMEOUT_S = 2.0
"""How long a stopping server waits for open streams to close before cutting them: enough
for a match stream to deliver the last events (streams poll every 0.25 s)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` (port 0: any free port). Raises `ServeError`."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}: check --host") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ServeError(
            f"cannot listen on {host}:{port}: {exc.strerror}: choose another --port"
        ) from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    """`http://HOST:PORT` of a bound socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _config(app: FastAPI, *, log_level: str, access_log: bool) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=int(STOP_TIMEOUT_S),
        lifespan="on",
    )


def serve_forever(app: FastAPI, sock: socket.socket) -> None:
    """Serve `app` (from `create_app`) on `sock` until interrupted (Ctrl-C)."""
    server = uvicorn.Server(_config(app, log_level="info", access_log=True))
    server.run(sockets=[sock])


class ScoreboardServer:
    """The scoreboard of `db_path` served from a background thread.

    `start()` binds (raising `ServeError`) and returns once the server accepts requests;
    `url` is then its address; `stop()` asks it to finish, waits for open streams at most
    `STOP_TIMEOUT_S`, and returns once the thread has ended.
    """

    def __init__(
        self, db_path: Path | str | None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT
    ) -> None:
        self._db_path = db_path
        self._host = host
        self._port = port
        self._sock: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self, *, ready_timeout_s: float = 10.0) -> str:
        """Start serving; returns the URL. Raises `StoreError` when the log cannot be
        read, `ServeError` when the port is taken or the server did not come up within
        `ready_timeout_s`."""
        app = create_app(self._db_path)
        self._sock = bind(self._host, self._port)
        self.url = url_of(self._sock)
        server = uvicorn.Server(_config(app, log_level="warning", access_log=False))
        self._server = server
        sockets = [self._sock]
        # uvicorn installs signal handlers only in the main thread: Ctrl-C stays the match's.
        self._thread = threading.Thread(
            target=lambda: server.run(sockets=sockets), name="opsarena-scoreboard", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + ready_timeout_s
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServeError(f"the scoreboard at {self.url} did not start")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S * 2)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(STOP_TIMEOUT_S)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None


def start_scoreboard(db: Path | str | None) -> ScoreboardServer:
    """A started scoreboard of `db` (default: the default event log) on 127.0.0.1, port
    `DEFAULT_PORT` or, when that is taken, any free port. Raises `ServeError`."""
    try:
        server = ScoreboardServer(db)
        server.start()
    except ServeError:
        server = ScoreboardServer(db, port=0)
        server.start()
    return server


@contextlib.contextmanager
def scoreboard_while(db: Path | str | None, serve: bool) -> Iterator[ScoreboardServer | None]:
    """The started scoreboard of `db` for the `with` block (`--serve` of a match or a
    tournament), stopped at its end; None when not `serve`. Raises `ServeError`."""
    if not serve:
        yield None
        return
    server = start_scoreboard(db)
    try:
        yield server
    finally:
        server.stop()
