"""What the browser tests share: Debian's chromium for Playwright, where screenshots go,
and a bounded wait for a condition a page or a process reaches."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("OPSARENA_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
WAIT_S = 120.0


def chromium() -> Path:
    """The chromium binary; skips the test without it (fails it in CI)."""
    if CHROMIUM.is_file():
        return CHROMIUM
    reason = f"chromium not found at {CHROMIUM} (apt install chromium, or set OPSARENA_CHROMIUM)"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def wait_for(condition: Callable[[], object], what: str, timeout: float = WAIT_S) -> None:
    """Poll `condition` until it is true; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
