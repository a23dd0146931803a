"""Polling with a deadline that fails with what was last seen, not just 'timed out'."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    probe: Callable[[], T],
    ok: Callable[[T], bool],
    what: str,
    timeout: float = 60.0,
    interval: float = 0.5,
) -> T:
    deadline = time.monotonic() + timeout
    last: T | None = None
    error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            error = None
            if ok(last):
                return last
        except Exception as e:
            error = e
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}"
        + (f"; last error: {error!r}" if error else "")
    )
