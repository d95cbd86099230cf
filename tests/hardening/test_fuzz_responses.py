"""Fuzzing the referee with response bytes, replayed by a server inside a real host.

Hypothesis makes responses (raw bytes, HTTP-shaped ones with odd status lines, headers,
framing and bodies, and mutations of a correct answer); the host's replay server sends
each one back to the referee's health check. Whatever arrives, the check ends in a
verdict whose reason is a competitor's row of the failure table (or passes, when the
bytes happen to be a correct answer), within its timeouts, and never raises.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsarena.challenges import Challenge, builtin_challenge
from opsarena.hosts import Host
from opsarena.referee.failures import REASONS
from tests.conftest import SharedHosts
from tests.hardening.hostile import (
    REPLAY_PORT,
    STAGE_PORT,
    on_port,
    run_check,
    stage,
    start_hostile_server,
)

FUZZ_EXAMPLES = int(os.environ.get("OPSARENA_FUZZ_EXAMPLES", "1000"))
READ_TIMEOUT_S = 1.0
SLACK_S = 1.5

pytestmark = pytest.mark.hosts

CORRECT = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nready"

status_lines = st.one_of(
    st.builds(
        lambda version, status, reason: b"%s %s %s" % (version, status, reason),
        st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"HTTP/1.1 ", b"http/1.1", b"ICY"]),
        st.one_of(
            st.sampled_from([b"200", b"100", b"101", b"204", b"302", b"304", b"404", b"999"]),
            st.integers(-5, 100000).map(lambda n: str(n).encode()),
        ),
        st.one_of(st.just(b"OK"), st.binary(max_size=20)),
    ),
    st.binary(max_size=40),
)
header_lines = st.lists(
    st.one_of(
        st.integers(-(2**70), 2**70).map(lambda n: b"Content-Length: %d" % n),
        st.sampled_from(
            [
                b"Content-Length: 5",
                b"Content-Length: 5, 5",
                b"Content-Length: abc",
                b"Transfer-Encoding: chunked",
                b"Transfer-Encoding: gzip",
                b"Transfer-Encoding: chunked, chunked",
                b"Connection: close",
                b"Connection: keep-alive",
                b" folded: continuation",
                b"No-Colon",
                b"X: \x00\xff",
            ]
        ),
        st.builds(
            lambda n, v: n + b": " + v, st.binary(min_size=1, max_size=12), st.binary(max_size=30)
        ),
    ),
    max_size=6,
)
bodies = st.one_of(
    st.just(b"ready"),
    st.binary(max_size=200),
    st.lists(
        st.tuples(
            st.sampled_from([b"5", b"0", b"ff", b"-1", b"zz", b"5;ext=1", b""]),
            st.binary(max_size=8),
        ),
        max_size=4,
    ).map(lambda chunks: b"".join(size + b"\r\n" + data + b"\r\n" for size, data in chunks)),
)
shaped = st.builds(
    lambda status, headers, sep, body: status + b"\r\n" + b"\r\n".join(headers) + sep + body,
    status_lines,
    header_lines,
    st.sampled_from([b"\r\n\r\n", b"\n\n", b"\r\n", b""]),
    bodies,
)
mutated = st.builds(
    lambda at, byte, cut: (CORRECT[:at] + bytes([byte]) + CORRECT[at + 1 :])[:cut],
    st.integers(0, len(CORRECT) - 1),
    st.integers(0, 255),
    st.integers(0, len(CORRECT)),
)
framed = st.builds(
    lambda status, body, lie, extra: (
        b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n%s"
        % (status, max(0, len(body) + lie), extra, body)
    ),
    st.sampled_from([200, 200, 200, 201, 204, 301, 404, 500]),
    st.one_of(
        st.sampled_from([b"ready", b"ready\n", b" ready ", b"READY", b""]), st.binary(max_size=50)
    ),
    st.sampled_from([0, 0, 0, -1, 1, 100]),
    st.sampled_from([b"", b"Connection: close\r\n", b"X-A: b\r\n"]),
)
responses = st.one_of(st.binary(max_size=300), shaped, mutated, framed)


@pytest.fixture(scope="module")
async def replay_host(shared_hosts: SharedHosts) -> AsyncIterator[Host]:
    host = await shared_hosts("fuzz")
    await start_hostile_server(host, {"stage": STAGE_PORT, "replay": REPLAY_PORT})
    yield host


async def test_no_response_bytes_crash_the_referee_or_escape_the_table(replay_host: Host) -> None:
    base = builtin_challenge("durable-records")
    first = base.milestones[0].model_copy(update={"read_timeout_s": READ_TIMEOUT_S})
    challenge: Challenge = on_port(base, REPLAY_PORT).model_copy(
        update={"milestones": [first, *base.milestones[1:]]}
    )
    bound = first.connect_timeout_s + READ_TIMEOUT_S + SLACK_S
    seen: dict[str, int] = {}

    async def one(data: bytes) -> None:
        await stage(replay_host, data)
        started = time.monotonic()
        verdict = await run_check(replay_host, challenge, first.id)
        elapsed = time.monotonic() - started
        assert elapsed < bound, (data, elapsed)
        key = verdict.failure_reason or "passed"
        seen[key] = seen.get(key, 0) + 1
        if verdict.outcome == "passed":
            return
        assert verdict.outcome == "failed", (data, verdict)
        row = REASONS[verdict.failure_reason or ""]
        assert row.category == verdict.failure_category == "verification_failed", (data, verdict)

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(responses)
    def fuzz(data: bytes) -> None:
        asyncio.run(one(data))

    await asyncio.to_thread(fuzz)
    print(f"fuzz: {sum(seen.values())} examples, outcomes {dict(sorted(seen.items()))}")
    assert sum(seen.values()) >= FUZZ_EXAMPLES
    assert {"passed", "protocol_error", "connection_closed", "bad_status", "wrong_body"} <= set(
        seen
    )
