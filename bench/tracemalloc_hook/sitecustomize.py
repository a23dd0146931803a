"""Loaded by the operator process only when `python -m bench scale --tracemalloc DIR` (or
`--malloc-info DIR`) starts it (PYTHONPATH=bench/tracemalloc_hook): SIGUSR2 writes, at the path
the bench wrote into $TUNEFLEET_BENCH_SNAPSHOT, a tracemalloc snapshot when tracing, and beside
it glibc's malloc_info (per arena: what the heap holds from the system, what is free in it)
and the process's smaps, where Python's view ends: what the allocator keeps that no Python
object holds. Never part of a release."""

import ctypes
import os
import shutil
import signal
import tracemalloc


def _malloc_info(path: str) -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    fp = libc.fopen(path.encode(), b"w")
    if fp:
        libc.malloc_info(0, fp)
        libc.fclose(fp)


def _dump(signum: int, frame: object) -> None:
    pointer = os.environ.get("TUNEFLEET_BENCH_SNAPSHOT", "")
    if not pointer:
        return
    with open(pointer) as f:
        target = f.read().strip()
    _malloc_info(target + ".malloc.xml")
    shutil.copyfile("/proc/self/smaps", target + ".smaps")
    if tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(target + ".tmp")
    else:
        with open(target + ".tmp", "w") as f:
            f.write("no tracemalloc: see .malloc.xml and .smaps\n")
    os.replace(target + ".tmp", target)


signal.signal(signal.SIGUSR2, _dump)
