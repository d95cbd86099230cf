"""The per-competitor cap on concurrent host operations: what an agent's `Host` handle is.

Every agent kind (scripted, command, llm, human) acts on its host only through the
handle the controller gives it in `AgentContext.host`; the controller wraps the real
host in a `ThrottledHost`. At most `limit` (default `DEFAULT_CONCURRENCY`) of the
competitor's execs, file transfers, restarts and reboots run at once; the next one
waits for a slot, inside this competitor's own queue, so a competitor that fires 16
execs at once only queues behind itself. Each also takes a token from the competitor's
bucket (`DEFAULT_RATE_PER_S` a second, bursts of `DEFAULT_BURST`): the concurrency cap
alone still let a storm of short execs run two podman processes without pause, about
one core of a two-core machine, and double a neighbour's time to durable. What the
arena reads for it (exec output, files) costs it more tokens, one per
`OUTPUT_BYTES_PER_OPERATION`. The referee
never uses this handle: its probes and faults are not counted against (nor slowed by)
the competitor's cap.

While the referee runs a fault milestone on the territory it holds the handle
(`held()`): operations that have not started wait until the attempt ends, including those
queued for a token or a slot before the hold was taken (the hold is checked again as the
last step before each one runs), so a competitor cannot restart its unit by hand during
a crash, or copy acknowledged records out and write them back after a power cut.
Operations already running go on (at most `limit` of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from opsarena.hosts import (
    DEFAULT_FILE_LIMIT,
    DEFAULT_OUTPUT_LIMIT,
    DiskUse,
    ExecResult,
    Host,
    Proc,
    ServiceRestart,
)

DEFAULT_CONCURRENCY = 2
"""Host operations one competitor may have in flight at once (see docs/AGENTS.md)."""
DEFAULT_RATE_PER_S = 2.0
"""Host operations one competitor may start per second, sustained (a token bucket)."""
DEFAULT_BURST = 20
"""Host operations one competitor may start at once after a quiet spell (the bucket's
size): a deployment's few dozen commands run at full speed."""
OUTPUT_BYTES_PER_OPERATION = 256 * 1024
"""What the arena reads of an exec's output (or of a file) costs the competitor one more
operation of its rate per this many bytes: an exec flooding its 1 MiB a stream costs 8,
so floods, which cost the controller their reading, come 9 times slower than short
commands (issue 23)."""


class TokenBucket:
    """`rate` tokens a second up to `burst`; `delay()` takes one and says how long to wait
    for it (0 when one was there). Pure: the clock is given."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs rate > 0 and burst >= 1, not {rate}/{burst}")
        self.rate, self.burst = rate, float(burst)
        self.tokens, self.at = float(burst), now

    def delay(self, now: float) -> float:
        """Take a token at `now` (possibly one still to come); seconds until it is there."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def charge(self, tokens: float, now: float) -> None:
        """Take `tokens` more at `now`; below empty, later operations wait for them."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= tokens


class ThrottledHost(Host):
    """`host`, with at most `limit` of its podman-bound operations in flight at once and
    at most `rate` started a second (bursts of `burst`). `in_flight` and `peak` say how
    many run now and at most so far, `waited_s` how long the rate limit held operations
    back, `held_back` how many wait now for a hold to lift (for tests and bench)."""

    def __init__(
        self,
        host: Host,
        limit: int = DEFAULT_CONCURRENCY,
        *,
        rate: float = DEFAULT_RATE_PER_S,
        burst: int = DEFAULT_BURST,
    ) -> None:
        if limit < 1:
            raise ValueError(f"a concurrency cap must be at least 1, not {limit}")
        self._bucket = TokenBucket(rate, burst, time.monotonic())
        self.waited_s = 0.0
        self.read_bytes = 0
        """Bytes of exec output and files read for the competitor (charged to its rate)."""
        self.inner = host
        self.name = host.name
        self.territory = host.territory
        self.match_id = host.match_id
        self.limit = limit
        self._slots = asyncio.Semaphore(limit)
        self._open = asyncio.Event()
        self._open.set()
        self._holds = 0
        self.held_back = 0
        self.in_flight = 0
        self.peak = 0

    @property
    def boots(self) -> int:
        return self.inner.boots

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """For the duration, every new operation through this handle waits."""
        self._holds += 1
        self._open.clear()
        try:
            yield
        finally:
            self._holds -= 1
            if self._holds == 0:
                self._open.set()

    async def _enter(self) -> None:
        await self._hold_lifted()
        # Each operation costs the machine a podman process (about 0.1-0.2 s of CPU):
        # however many a competitor fires, it gets `rate` a second, in its own queue.
        wait = self._bucket.delay(time.monotonic())
        if wait > 0:
            self.waited_s += wait
            await asyncio.sleep(wait)
        while True:
            await self._slots.acquire()
            # The last check before the operation runs, with no await after it: an
            # operation queued for a token or a slot before a hold was taken must not start
            # inside it (116 of one competitor's execs once ran in a referee's restart job).
            if self._open.is_set():
                break
            self._slots.release()
            await self._hold_lifted()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    async def _hold_lifted(self) -> None:
        self.held_back += 1
        try:
            while not self._open.is_set():
                await self._open.wait()
        finally:
            self.held_back -= 1

    def _leave(self) -> None:
        self.in_flight -= 1
        self._slots.release()

    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout: float,
        input: bytes | None = None,
        user: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        await self._enter()
        try:
            result = await self.inner.exec(
                cmd, timeout=timeout, input=input, user=user, output_limit=output_limit
            )
        finally:
            self._leave()
        self._read(len(result.stdout) + len(result.stderr))
        return result

    def _read(self, size: int) -> None:
        """Charge `size` bytes the arena read for the competitor to its rate."""
        self.read_bytes += size
        self._bucket.charge(size / OUTPUT_BYTES_PER_OPERATION, time.monotonic())

    async def read_file(self, path: str, *, limit: int = DEFAULT_FILE_LIMIT) -> bytes:
        await self._enter()
        try:
            data = await self.inner.read_file(path, limit=limit)
        finally:
            self._leave()
        self._read(len(data))
        return data

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await self._enter()
        try:
            await self.inner.write_file(path, data, mode=mode)
        finally:
            self._leave()

    async def restart_service(self, unit: str, *, timeout: float = 30.0) -> ServiceRestart:
        await self._enter()
        try:
            return await self.inner.restart_service(unit, timeout=timeout)
        finally:
            self._leave()

    @property
    def last_restart(self) -> ServiceRestart | None:
        return self.inner.last_restart

    @last_restart.setter
    def last_restart(self, value: ServiceRestart | None) -> None:
        self.inner.last_restart = value

    async def unit_members(self, unit: str) -> list[Proc]:
        return await self.inner.unit_members(unit)

    async def port_owners(self, port: int) -> list[Proc]:
        return await self.inner.port_owners(port)

    @property
    def init_process(self) -> Proc | None:
        return self.inner.init_process

    async def reboot(self, *, hard: bool = False, timeout: float = 60.0) -> None:
        await self._enter()
        try:
            await self.inner.reboot(hard=hard, timeout=timeout)
        finally:
            self._leave()

    async def wait_ready(self, timeout: float) -> str:
        return await self.inner.wait_ready(timeout)

    async def disk_use(self, *, within: float | None = None) -> DiskUse:
        return await self.inner.disk_use(within=within)

    async def freeze_disk(self) -> None:
        await self.inner.freeze_disk()

    async def connect(
        self, port: int, *, timeout: float = 5.0
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        await self._open.wait()
        return await self.inner.connect(port, timeout=timeout)
