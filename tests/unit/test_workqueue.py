"""The reconciler's work queue: one entry per key, never two workers on a key, backoff."""

from __future__ import annotations

import threading

from tunefleet.runtime.workqueue import Backoff, WorkQueue


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_key_is_queued_once_however_often_it_is_added() -> None:
    q: WorkQueue[str] = WorkQueue()
    for _ in range(5):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    assert q.get(timeout=0) == "a" and q.get(timeout=0) == "b"
    assert q.get(timeout=0) is None


def test_a_key_added_while_processed_comes_back_after_done_not_before() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add("a")  # an event while a worker reconciles "a"
    assert q.get(timeout=0) is None  # no second worker on the same key
    q.done("a")
    assert q.get(timeout=0) == "a"


def test_failures_back_off_exponentially_to_a_cap_and_success_forgets() -> None:
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(Backoff(base=1.0, cap=8.0), clock=clock)
    delays = []
    for _ in range(6):
        delays.append(q.retry("a"))
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    q.forget("a")
    assert q.retry("a") == 1.0
    assert q.retry("b", at_least=30) == 30  # a hint (e.g. RBAC: 30 s) is a floor


def test_delayed_adds_wait_and_the_earliest_wins() -> None:
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add_after("a", 10)
    q.add_after("a", 5)
    q.add_after("a", 20)  # later than a pending one: ignored
    assert q.get(timeout=0) is None
    clock.t += 5
    assert q.get(timeout=0) == "a"
    q.done("a")
    clock.t += 100
    assert q.get(timeout=0) is None  # the 10 s and 20 s adds were folded into the first


def test_get_blocks_until_a_key_arrives_and_shutdown_releases_workers() -> None:
    q: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    q.add("x")
    t.join(5)
    assert got == ["x"]
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    q.shutdown()
    t.join(5)
    assert got == ["x", None]


def test_urgent_keys_are_taken_before_refreshes_and_each_key_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    for k in ("r1", "r2", "r3"):
        q.add(k, urgent=False)  # a pod event, the resync
    q.add("new")  # a profile created
    q.add("r2")  # r2's spec changed meanwhile: it moves up, and is not taken twice
    taken = [q.get(timeout=0) for _ in range(5)]
    assert taken == ["new", "r2", "r1", "r3", None]
    assert len(q) == 0 and q.pending() == 4  # the four still being processed


def test_a_refresh_never_demotes_an_urgent_key() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a", urgent=False)
    q.add("b")
    q.add("b", urgent=False)
    assert [q.get(timeout=0), q.get(timeout=0)] == ["b", "a"]


def test_the_lane_survives_processing_and_delay() -> None:
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add("a", urgent=False)
    assert q.get(timeout=0) == "a"
    q.add("a", urgent=False)
    q.add("a")  # urgent while being processed: urgent when it comes back
    q.add("b", urgent=False)
    q.done("a")
    assert q.get(timeout=0) == "a"
    q.add_after("c", 1.0, urgent=False)
    q.add_after("d", 2.0)
    clock.t += 3
    assert [q.get(timeout=0), q.get(timeout=0), q.get(timeout=0)] == ["d", "b", "c"]
