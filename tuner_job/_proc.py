"""Ending a child process group: the tuner starts the user's workload and torch's tuning
workers in their own group, so what they spawn goes with them (stdlib only)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """TERM the group, then KILL it if it is still there after grace_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def end_group(pgid: int, grace_s: float = 5.0) -> bool:
    """End what is left of a process group whose leader has exited: TERM, then KILL after
    grace_s. Reaps members that became our children (in a container the tuner is PID 1, the
    reaper of orphans). True when something was left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(pgid)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    _reap(pgid)
    return True


def _reap(pgid: int) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
