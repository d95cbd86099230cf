"""The failure table, case by case: every raw error to its reason, every reason documented."""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path

import h11
import pytest

from opsarena.challenges import Verdict
from opsarena.errors import (
    BootFailedError,
    HostBootError,
    HostDownError,
    HostError,
    HostFileError,
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
from opsarena.referee.checks import judge_health
from opsarena.referee.failures import (
    REASONS,
    Observation,
    Reason,
    body_summary,
    classify_error,
    curl_line,
    describe_error,
    register_reasons,
)
from opsarena.referee.probe import (
    BodyTooLarge,
    ConnectionClosedEarly,
    HeadersTooLarge,
    HttpResponse,
    ProbeError,
)
from opsarena.referee.referee import enforce_table
from opsarena.workloads.records.checks import judge_read

DOCS = Path(__file__).resolve().parents[2] / "docs" / "REFEREE.md"

CASES: list[tuple[BaseException, str, str]] = [
    (ConnectionRefusedError(111, "refused"), "connection_refused", "verification_failed"),
    (ConnectionResetError(104, "reset"), "connection_reset", "verification_failed"),
    (BrokenPipeError(32, "pipe"), "connection_reset", "verification_failed"),
    (ConnectionAbortedError(103, "aborted"), "connection_reset", "verification_failed"),
    (ConnectionClosedEarly("closed"), "connection_closed", "verification_failed"),
    (asyncio.IncompleteReadError(b"ab", 10), "connection_closed", "verification_failed"),
    (TimeoutError(), "timeout", "verification_failed"),
    (HeadersTooLarge("big"), "headers_too_large", "verification_failed"),
    (BodyTooLarge("big", 70000), "body_too_large", "verification_failed"),
    (h11.RemoteProtocolError("illegal status line"), "protocol_error", "verification_failed"),
    (UnitMissingError("no unit"), "unit_missing", "verification_failed"),
    (ServiceNotRunningError("inactive"), "service_not_running", "verification_failed"),
    (ServiceRestartError("no new pid"), "restart_failed", "verification_failed"),
    (ServiceNotRestartedError("not restarted"), "not_restarted", "verification_failed"),
    (HostUnavailableError("podman failed"), "host_unavailable", "referee_error"),
    (HostDownError("stopped by itself"), "host_down", "verification_failed"),
    (HostNotFoundError("gone"), "host_unavailable", "referee_error"),
    (HostBootError("not ready"), "reboot_unconfirmed", "referee_error"),
    (BootFailedError("maintenance"), "boot_failed", "verification_failed"),
    (PathMissingError("no such directory"), "path_missing", "verification_failed"),
    (HostNetworkRefusedError(101, "unreachable"), "network_unreachable", "verification_failed"),
    (HostFileError("odd"), "host_unavailable", "referee_error"),
    (HostError("other"), "host_unavailable", "referee_error"),
    (PermissionError(1, "setns"), "probe_error", "referee_error"),
    (OSError(99, "cannot assign"), "probe_error", "referee_error"),
    (ValueError("a bug"), "internal_error", "referee_error"),
    (KeyError("a bug"), "internal_error", "referee_error"),
]


@pytest.mark.parametrize(("error", "reason", "category"), CASES, ids=lambda v: str(v)[:30])
def test_each_raw_error_maps_to_its_reason(
    error: BaseException, reason: str, category: str
) -> None:
    row = classify_error(error)
    assert (row.reason, row.category) == (reason, category)
    wrapped = ProbeError("receive", error, 12)
    assert classify_error(wrapped) == row


def test_every_reason_is_reachable_or_used_by_a_check() -> None:
    from_errors = {reason for _, reason, _ in CASES}
    from_checks = {"bad_status", "wrong_body", "record_missing", "record_corrupted"}
    from_checks |= {"not_ready_after_fault", "wrong_record", "stale_value", "found_unwritten"}
    from_checks |= {"port_not_owned_by_unit"}
    assert set(REASONS) == from_errors | from_checks


def test_every_reason_is_documented_with_an_example_detail() -> None:
    text = DOCS.read_text()
    for reason, row in REASONS.items():
        heading = re.search(rf"^### `{reason}` \(({row.category})\)$", text, re.MULTILINE)
        assert heading, f"docs/REFEREE.md lacks a '### `{reason}` ({row.category})' section"
        section = text[heading.end() :].split("\n### ", 1)[0]
        assert "Example detail:" in section, reason


def test_body_summary_never_shows_a_whole_large_body() -> None:
    body = b"A" * 100_000
    summary = body_summary(body)
    assert summary.startswith("100000 bytes sha256:")
    assert len(summary) < 80
    assert body_summary(b"ok") == '2 bytes sha256:2689367b205c "ok"'
    assert "\\x00" in body_summary(b"\x00\xffabc")


def test_curl_line_reproduces_the_request() -> None:
    assert (
        curl_line("GET", 8080, "/health") == "curl -sS -i --max-time 5 http://127.0.0.1:8080/health"
    )
    put = curl_line("PUT", 8080, "/records/record-1", body=b"opaque-1")
    assert put.endswith("-X PUT --data-binary opaque-1 http://127.0.0.1:8080/records/record-1")
    binary = curl_line("PUT", 8080, "/records/r", body=b"\x00\r\n\xff")
    assert binary.startswith("python3 -c ")
    assert "0000d0aff > /tmp/opsarena-body.bin && curl " not in binary  # exact hex below
    assert " 000d0aff > /tmp/opsarena-body.bin && curl " in binary
    assert binary.endswith("--data-binary @/tmp/opsarena-body.bin http://127.0.0.1:8080/records/r")
    large = curl_line("PUT", 8080, "/records/r", body=b"\x01" * 2_000_000)
    assert large.startswith("head -c 2000000 /dev/urandom > /tmp/opsarena-body.bin && curl ")
    saved = curl_line("GET", 8080, "/records/r", save=True)
    assert "-o /tmp/opsarena-got.bin" in saved and saved.endswith("sha256sum /tmp/opsarena-got.bin")


def test_observation_renders_every_fact() -> None:
    text = Observation(
        step="after the restart, GET /records/record-1", elapsed_ms=7, phase="receive",
        status=404, expected="status 200 with 5 bytes", received="status 404 with 0 bytes",
        reproduce="curl -sS -i http://127.0.0.1:8080/records/record-1",
    ).render()  # fmt: skip
    assert text == (
        "after the restart, GET /records/record-1 (phase receive, 7 ms, status 404); "
        "expected status 200 with 5 bytes; received status 404 with 0 bytes; "
        "reproduce inside the host: curl -sS -i http://127.0.0.1:8080/records/record-1"
    )


def test_describe_error_is_one_bounded_line() -> None:
    assert describe_error(TimeoutError()) == "TimeoutError: timed out"
    long = describe_error(ValueError("x\n" * 1000))
    assert "\n" not in long and len(long) < 320


def response(status: int, body: bytes) -> HttpResponse:
    return HttpResponse(status=status, body=body, elapsed_ms=3)


def test_judge_health() -> None:
    assert judge_health(response(200, b"ready"), step="s", reproduce="r") is None
    assert judge_health(response(200, b"ready\n"), step="s", reproduce="r") is None
    wrong = judge_health(response(200, b"ok"), step="s", reproduce="r")
    assert wrong is not None and wrong.failure_reason == "wrong_body"
    status = judge_health(response(503, b"ready"), step="s", reproduce="r")
    assert status is not None and status.failure_reason == "bad_status"
    assert "status 503" in (status.failure_detail or "")


def test_judge_read() -> None:
    value = b"opaque-0123"
    assert judge_read(response(200, value), value, step="s", reproduce="r") is None
    cases = [(404, b"", "record_missing"), (200, b"opaque-0124", "record_corrupted"),
             (200, value + b"\n", "record_corrupted"), (500, value, "bad_status")]  # fmt: skip
    for status, body, reason in cases:
        verdict = judge_read(response(status, body), value, step="s", reproduce="r")
        assert verdict is not None and verdict.outcome == "failed"
        assert verdict.failure_reason == reason


def test_judge_read_names_stale_wrong_and_the_first_difference() -> None:
    value, old, other = b"new-value", b"old-value", b"someone-else"
    stale = judge_read(response(200, old), value, step="s", reproduce="r", older=[old])
    assert stale is not None and stale.failure_reason == "stale_value"
    owner = {hashlib.sha256(other).hexdigest(): "record-00ff"}
    wrong = judge_read(response(200, other), value, step="s", reproduce="r", others=owner)
    assert wrong is not None and wrong.failure_reason == "wrong_record"
    assert "the value stored under record-00ff" in (wrong.failure_detail or "")
    cut = judge_read(response(200, value[:4]), value, step="s", reproduce="r")
    assert cut is not None and "first difference at byte 4" in (cut.failure_detail or "")
    either = judge_read(response(200, b"b"), b"a", step="s", reproduce="r", also=[b"b"])
    assert either is None


def test_enforce_table_keeps_verdicts_honest() -> None:
    ok = Verdict.failed("record_missing", "d")
    assert enforce_table(ok) is ok
    assert enforce_table(Verdict.passed({"health": "ready"})).outcome == "passed"
    unknown = enforce_table(Verdict.failed("made_up", "d"))
    assert (unknown.outcome, unknown.failure_reason) == ("referee_error", "internal_error")
    # A check may not blame the competitor for the arena's failure, nor the reverse.
    misfiled = enforce_table(Verdict.failed("host_unavailable", "d"))
    assert misfiled.outcome == "referee_error"
    reversed_ = enforce_table(Verdict.referee_error("record_missing", "d"))
    assert reversed_.failure_reason == "internal_error"


def test_a_workload_cannot_redefine_a_reason_of_the_table() -> None:
    with pytest.raises(RegistryError, match="record_missing"):
        register_reasons([Reason("record_missing", "verification_failed", "something else")])
    same = REASONS["record_missing"]
    assert register_reasons([same]) == {"record_missing": same}
    assert REASONS["record_missing"] is same
