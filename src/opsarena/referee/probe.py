"""HTTP/1.1 probes into a host, over `Host.connect` and h11, under strict limits.

One request per connection (`Connection: close`). Every step is bounded: opening the
connection by `connect_timeout_s`, sending the request and reading the whole response by
`read_timeout_s` (one deadline for both, so a server that drips bytes cannot hold the
referee). A header block over `max_header_bytes` or a body over `max_body_bytes` stops
the read at once. Nothing here decides a verdict: failures are raised as `ProbeError`,
carrying the phase and the raw cause, for the failure table to classify.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import h11

from opsarena.hosts import Host

Phase = Literal["connect", "send", "receive"]
READ_CHUNK = 64 * 1024


@dataclass(frozen=True)
class ProbeLimits:
    """The bounds of one probe (see the module docstring)."""

    connect_timeout_s: float = 2.0
    read_timeout_s: float = 5.0
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 2 * 1024 * 1024


@dataclass(frozen=True)
class HttpResponse:
    """A complete response: status, body, how long the request took, and its headers
    (names lowercased, in order)."""

    status: int
    body: bytes
    elapsed_ms: int
    headers: tuple[tuple[str, str], ...] = ()

    def header(self, name: str) -> str | None:
        """The first header called `name` (any case), or None."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key == wanted), None)


class HeadersTooLarge(Exception):
    """The response's header block was longer than the limit."""


class BodyTooLarge(Exception):
    """The response's body was longer than the limit (reading stopped there)."""

    def __init__(self, message: str, received: int) -> None:
        super().__init__(message)
        self.received = received


class ConnectionClosedEarly(Exception):
    """The server closed the connection before the response was complete."""


class ProbeError(Exception):
    """A probe did not get a complete response. `cause` is the raw error, `phase` where
    it happened, `elapsed_ms` how long the probe had run, `status` the response status
    when one had arrived."""

    def __init__(
        self, phase: Phase, cause: BaseException, elapsed_ms: int, status: int | None = None
    ) -> None:
        super().__init__(f"{phase}: {type(cause).__name__}: {cause}")
        self.phase: Phase = phase
        self.cause = cause
        self.elapsed_ms = elapsed_ms
        self.status = status


async def http_request(
    host: Host,
    port: int,
    method: str,
    target: str,
    *,
    body: bytes = b"",
    limits: ProbeLimits = ProbeLimits(),
) -> HttpResponse:
    """Send one request to 127.0.0.1:`port` in `host` and return the complete response.

    Raises `ProbeError` for anything that kept a complete response from arriving
    (refused, reset, timed out, malformed, too large, closed early). Host errors
    (`HostUnavailableError`, ...) from `Host.connect` are raised unchanged: they are
    the arena's, not the server's.
    """
    started = time.monotonic()

    def elapsed() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        reader, writer = await host.connect(port, timeout=limits.connect_timeout_s)
    except (TimeoutError, OSError) as exc:  # refused, timed out, unreachable
        raise ProbeError("connect", exc, elapsed()) from exc
    phase: Phase = "send"
    status: int | None = None
    got: tuple[tuple[str, str], ...] = ()
    try:
        async with asyncio.timeout(limits.read_timeout_s):
            conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=limits.max_header_bytes)
            headers = [
                ("Host", f"127.0.0.1:{port}"),
                ("User-Agent", "opsarena-referee"),
                ("Connection", "close"),
            ]
            if method in ("PUT", "POST") or body:
                headers.append(("Content-Length", str(len(body))))
            data = conn.send(h11.Request(method=method, target=target, headers=headers))
            if body:
                data += conn.send(h11.Data(data=body))
            data += conn.send(h11.EndOfMessage())
            writer.write(data)
            await writer.drain()
            phase = "receive"
            received_before_response = 0
            eof = False
            chunks: list[bytes] = []
            size = 0
            while True:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError as exc:
                    if status is None and received_before_response > limits.max_header_bytes:
                        raise HeadersTooLarge(
                            f"header block over {limits.max_header_bytes} bytes"
                        ) from exc
                    if eof:
                        raise ConnectionClosedEarly(
                            "the server closed the connection before the response was complete"
                        ) from exc
                    raise
                if event is h11.NEED_DATA:
                    chunk = await reader.read(READ_CHUNK)
                    eof = not chunk
                    if status is None:
                        received_before_response += len(chunk)
                    conn.receive_data(chunk)
                    continue
                if isinstance(event, h11.InformationalResponse):
                    continue
                if isinstance(event, h11.Response):
                    status = event.status_code
                    got = tuple(
                        (k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in event.headers
                    )
                    # h11 only bounds a header block that arrives in pieces; one that
                    # arrives whole is measured here.
                    header_bytes = (
                        len(event.reason)
                        + 15
                        + sum(len(name) + len(value) + 4 for name, value in event.headers)
                    )
                    if header_bytes > limits.max_header_bytes:
                        raise HeadersTooLarge(
                            f"header block of {header_bytes} bytes is over "
                            f"{limits.max_header_bytes}"
                        )
                    declared = _content_length(event.headers)
                    if declared is not None and declared > limits.max_body_bytes:
                        raise BodyTooLarge(
                            f"Content-Length {declared} is over {limits.max_body_bytes} bytes",
                            0,
                        )
                    continue
                if isinstance(event, h11.Data):
                    size += len(event.data)
                    if size > limits.max_body_bytes:
                        raise BodyTooLarge(f"body over {limits.max_body_bytes} bytes", size)
                    chunks.append(bytes(event.data))
                    continue
                if isinstance(event, h11.EndOfMessage):
                    assert status is not None
                    return HttpResponse(
                        status=status, body=b"".join(chunks), elapsed_ms=elapsed(), headers=got
                    )
                if isinstance(event, h11.ConnectionClosed):
                    raise ConnectionClosedEarly("connection closed before a response")
    except (
        TimeoutError,
        OSError,
        h11.RemoteProtocolError,
        HeadersTooLarge,
        BodyTooLarge,
        ConnectionClosedEarly,
    ) as exc:
        raise ProbeError(phase, exc, elapsed(), status) from exc
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await writer.wait_closed()


def _content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
