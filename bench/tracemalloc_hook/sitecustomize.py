"""Loaded by the operator process only when `python -m bench scale --tracemalloc DIR` starts
it (PYTHONPATH=bench/tracemalloc_hook, PYTHONTRACEMALLOC set): SIGUSR2 dumps a tracemalloc
snapshot to the path the bench wrote into $TUNEFLEET_BENCH_SNAPSHOT. Never part of a release."""

import os
import signal
import tracemalloc


def _dump(signum: int, frame: object) -> None:
    pointer = os.environ.get("TUNEFLEET_BENCH_SNAPSHOT", "")
    if not pointer or not tracemalloc.is_tracing():
        return
    with open(pointer) as f:
        target = f.read().strip()
    tracemalloc.take_snapshot().dump(target + ".tmp")
    os.replace(target + ".tmp", target)


signal.signal(signal.SIGUSR2, _dump)
