"""Ending a child process group: the tuner starts the user's workload and torch's tuning
workers in their own group, so what they spawn goes with them (stdlib only)."""

from __future__ import annotations

import os
import signal
import subprocess


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
