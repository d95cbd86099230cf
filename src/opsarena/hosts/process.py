"""Running a local program with a timeout and capped output, for host drivers.

Past its output limit a program is either read on (its output thrown away) until it
ends, or, when the caller says how (`on_overflow`), ended: reading stops at the limit
(the program then blocks on its full pipe and costs nothing), `on_overflow` ends it,
and what it had still buffered is read away, at most `AFTER_OVERFLOW` bytes a stream
(past that the program's process group is killed). An output flood then costs the
arena one limit's worth of reading, not a core for as long as the flood lasts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024
_FEED_CHUNK = 1024 * 1024
AFTER_OVERFLOW = 4 * 1024 * 1024
"""Bytes a stream may still give once `on_overflow` has ended its program (what pipes
and podman held buffered); more, and the program's process group is killed."""


@dataclass(frozen=True)
class ProcessResult:
    """What a local program did. `returncode` is None when it was killed at its timeout."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    duration_ms: int

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


class _Overflow:
    """Ends a program once, on the first stream that passes its limit."""

    def __init__(self, pid: int, end: Callable[[], Awaitable[None]]) -> None:
        self.pid = pid
        self._end = end
        self._ending: asyncio.Task[None] | None = None

    async def end(self) -> None:
        if self._ending is None:
            self._ending = asyncio.ensure_future(self._run())
        await asyncio.shield(self._ending)

    async def _run(self) -> None:
        try:
            await self._end()
        except Exception:  # it could not be ended where it runs: end it here
            log.warning("cannot end a program past its output limit", exc_info=True)
            self.kill()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)


async def _read_capped(
    stream: asyncio.StreamReader, limit: int, overflow: _Overflow | None = None
) -> tuple[bytes, bool]:
    kept = bytearray()
    truncated = False
    past = 0
    while chunk := await stream.read(_CHUNK):
        room = limit - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) <= room:
            continue
        truncated = True
        if overflow is None:
            continue  # keep draining so the program never blocks on a full pipe
        if not past:
            await overflow.end()  # not reading meanwhile: the program blocks
        past += len(chunk) - max(room, 0)
        if past > AFTER_OVERFLOW:
            overflow.kill()
            break
    return bytes(kept), truncated


def _abandon(readers: asyncio.Future[Any]) -> None:
    """Cancel the readers nobody will await any more, and consume their outcome when it
    comes (else asyncio prints "exception was never retrieved" for the cancellation)."""
    readers.cancel()
    readers.add_done_callback(lambda done: done.cancelled() or done.exception())


async def run_process(
    argv: list[str],
    *,
    timeout: float,
    input: bytes | None = None,
    output_limit: int = 1024 * 1024,
    kill_grace: float = 2.0,
    on_overflow: Callable[[], Awaitable[None]] | None = None,
) -> ProcessResult:
    """Run `argv`, feed it `input`, and keep at most `output_limit` bytes per stream.

    When a stream passes `output_limit` and `on_overflow` is given, reading stops and
    `await on_overflow()` must end the program (what `argv` started, wherever it runs);
    if it raises, the program's process group is killed. Without it, the rest of the
    output is read and thrown away while the program runs on.

    After `timeout` seconds the program's whole process group gets SIGKILL and the
    result has `returncode` None; output read until then is kept. Raises
    `FileNotFoundError` when the program does not exist.
    """
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    overflow = None if on_overflow is None else _Overflow(proc.pid, on_overflow)
    readers = asyncio.gather(
        _read_capped(proc.stdout, output_limit, overflow),
        _read_capped(proc.stderr, output_limit, overflow),
    )

    async def feed() -> None:
        if proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            # In chunks, each drained before the next: the pipe's transport never
            # copies more than one chunk of `input` (a 100 MiB file stays one copy).
            view = memoryview(input or b"")
            for start in range(0, len(view), _FEED_CHUNK):
                proc.stdin.write(view[start : start + _FEED_CHUNK])
                await proc.stdin.drain()
            proc.stdin.close()
            await proc.stdin.wait_closed()

    returncode: int | None
    try:
        async with asyncio.timeout(timeout):
            await feed()
            # Shielded: the timeout cancels this wait, not the readers, which still
            # hold what was read so far (a cancelled gather would raise CancelledError
            # out of the handler below instead of a timed-out result).
            (out, out_cut), (err, err_cut) = await asyncio.shield(readers)
            returncode = await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            async with asyncio.timeout(kill_grace):
                (out, out_cut), (err, err_cut) = await readers
        except TimeoutError:
            _abandon(readers)
            out, out_cut, err, err_cut = b"", True, b"", True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(kill_grace):
                await proc.wait()
        returncode = None
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _abandon(readers)
        raise
    return ProcessResult(
        returncode=returncode,
        stdout=out,
        stderr=err,
        truncated=out_cut or err_cut,
        duration_ms=int((time.monotonic() - started) * 1000),
    )
