"""The failure table: every failure_reason, whose fault it is, and how raw errors map to it.

One table (`REASONS`) names every reason a failed or referee_error attempt can carry:
the engine's generic rows, plus each workload's (`register_reasons`, e.g. the records
workload's `record_missing`). `classify_error` maps a raw error (from a probe, a fault or
the host) to one of them; the checks use the remaining reasons (`bad_status`,
`wrong_body`, a workload's, ...) for answers that arrived but were wrong.
`Observation.render` writes the `failure_detail`: step, phase, elapsed ms, status,
expected vs. received (sizes, sha256 prefixes and a short escaped preview, never whole
bodies), and a curl line that reproduces the request from inside the host. All of it
is pure (`register_reasons` apart, run at a workload's import).
"""

from __future__ import annotations

import asyncio
import hashlib
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

import h11

from opsarena.errors import (
    BootFailedError,
    HostBootError,
    HostDownError,
    HostError,
    HostFactsTooLargeError,
    HostNetworkRefusedError,
    HostNotFoundError,
    HostUnavailableError,
    PathMissingError,
    RegistryError,
    ServiceNotRestartedError,
    ServiceNotRunningError,
    ServiceRestartError,
    UnitMissingError,
)
from opsarena.referee.contract import REFEREE_ERROR, VERIFICATION_FAILED
from opsarena.referee.model import Challenge
from opsarena.referee.probe import (
    BodyTooLarge,
    ConnectionClosedEarly,
    HeadersTooLarge,
    Phase,
    ProbeError,
)

PREVIEW_BYTES = 16
"""At most this many leading bytes of a body appear (escaped) in a failure_detail."""


@dataclass(frozen=True)
class Reason:
    """One row of the failure table."""

    reason: str
    category: str
    meaning: str


def _row(reason: str, category: str, meaning: str) -> tuple[str, Reason]:
    return reason, Reason(reason, category, meaning)


_C, _R = VERIFICATION_FAILED, REFEREE_ERROR

REASONS: dict[str, Reason] = dict(
    [
        _row("connection_refused", _C, "nothing listens on the port"),
        _row("connection_reset", _C, "the server reset the connection"),
        _row("connection_closed", _C, "the server closed the connection before a full answer"),
        _row("timeout", _C, "no connection, or no complete answer, within the time limit"),
        _row("protocol_error", _C, "the answer is not valid HTTP/1.1"),
        _row("headers_too_large", _C, "the response headers are over the size limit"),
        _row("body_too_large", _C, "the response body is over the size limit"),
        _row("bad_status", _C, "an answer with a status the contract does not allow"),
        _row("wrong_body", _C, "GET /health answered 200 with a body other than `ready`"),
        _row("unit_missing", _C, "the systemd unit does not exist"),
        _row("service_not_running", _C, "the unit exists but has no running process"),
        _row("restart_failed", _C, "the unit had no new main process after a restart"),
        _row("not_restarted", _C, "the unit was not restarted by systemd after it crashed"),
        _row("not_ready_after_fault", _C, "the health check did not pass within the budget"),
        _row(
            "port_not_owned_by_unit",
            _C,
            "the port is held by a process outside the unit, or by one from before a restart",
        ),
        _row("host_down", _C, "the host stopped by itself (its init ran out of memory or exited)"),
        _row(
            "path_missing",
            _C,
            "a directory the challenge names is not a plain directory in the host (missing, "
            "behind a symlink, or holding a mount point)",
        ),
        _row(
            "boot_failed",
            _C,
            "the host's systemd answered but did not finish booting: emergency or rescue "
            "mode, or units still starting when the budget ran out",
        ),
        _row(
            "network_unreachable",
            _C,
            "the host's own network refused the connection before it reached the port (an "
            "interface down, a route or a firewall rule in the host)",
        ),
        _row("host_unavailable", _R, "the arena could not reach the host (podman failed)"),
        _row("reboot_unconfirmed", _R, "a reboot could not be confirmed within its bound"),
        _row("probe_error", _R, "the arena could not open a probe socket"),
        _row("internal_error", _R, "a bug in the referee or a check"),
    ]
)

"""The engine's generic rows; a workload adds its own (`register_reasons`)."""


def register_reasons(rows: Iterable[Reason]) -> dict[str, Reason]:
    """Add a workload's rows to `REASONS` (at its import) and return them by reason.
    Raises `RegistryError` when a reason is in the table already with another meaning
    or category."""
    added: dict[str, Reason] = {}
    for row in rows:
        existing = REASONS.get(row.reason)
        if existing is not None and existing != row:
            raise RegistryError(
                f"a failure reason named {row.reason!r} is registered already "
                f"({existing.category}: {existing.meaning})"
            )
        REASONS[row.reason] = added[row.reason] = row
    return added


def table_for(challenge: Challenge) -> dict[str, Reason]:
    """The failure table a challenge's verdicts are held to: `REASONS` plus the rows its
    `failure_reasons` adds (each the competitor's fault). Pure."""
    added = {
        reason: Reason(reason, VERIFICATION_FAILED, meaning)
        for reason, meaning in challenge.failure_reasons.items()
        if reason not in REASONS
    }
    return {**REASONS, **added}


def reason_problems(challenge: Challenge) -> list[str]:
    """One line per reason the challenge adds that the referee's table has already. Pure."""
    return [
        f"failure_reasons.{reason}: the referee's table has this reason already "
        f"({REASONS[reason].meaning})"
        for reason in challenge.failure_reasons
        if reason in REASONS
    ]


# Order matters: the first row whose type matches wins (subclasses before bases).
_ERROR_TABLE: tuple[tuple[type[BaseException], str], ...] = (
    (ConnectionRefusedError, "connection_refused"),
    (HostNetworkRefusedError, "network_unreachable"),
    (ConnectionResetError, "connection_reset"),
    (BrokenPipeError, "connection_reset"),
    (ConnectionAbortedError, "connection_reset"),
    (ConnectionClosedEarly, "connection_closed"),
    (asyncio.IncompleteReadError, "connection_closed"),
    (TimeoutError, "timeout"),
    (HeadersTooLarge, "headers_too_large"),
    (BodyTooLarge, "body_too_large"),
    (h11.RemoteProtocolError, "protocol_error"),
    (UnitMissingError, "unit_missing"),
    (ServiceNotRunningError, "service_not_running"),
    (ServiceNotRestartedError, "not_restarted"),
    (ServiceRestartError, "restart_failed"),
    (HostDownError, "host_down"),
    (PathMissingError, "path_missing"),
    (HostFactsTooLargeError, "port_not_owned_by_unit"),
    (HostUnavailableError, "host_unavailable"),
    (HostNotFoundError, "host_unavailable"),
    (BootFailedError, "boot_failed"),
    (HostBootError, "reboot_unconfirmed"),
    (HostError, "host_unavailable"),
    (OSError, "probe_error"),
)


def classify_error(error: BaseException) -> Reason:
    """The row of the failure table for a raw error. A `ProbeError` is classified by its
    cause; anything the table does not name is `internal_error` (ours)."""
    if isinstance(error, ProbeError):
        error = error.cause
    for kind, reason in _ERROR_TABLE:
        if isinstance(error, kind):
            return REASONS[reason]
    return REASONS["internal_error"]


def body_summary(data: bytes) -> str:
    """`N bytes sha256:PREFIX "preview"`: enough to compare two bodies, never the body."""
    digest = hashlib.sha256(data).hexdigest()[:12]
    preview = "".join(
        chr(byte) if 0x20 <= byte < 0x7F and byte not in (0x22, 0x5C) else f"\\x{byte:02x}"
        for byte in data[:PREVIEW_BYTES]
    )
    more = "..." if len(data) > PREVIEW_BYTES else ""
    return f'{len(data)} bytes sha256:{digest} "{preview}{more}"'


BODY_FILE = "/tmp/opsarena-body.bin"
"""Where a reproducing curl line puts a binary request body (and `GOT_FILE` a response)."""
GOT_FILE = "/tmp/opsarena-got.bin"
HEX_BODY_MAX = 1024
"""A binary PUT body up to this size is spelled out (hex) in the curl line; a larger one
is replaced by random bytes of the same size."""


def curl_line(
    method: str, port: int, target: str, *, body: bytes | None = None, save: bool = False
) -> str:
    """A shell line that repeats the request from inside the host and prints the status
    line, headers and body (`-i`). A PUT body over 256 bytes or not printable ASCII is
    written to a file first (`BODY_FILE`: the exact bytes up to `HEX_BODY_MAX`, else the
    same number of random bytes) and sent with `--data-binary @FILE`. With `save`, a
    GET's body goes to `GOT_FILE` and its size and sha256 are printed instead."""
    url = f"http://127.0.0.1:{port}{target}"
    parts = ["curl", "-sS", "-i", "--max-time", "5"]
    prefix = ""
    if method == "PUT":
        data = body or b""
        shown = len(data) <= 256 and all(0x20 <= byte < 0x7F for byte in data)
        if shown:
            parts += ["-X", "PUT", "--data-binary", data.decode("ascii")]
        else:
            if len(data) <= HEX_BODY_MAX:
                maker = (
                    "python3 -c 'import sys; sys.stdout.buffer.write(bytes.fromhex(sys.argv[1]))' "
                    f"{data.hex()} > {BODY_FILE}"
                )
            else:
                maker = f"head -c {len(data)} /dev/urandom > {BODY_FILE}"
            prefix = maker + " && "
            parts += ["-X", "PUT", "--data-binary", f"@{BODY_FILE}"]
    elif method != "GET":
        parts += ["-X", method]
    if save and method == "GET":
        parts = ["curl", "-sS", "--max-time", "5", "-o", GOT_FILE]
        parts += ["-w", "%{http_code} %{size_download}\\n", url]
        return " ".join(shlex.quote(p) for p in parts) + f" && sha256sum {GOT_FILE}"
    parts.append(url)
    return prefix + " ".join(shlex.quote(p) for p in parts)


@dataclass(frozen=True)
class Observation:
    """What the referee saw at the step that decided a failure; `render()` is the
    failure_detail."""

    step: str
    elapsed_ms: int
    phase: Phase | None = None
    status: int | None = None
    expected: str | None = None
    received: str | None = None
    error: str | None = None
    reproduce: str | None = None

    def render(self) -> str:
        facts = []
        if self.phase is not None:
            facts.append(f"phase {self.phase}")
        facts.append(f"{self.elapsed_ms} ms")
        if self.status is not None:
            facts.append(f"status {self.status}")
        text = f"{self.step} ({', '.join(facts)})"
        if self.error:
            text += f": {self.error}"
        if self.expected is not None:
            text += f"; expected {self.expected}"
        if self.received is not None:
            text += f"; received {self.received}"
        if self.reproduce:
            text += f"; reproduce inside the host: {self.reproduce}"
        return text


def describe_error(error: BaseException) -> str:
    """A short, one-line description of a raw error (its type and message)."""
    cause = error.cause if isinstance(error, ProbeError) else error
    message = " ".join(str(cause).split())
    if isinstance(cause, TimeoutError) and not message:
        message = "timed out"
    if len(message) > 300:
        message = message[:300] + "..."
    return f"{type(cause).__name__}: {message}" if message else type(cause).__name__
