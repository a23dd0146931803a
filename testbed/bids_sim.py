"""The bid protocol of fleet/bids.py (claims on a store with no conditional write: oci://),
simulated: contenders with skewed clocks and slow writes bid on one in-memory board whose
notes show only once written, through the operator's own code (reconciler/apply.bid).

tests/unit/test_fleet_bids.py asserts on it (no two ever hold; a ghost makes nobody wait its
day) and the `bids` benchmark (bench/bench_bids.py) reports the same runs' figures for the
docs: the most that held at once, the trials where one held, and the longest wait on a ghost.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field, replace

from tunefleet.contracts.fleet import Claim, Holder
from tunefleet.fleet import bids
from tunefleet.reconciler import apply
from tunefleet.storage.store import StoreError

IDENTITY = "a" * 64
GROUP = "p/_fleet/M/" + IDENTITY + "/claim.json"
TTL, SETTLE = 600.0, 5.0
EPOCH = 1.7e9  # the contenders' clocks read real epoch seconds: a ghost's `taken: 0` is 1970


def holder(name: str, cluster: str = "c1") -> Holder:
    return Holder(cluster, "ml", name, f"uid-{name}")


def bid(who: Holder, taken: float, expires: float | None = None) -> Claim:
    return Claim(IDENTITY, who, taken, taken + TTL if expires is None else expires)


GHOST = holder("ghost", "cg")


@dataclass
class Board:
    """An in-memory board whose notes show once their write completes: `now` is the real
    time of the call, a listing takes `read_delay` and a write `latency`, one after another
    (as a caller's requests are)."""

    now: float = 0.0
    latency: float = 0.0
    read_delay: float = 0.0
    notes_at: dict[str, list[tuple[float, bytes | None]]] = field(default_factory=dict)

    def post(self, group: str, member: str, data: bytes | None) -> None:
        self.now += self.latency
        self.notes_at.setdefault(member, []).append((self.now, data))

    def unpost(self, group: str, member: str) -> None:
        self.post(group, member, None)

    def notes(self, group: str, max_bytes: int) -> list[bytes]:
        out = []
        for history in self.notes_at.values():
            shown = [d for t, d in sorted(history, key=lambda h: h[0]) if t <= self.now]
            if shown and shown[-1] is not None:
                out.append(shown[-1])
        self.now += self.read_delay
        return out


@dataclass(frozen=True)
class Trial:
    """One simulated run: the most contenders that held the claim at one moment, whether one
    held it at the end, and the longest any contender waited on the ghost without a break
    (simulated seconds; 0 with no ghost)."""

    most: int
    held: bool
    ghost_wait_s: float


@dataclass
class _Waits:
    """When each contender began waiting on the ghost, and the longest wait that ended."""

    since: dict[int, float] = field(default_factory=dict)
    longest: float = 0.0

    def saw(self, i: int, t: float, on_ghost: bool) -> None:
        if on_ghost:
            self.since.setdefault(i, t)
        elif i in self.since:
            self.longest = max(self.longest, t - self.since.pop(i))

    def until(self, t: float) -> float:
        return max([self.longest, *(t - s for s in self.since.values())])


def trial(
    rng: random.Random,
    skew: float,
    slow: float,
    reads: float = 4.0,
    windows: tuple[float, ...] = (SETTLE,),
    ghost: bool = False,
    ghost_first: bool = False,
) -> Trial:
    """Contenders bid from random starts with clocks skewed by up to `skew`, writes taking up
    to `slow` (or 0.8 of their window, when windows differ) and listings up to `reads`
    seconds, each with a window drawn from `windows`; with `ghost`, a note taken at 0 and
    expiring a day later is pushed once they all watch; with `ghost_first`, one is on the
    board before anyone looks, claiming it was renewed then."""
    board = Board()
    if ghost_first:
        ghost_bid = replace(bid(GHOST, 0.0, EPOCH + 86400), renewed=EPOCH)
        board.post(GROUP, bids.member(GHOST), ghost_bid.to_bytes())
    n = rng.randint(2, 4)
    who = [holder(f"p{i}", f"c{i}") for i in range(n)]
    offset = [rng.uniform(-skew / 2, skew / 2) for _ in who]
    window = [rng.choice(windows) for _ in who]
    sight = [bids.Sightings() for _ in who]  # each cluster's operator reads for itself
    events = [(rng.uniform(0, 3.0), i) for i in range(n)]
    heapq.heapify(events)
    ghost_at = rng.uniform(5.0, 40.0) if ghost else None
    # A ghost there before anyone looked stands until LIVE_SECONDS after the post it claims;
    # then slow writers (a third of posts are taken down) need minutes to settle among them.
    horizon = 60.0 + 3 * max(window) + (bids.LIVE_SECONDS + 240.0 if ghost_first else 0.0)
    poll = 20.0 if ghost_first else 2.0  # how often a waiter reads again (keeps the run short)
    held: dict[int, float] = {}  # contender -> real time its hold ends
    most, waits, t = 0, _Waits(), 0.0
    while events:
        t, i = heapq.heappop(events)
        if t > horizon:
            break
        if ghost_at is not None and t >= ghost_at:
            board.now, board.latency = ghost_at, 0.0
            late = EPOCH + ghost_at + 86000
            board.post(GROUP, bids.member(GHOST), bid(GHOST, 0.0, late).to_bytes())
            ghost_at = None
        write = slow if len(windows) == 1 else window[i] * 0.8
        latency, read = rng.uniform(0, write), rng.uniform(0, reads)
        board.now, board.latency, board.read_delay = t, latency, read
        clock = EPOCH + t + offset[i]
        ticks = iter((clock + read, clock + read + latency))
        times = (clock, TTL, window[i])
        try:
            got = apply.bid(
                board, GROUP, IDENTITY, who[i], times, bids.Reader(ticks.__next__, sight[i])
            )
        except StoreError:  # its own bid, posted too slowly, taken down: it waits on no ghost
            waits.saw(i, t, False)
            heapq.heappush(events, (board.now + 1.0, i))
            continue
        waits.saw(i, t, not got.held and got.claim.holder == GHOST)
        if got.held:
            held[i] = t + TTL
        else:
            held.pop(i, None)
            heapq.heappush(events, (board.now + (got.settling or poll), i))
        most = max(most, sum(1 for end in held.values() if end > t))
    return Trial(most, bool(held), round(waits.until(min(t, horizon)), 1))


def simulate(
    rng: random.Random,
    skew: float,
    slow: float,
    reads: float = 4.0,
    windows: tuple[float, ...] = (SETTLE,),
    ghost: bool = False,
    ghost_first: bool = False,
) -> tuple[int, bool]:
    """trial's run as (the most that ever held at once, whether one ever held)."""
    run = trial(rng, skew, slow, reads, windows, ghost, ghost_first)
    return run.most, run.held
