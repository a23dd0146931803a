"""How tunefleet-sync stops: a SIGTERM sets a flag that takes no lock, and the loop notices it
within a poll. A threading.Event did not do: its set() takes the lock the main thread holds for
a moment inside every wait(), and a SIGTERM landing there ran the handler on that thread,
which then waited on its own lock forever (a CI run caught the sidecar hung after "SIGTERM")."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from types import FrameType

from tunefleet.artifacts.sync import Settings, Stop, Sync
from tunefleet.storage.registry import parse_uri
from tuner_job.library import CheckpointId


def test_a_signal_stops_the_wait_within_its_poll() -> None:
    stop = Stop()

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        stop.set(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        started = time.monotonic()
        while not stop.wait(0.2):
            assert time.monotonic() - started < 5, "the signal never stopped the loop"
        assert stop.why == "SIGALRM"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_setting_it_while_its_own_thread_is_inside_wait_never_blocks() -> None:
    """What a handler does when the signal lands inside wait(): set() on the waiting thread.
    An Event's set() there blocks on the lock wait() holds; Stop's returns at once."""
    stop = Stop()
    ended = threading.Event()

    def waiter() -> None:
        stop.wait(0.5)
        ended.set()

    t = threading.Thread(target=waiter)
    t.start()
    stop.set("SIGTERM")  # no lock to contend for, whoever calls it
    assert stop.is_set() and stop.wait(10.0)  # set: no sleep at all
    t.join(timeout=5)
    assert ended.is_set()


def test_what_a_signal_sets_holds_no_lock(tmp_path: Path) -> None:
    """The stop a Sync waits on (and main()'s handler sets) holds nothing that can be
    acquired: a threading.Event holds a Condition, whose lock its waiting thread may hold
    when the handler runs on it (made deterministic below)."""
    settings = Settings(
        exchange=tmp_path / "exchange",
        location=parse_uri(f"file://{tmp_path / 'store'}"),
        ident=CheckpointId("ml", "llama", "M", "3f2a9c01de", 0, 1),
        scope="namespace",
        every_gemms=1,
        every_seconds=60,
        min_interval_s=0,
    )
    stopping = Sync(settings).stopping
    assert not [v for v in vars(stopping).values() if hasattr(v, "acquire")], vars(stopping)
    # The failure an Event has there: its waiting thread inside wait()'s critical section (it
    # holds the Condition's lock for a moment in every wait) cannot take it again.
    event = threading.Event()
    assert [v for v in vars(event).values() if hasattr(v, "acquire")]
    with event._cond:  # type: ignore[attr-defined]
        assert not event._cond.acquire(timeout=0.2)  # type: ignore[attr-defined]
