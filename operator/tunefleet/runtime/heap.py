"""What the operator does so that its resident memory follows the fleet down (bench/scale.md):
hand freed heap back to the system, and rebuild per-object tables that a burst grew.

A Python dict or set never shrinks: deleting entries leaves its table at the size it had at
its peak. After 10,000 profiles are deleted, each per-object map (profiles by key, by uid,
Jobs and pods by owner, where each object is kept, what is remembered of each profile) would
keep a table sized for 10,000 (~200-300 KB each, twice that for 20,000) for the life of the
process. `compacted` returns a copy sized for what is left when that is much smaller.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

# jemalloc's "every arena" index (MALLCTL_ARENAS_ALL) in "arena.<i>.purge".
_PURGE_ALL_ARENAS = b"arena.4096.purge"
# A table is rebuilt when a copy would take less than this share of its bytes.
_REBUILD_BELOW = 0.5

# Set when `compacted` rebuilt a table (thousands of entries just went): the next
# `release_memory` runs a full collection first. Python's free lists (tuples, lists, dicts,
# floats: thousands of objects) keep the last objects a deletion freed, scattered over the
# slabs the burst filled, and each keeps its slab; a full collection empties the free lists and
# takes the cycles the burst left in the oldest generation, which Python collects only once it
# has grown by a quarter.
_shrunk = False


def release_memory() -> None:
    """Give freed heap back to the system now: after a burst of thousands of events the
    resident size would stay at the burst's peak (glibc keeps it; jemalloc would in ~1 s,
    tunefleet/__main__.py). Under jemalloc (preloaded, so its mallctl is in the process's
    global symbols) its arenas are purged; otherwise glibc's malloc_trim. After a table was
    rebuilt, a full collection first: it holds the GIL (the webhook waits) for as long as it
    takes over what is left, ~80 ms over the ~140,000 objects the operator's modules alone make
    on this 2-core machine under load, once after a mass deletion, not at every pass (Python
    runs such collections of its own as objects accumulate)."""
    global _shrunk
    if _shrunk:
        _shrunk = False
        gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        mallctl = getattr(ctypes.CDLL(None), "mallctl", None)
        if mallctl is not None:
            mallctl(_PURGE_ALL_ARENAS, None, None, None, ctypes.c_size_t(0))
            return
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def compacted(table: dict[K, V]) -> dict[K, V]:
    """`table`, or a copy of it sized for its entries when that is under half its size (the
    caller swaps it in under the lock that guards the table). A copy of a dict of 10,000
    entries takes ~0.3 ms; this runs every housekeeping pass (30 s)."""
    if sys.getsizeof(table) < 4096:
        return table  # a small table: nothing worth a copy
    global _shrunk
    copy = dict(table)
    if sys.getsizeof(copy) < _REBUILD_BELOW * sys.getsizeof(table):
        _shrunk = True
        return copy
    return table
