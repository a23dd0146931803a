"""A rate-limited work queue for level-based reconciliation (client-go's workqueue, in short).

Watch events only *add* a key; a fixed set of worker threads takes keys and reconciles them.
What that buys over reconciling inside each event:

* a key is queued at most once, and never processed by two workers at a time: a burst of
  events for one profile (its Job, its pods, its own status write) becomes one reconcile;
* concurrency is bounded (workers <= the API client's connection pool), whatever the burst;
* failures back off per key, exponentially, to a cap, and success forgets the failures;
  nothing retries forever at a fixed short interval;
* two lanes: what a profile's own change asks (`urgent`: a new profile needs its Jobs) is
  taken before a refresh its children's events or the resync ask. In a burst of 10,000
  profiles the Jobs are not made behind status refreshes of the first ones, and a refresh
  that waits gathers every event of its pods meanwhile into one reconcile (one status write
  where each event would have made its own).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tunefleet.runtime.heap import compacted

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Backoff:
    """Per-key exponential backoff: base * 2**failures, capped."""

    base: float = 1.0
    cap: float = 300.0

    def delay(self, failures: int) -> float:
        return float(min(self.cap, self.base * 2.0 ** max(0, failures - 1)))


URGENT, REFRESH = 0, 1  # the lanes, taken in this order


@dataclass(order=True)
class _Delayed(Generic[K]):
    due: float
    seq: int
    key: K = field(compare=False)
    lane: int = field(compare=False, default=URGENT)


class WorkQueue(Generic[K]):
    def __init__(self, backoff: Backoff | None = None, clock: Callable[[], float] = time.monotonic):
        self.backoff = backoff or Backoff()
        self._clock = clock
        self._cond = threading.Condition()
        # FIFO of keys ready now, per lane. A key moved to the urgent lane leaves a stale
        # entry in the other, skipped when taken: _lane says where each queued key is.
        self._lanes: tuple[deque[K], deque[K]] = (deque(), deque())
        self._lane: dict[K, int] = {}
        self._processing: set[K] = set()
        self._dirty: dict[K, int] = {}  # added while processing (with its lane): requeued
        self._delayed: list[_Delayed[K]] = []
        self._due: dict[K, float] = {}  # earliest pending delayed add per key
        self._failures: dict[K, int] = {}
        self._seq = itertools.count()
        self._shut = False

    # --- adding ---------------------------------------------------------------------------

    def add(self, key: K, *, urgent: bool = True) -> None:
        with self._cond:
            self._add_locked(key, URGENT if urgent else REFRESH)

    def _add_locked(self, key: K, lane: int) -> None:
        if self._shut:
            return
        if key in self._processing:
            self._dirty[key] = min(lane, self._dirty.get(key, lane))
            return
        now = self._lane.get(key)
        if now is None or lane < now:
            self._lane[key] = lane
            self._lanes[lane].append(key)
            self._cond.notify()

    def add_after(self, key: K, delay: float, *, urgent: bool = True) -> None:
        """Add once `delay` seconds have passed; an earlier pending add for the key wins."""
        lane = URGENT if urgent else REFRESH
        if delay <= 0:
            with self._cond:
                self._add_locked(key, lane)
            return
        with self._cond:
            if self._shut:
                return
            due = self._clock() + delay
            if key in self._due and self._due[key] <= due:
                return
            self._due[key] = due
            heapq.heappush(self._delayed, _Delayed(due, next(self._seq), key, lane))
            self._cond.notify()

    def retry(self, key: K, at_least: float = 0.0) -> float:
        """Count a failure of `key` and add it again after its backoff; returns the delay."""
        with self._cond:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
        delay = max(at_least, self.backoff.delay(failures))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """The key succeeded (or gave up): its next failure starts the backoff afresh."""
        with self._cond:
            self._failures.pop(key, None)

    def prune(self, keep: Callable[[K], bool]) -> None:
        """Forget the failure counts of keys that no longer exist (a profile deleted while it
        backed off)."""
        with self._cond:
            for key in [k for k in self._failures if not keep(k)]:
                del self._failures[key]
            # A burst's keys have left these tables; their size stays unless rebuilt.
            self._failures = compacted(self._failures)
            self._lane = compacted(self._lane)
            self._dirty = compacted(self._dirty)
            self._due = compacted(self._due)

    def failures(self, key: K) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    # --- taking ---------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> K | None:
        """The next ready key (now owned by the caller until `done`), or None on shutdown or
        timeout."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                if self._shut:
                    return None
                self._promote_locked()
                key = self._take_locked()
                if key is not None:
                    self._processing.add(key)
                    return key
                wait = self._next_due_locked()
                if deadline is not None:
                    left = deadline - self._clock()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)

    def _take_locked(self) -> K | None:
        for lane, ready in enumerate(self._lanes):
            while ready:
                key = ready.popleft()
                if self._lane.get(key) == lane:  # else a stale entry: the key moved or went
                    del self._lane[key]
                    return key
        return None

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            lane = self._dirty.pop(key, None)
            if lane is not None:
                self._add_locked(key, lane)

    def _promote_locked(self) -> None:
        now = self._clock()
        while self._delayed and self._delayed[0].due <= now:
            item = heapq.heappop(self._delayed)
            if self._due.get(item.key) == item.due:
                del self._due[item.key]
                self._add_locked(item.key, item.lane)

    def _next_due_locked(self) -> float | None:
        if not self._delayed:
            return None
        return max(0.0, self._delayed[0].due - self._clock())

    # --- lifecycle ------------------------------------------------------------------------

    def shutdown(self) -> None:
        with self._cond:
            self._shut = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._lane)

    def pending(self) -> int:
        """Keys queued, delayed or being processed (for metrics and tests)."""
        with self._cond:
            return len(self._lane.keys() | self._processing | self._due.keys())
