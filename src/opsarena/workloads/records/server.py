"""The records service the Python-based scripted builders deploy: one stdlib-only script.

This file is copied into a host and run there by `python3` (3.11, nothing but the
standard library), so it imports nothing of opsarena's. Its behaviour is chosen by
arguments in the systemd unit, which is how one script serves every Python builder:

- `--storage DIR`: each record is the file `DIR/<id>`. A write goes to a temporary file
  in DIR, is fsynced, renamed over the record (atomic), and DIR is fsynced, so a record
  acknowledged with 2xx survives a crash of the service or of the machine. DIR is
  created if missing.
- `--in-memory`: records live in a dict and die with the process.
- `--durability MODE` (with `--storage`), the calibrated durability bugs: `full` (the
  default, above); `no-fsync` (each record written straight to `DIR/<id>`, never
  fsynced); `no-dirsync` (temporary file, fsync, rename, but no fsync of DIR);
  `ack-before-write` (a PUT is answered from memory and stored durably only
  `--persist-delay` seconds later, or at SIGTERM: a clean stop loses nothing, a crash
  loses what was still pending).
- `--health-body TEXT`: what `GET /health` answers (200); "ready" unless told.
- `--flaw NAME`: break one clause of the contract on purpose, for the referee's
  calibration (`FLAWS` says what each does).

HTTP contract: `GET /health` → 200 and the health body. `PUT /records/<id>` stores the
exact request body (Content-Length or chunked, at most `--max-body` bytes, 8 MiB by
default; larger → 413) and answers 204. `GET /records/<id>` (and HEAD) → 200 with
exactly those bytes, 404 when absent. An id is 1-128 characters of `A-Za-z0-9._-`, not
starting with a dot (else 400). Anything else → 404, or 405 for another method.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import ssl
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

DEFAULT_MAX_BODY = 8 * 1024 * 1024
RECORDS_PREFIX = "/records/"
_RECORD_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
_CHUNK_SIZE = 64 * 1024


def valid_record_id(record_id: str) -> bool:
    """True when `record_id` is safe as a file name: 1-128 of `A-Za-z0-9._-`, no leading
    dot (so never `.`, `..`, or one of the service's own temporary files)."""
    return _RECORD_ID.fullmatch(record_id) is not None


class BodyTooLarge(Exception):
    """The request body is over the service's limit."""


class BadBody(Exception):
    """The request body is malformed (no length, broken chunking)."""


class DiskRecords:
    """Records as files in one directory, each replaced atomically and durably."""

    def __init__(self, directory: str, *, durability: str = "full") -> None:
        self.directory = directory
        self.durability = durability
        os.makedirs(directory, exist_ok=True)

    def get(self, record_id: str) -> bytes | None:
        try:
            with open(os.path.join(self.directory, record_id), "rb") as record:
                return record.read()
        except FileNotFoundError:
            return None

    def put(self, record_id: str, body: bytes) -> None:
        if self.durability == "no-fsync":  # the bug: nothing here is ever made durable
            with open(os.path.join(self.directory, record_id), "wb") as record:
                record.write(body)
            return
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
        if self.durability == "no-dirsync":  # the bug: the rename is never made durable
            return
        # The rename itself is only durable once the directory entry is on disk.
        dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class MemoryRecords:
    """Records in a dict: gone when the process ends."""

    def __init__(self) -> None:
        self._records: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def get(self, record_id: str) -> bytes | None:
        with self._lock:
            return self._records.get(record_id)

    def put(self, record_id: str, body: bytes) -> None:
        with self._lock:
            self._records[record_id] = body


FLAWS = {
    "ignore-ids": "every id is the same record: GET answers the last body PUT, whatever the id",
    "newest-only": "only the most recent record is kept; every older one is deleted",
    "utf8": "bodies are decoded as UTF-8 text (bad bytes replaced) and stored re-encoded",
    "size-limit": "bodies are cut at 64 KiB without a word",
    "found-for-missing": "GET of an id never written answers 200 with an empty body",
    "no-overwrite": "a PUT to an id that exists is answered 204 and ignored",
    "racy": "PUT bodies pass through one shared buffer, unlocked: parallel PUTs mix them up",
}
SIZE_LIMIT = 64 * 1024
RACE_WINDOW_S = 0.2


class FlawedRecords:
    """Records with one deliberate flaw (a key of `FLAWS`) over real storage."""

    def __init__(self, inner: Records, flaw: str) -> None:
        self.inner = inner
        self.flaw = flaw
        self._shared = b""

    def get(self, record_id: str) -> bytes | None:
        if self.flaw == "ignore-ids":
            record_id = "all"
        body = self.inner.get(record_id)
        if body is None and self.flaw == "found-for-missing":
            return b""
        return body

    def put(self, record_id: str, body: bytes) -> None:
        flaw = self.flaw
        if flaw == "ignore-ids":
            record_id = "all"
        elif flaw == "utf8":
            body = body.decode("utf-8", errors="replace").encode("utf-8")
        elif flaw == "size-limit":
            body = body[:SIZE_LIMIT]
        elif flaw == "no-overwrite" and self.inner.get(record_id) is not None:
            return
        elif flaw == "racy":
            self._shared = body
            time.sleep(RACE_WINDOW_S)
            body = self._shared
        self.inner.put(record_id, body)
        if flaw == "newest-only" and isinstance(self.inner, DiskRecords):
            for name in os.listdir(self.inner.directory):
                if name != record_id and not name.startswith("."):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.inner.directory, name))


class DelayedRecords:
    """Acknowledge first, persist later: records wait in memory for `delay` seconds (a
    background thread then stores them durably) and are all stored at `flush()`, which
    SIGTERM calls. A SIGKILL loses whatever was still waiting."""

    def __init__(self, disk: DiskRecords, delay: float) -> None:
        self.disk = disk
        self.delay = delay
        self._pending: dict[str, tuple[float, bytes]] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._persist_forever, daemon=True).start()

    def get(self, record_id: str) -> bytes | None:
        with self._lock:
            pending = self._pending.get(record_id)
        return pending[1] if pending else self.disk.get(record_id)

    def put(self, record_id: str, body: bytes) -> None:
        with self._lock:
            self._pending[record_id] = (time.monotonic(), body)

    def _persist(self, older_than: float) -> None:
        with self._lock:
            due = [(rid, p) for rid, p in self._pending.items() if p[0] <= older_than]
        for record_id, (stamp, body) in due:
            self.disk.put(record_id, body)
            with self._lock:
                if self._pending.get(record_id, (None,))[0] == stamp:
                    del self._pending[record_id]

    def _persist_forever(self) -> None:
        while True:
            time.sleep(0.2)
            self._persist(time.monotonic() - self.delay)

    def flush(self) -> None:
        self._persist(float("inf"))


Records = DiskRecords | MemoryRecords | DelayedRecords | FlawedRecords


class RecordsServer(ThreadingHTTPServer):
    """The listening server; carries what every request handler needs."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        *,
        records: Records,
        health_body: bytes,
        max_body: int,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.records = records
        self.health_body = health_body
        self.max_body = max_body
        self.headers = headers
        super().__init__(address, RecordsHandler)


class RedirectServer(ThreadingHTTPServer):
    """Plain HTTP answering every request with a permanent redirect to https."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, server_name: str) -> None:
        self.server_name_for_redirect = server_name
        super().__init__(address, RedirectHandler)


class RedirectHandler(BaseHTTPRequestHandler):
    """301 to `https://NAME/the same path`."""

    protocol_version = "HTTP/1.1"
    server: RedirectServer

    def _redirect(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(301)
        self.send_header("Location", f"https://{self.server.server_name_for_redirect}{self.path}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _redirect

    def log_message(self, format: str, *args: object) -> None:
        return None


class RecordsHandler(BaseHTTPRequestHandler):
    """One connection; HTTP/1.1 with keep-alive, every answer has a Content-Length."""

    protocol_version = "HTTP/1.1"
    server_version = "builder-app/1"
    server: RecordsServer

    def _answer(
        self,
        status: int,
        body: bytes = b"",
        *,
        send_body: bool = True,
        content_type: str = "text/plain",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in self.server.headers:
            self.send_header(name, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def _record_id(self) -> str | None:
        path = urlsplit(self.path).path
        if not path.startswith(RECORDS_PREFIX):
            return None
        return path[len(RECORDS_PREFIX) :]

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.strip().isdigit():
            raise BadBody("a Content-Length is required")
        length = int(length_header)
        if length > self.server.max_body:
            raise BodyTooLarge
        body = self.rfile.read(length)
        if len(body) != length:
            raise BadBody("the body ended early")
        return body

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            size_line = self.rfile.readline(1024).split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise BadBody("bad chunk size") from None
            if size == 0:
                while self.rfile.readline(1024).strip():  # trailers, then the blank line
                    pass
                return b"".join(parts)
            total += size
            if total > self.server.max_body:
                raise BodyTooLarge
            chunk = self.rfile.read(size)
            if len(chunk) != size or self.rfile.readline(3).strip():
                raise BadBody("a chunk ended early")
            parts.append(chunk)

    def _get(self, *, send_body: bool) -> None:
        if urlsplit(self.path).path == "/health":
            self._answer(200, self.server.health_body, send_body=send_body)
            return
        record_id = self._record_id()
        if record_id is None:
            self._answer(404, b"not found\n", send_body=send_body)
        elif not valid_record_id(record_id):
            self._answer(400, b"bad record id\n", send_body=send_body)
        elif (body := self.server.records.get(record_id)) is None:
            self._answer(404, b"no such record\n", send_body=send_body)
        else:
            self._answer(200, body, send_body=send_body, content_type="application/octet-stream")

    def do_GET(self) -> None:
        self._get(send_body=True)

    def do_HEAD(self) -> None:
        self._get(send_body=False)

    def do_PUT(self) -> None:
        record_id = self._record_id()
        if record_id is None or not valid_record_id(record_id):
            # The body was not read: the connection cannot be reused.
            self.close_connection = True
            self._answer(404 if record_id is None else 400, b"bad record path\n")
            return
        try:
            body = self._read_body()
        except BodyTooLarge:
            self.close_connection = True
            self._answer(413, b"body too large\n")
            return
        except BadBody as exc:
            self.close_connection = True
            self._answer(400, f"{exc}\n".encode())
            return
        self.server.records.put(record_id, body)
        self._answer(204)

    def _not_allowed(self) -> None:
        self.close_connection = True
        self._answer(405, b"method not allowed\n")

    do_POST = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A records service (see the module doc).")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--bind", default="0.0.0.0")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--storage", help="directory holding one file per record")
    where.add_argument("--in-memory", action="store_true", help="keep records in memory only")
    parser.add_argument(
        "--durability",
        default="full",
        choices=["full", "no-fsync", "no-dirsync", "ack-before-write"],
    )
    parser.add_argument("--persist-delay", type=float, default=5.0)
    parser.add_argument("--health-body", default="ready")
    parser.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY)
    parser.add_argument("--flaw", choices=sorted(FLAWS))
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM chain)")
    parser.add_argument("--tls-key", help="the certificate's key (PEM)")
    parser.add_argument("--tls-min", choices=("1.0", "1.2"), default="1.2")
    parser.add_argument("--hsts", action="store_true", help="send Strict-Transport-Security")
    parser.add_argument("--plain-port", type=int, help="also listen for plain HTTP here")
    parser.add_argument("--plain-mode", choices=("redirect", "serve"), default="redirect")
    parser.add_argument("--server-name", default="localhost", help="the name redirects go to")
    return parser.parse_args(argv)


def tls_context(cert: str, key: str, minimum: str) -> ssl.SSLContext:
    """The server's TLS settings; `minimum` "1.0" deliberately accepts TLS 1.0 (a flaw)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if minimum == "1.0":
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
    else:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    inner: Records
    if args.in_memory:
        inner = MemoryRecords()
    elif args.durability == "ack-before-write":
        inner = DelayedRecords(DiskRecords(args.storage), args.persist_delay)
    else:
        inner = DiskRecords(args.storage, durability=args.durability)
    records: Records = FlawedRecords(inner, args.flaw) if args.flaw else inner
    if isinstance(inner, DelayedRecords):
        delayed = inner

        def stop(_signum: int, _frame: object) -> None:
            delayed.flush()  # a clean stop keeps every acknowledged record
            sys.exit(0)

        signal.signal(signal.SIGTERM, stop)
    headers = (("Strict-Transport-Security", "max-age=31536000"),) if args.hsts else ()
    server = RecordsServer(
        (args.bind, args.port),
        records=records,
        health_body=args.health_body.encode(),
        max_body=args.max_body,
        headers=headers,
    )
    if args.tls_cert:
        context = tls_context(args.tls_cert, args.tls_key, args.tls_min)
        # The handshake happens in the request's thread, not in accept().
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    if args.plain_port:
        plain: ThreadingHTTPServer
        if args.plain_mode == "redirect":
            plain = RedirectServer((args.bind, args.plain_port), server_name=args.server_name)
        else:
            plain = RecordsServer(
                (args.bind, args.plain_port),
                records=records,
                health_body=args.health_body.encode(),
                max_body=args.max_body,
            )
        threading.Thread(target=plain.serve_forever, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
