"""`eventually(probe, ok, what)`: the argument order the operator tests read best in.

A thin front to testbed.cluster.wait_for, which does the polling and the failure message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from testbed.cluster import wait_for

T = TypeVar("T")


def eventually(
    probe: Callable[[], T],
    ok: Callable[[T], object],
    what: str,
    timeout: float = 60.0,
    interval: float = 0.5,
) -> T:
    return wait_for(probe, timeout=timeout, interval=interval, describe=what, until=ok)
