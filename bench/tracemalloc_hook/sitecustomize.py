"""Loaded by the operator process only when `python -m bench scale --tracemalloc DIR` (or
`--malloc-info DIR`) starts it (PYTHONPATH=bench/tracemalloc_hook): SIGUSR2 writes, at the path
the bench wrote into $TUNEFLEET_BENCH_SNAPSHOT, a tracemalloc snapshot when tracing, and beside
it glibc's malloc_info (per arena: what the heap holds from the system, what is free in it)
(or jemalloc's totals), the largest containers alive, and the process's smaps, where Python's view ends: what the allocator keeps that no Python
object holds. Never part of a release."""

import ctypes
import gc
import json
import os
import shutil
import signal
import sys
import tracemalloc

_JEMALLOC_STATS = ("allocated", "active", "metadata", "resident", "mapped", "retained")


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


def _jemalloc_stats(path: str) -> None:
    """jemalloc's own totals (bytes): allocated is what live objects hold, resident what the
    process keeps; the difference is fragmentation and caches. Nothing under glibc."""
    mallctl = getattr(ctypes.CDLL(None), "mallctl", None)
    if mallctl is None:
        return
    epoch, size = ctypes.c_uint64(1), ctypes.c_size_t(8)
    mallctl(b"epoch", None, None, ctypes.byref(epoch), size)
    out = {}
    for name in _JEMALLOC_STATS:
        value, length = ctypes.c_size_t(0), ctypes.c_size_t(8)
        mallctl(f"stats.{name}".encode(), ctypes.byref(value), ctypes.byref(length), None, 0)
        out[name] = value.value
    with open(path, "w") as f:
        json.dump(out, f)
    # And everything jemalloc reports (per size class: regions live, slabs held, utilisation;
    # metadata by kind), as JSON: which size classes a deletion leaves half-held.
    printer = getattr(ctypes.CDLL(None), "malloc_stats_print", None)
    if printer is None:
        return
    chunks: list[bytes] = []
    write = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)(
        lambda _opaque, text: chunks.append(text)
    )
    printer(write, None, b"J")
    with open(path.replace(".json", ".stats.json"), "wb") as f:
        f.write(b"".join(chunks))


def _containers(path: str) -> None:
    """The largest dicts, sets and lists alive (a table a burst grew and nothing shrank), and
    the count of tracked objects by type."""
    objs = gc.get_objects()
    counts: dict[str, int] = {}
    big = []
    for o in objs:
        name = type(o).__name__
        counts[name] = counts.get(name, 0) + 1
        if isinstance(o, (dict, set, list)):
            size = sys.getsizeof(o)
            if size >= 65536:
                keys = list(o)[:3] if not isinstance(o, list) else o[:3]
                big.append((size, name, len(o), repr(keys)[:200]))
    big.sort(reverse=True)
    with open(path, "w") as f:
        json.dump(
            {"largest": big[:40], "by_type": sorted(counts.items(), key=lambda kv: -kv[1])[:40]},
            f,
            indent=1,
        )
    del objs


def _dump(signum: int, frame: object) -> None:
    pointer = os.environ.get("TUNEFLEET_BENCH_SNAPSHOT", "")
    if not pointer:
        return
    with open(pointer) as f:
        target = f.read().strip()
    _malloc_info(target + ".malloc.xml")
    _jemalloc_stats(target + ".jemalloc.json")
    _containers(target + ".containers.json")
    shutil.copyfile("/proc/self/smaps", target + ".smaps")
    if tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(target + ".tmp")
    else:
        with open(target + ".tmp", "w") as f:
            f.write("no tracemalloc: see .malloc.xml and .smaps\n")
    os.replace(target + ".tmp", target)


signal.signal(signal.SIGUSR2, _dump)
