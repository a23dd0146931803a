"""Claims on a store with no conditional write (oci://: a registry replaces a tag with no
If-Match), made from time instead of an atomic swap (claims.py's way).

Each profile that needs the identity posts its own bid (a Claim: holder, taken, expires) on the
identity's board (store.Board) and reads every bid there. The claim is the earliest live bid,
by `taken` (then holder, so that all readers agree); its holder tunes once its bid has stood
for the settle window. Others wait on it and take theirs down.

Why that is one holder: a bid taken earlier than ours has been written, and shows, by the time
ours has stood for the window, as long as the window is longer than a bid's write plus the
skew of the two clocks. A bid whose write took over half the window is taken down at once and
posted again later (it might show only after a later bid settled), so the window covers any
skew under its other half (NTP keeps clocks within milliseconds; the default window is 5 s).

A holder renews by posting its bid again with the same `taken`, a later expiry and the time of
the post (`renewed`), at half its claim's life and at least every RENEW_EVERY_SECONDS; it
releases its bid by taking it down. A bid past its expiry is no claim; a holder whose own bid
expired bids afresh, since its old `taken` would jump a later bid that may have settled
meanwhile. A bid that expires more than MAX_CLAIM_SECONDS ahead is none any cluster made, and
is not obeyed; nor is one not posted again within LIVE_SECONDS (11 minutes): its holder has
stopped, or never was one. So a dead holder costs at most that, whatever its claim's expiry.

Windows differ between clusters (fleet.settleSeconds is each operator's own), so each bid
carries its own (`settle`; a bid of an earlier release, none: the default 5 s), and bids are
queued by `taken` plus half their window, the latest moment each can show. With a 60 s and a
1 s cluster, ordering by `taken` alone lets both hold: the 60 s cluster's bid may take 30 s to
write, so one taken earlier than the 1 s cluster's shows only after that one settled, and holds
60 s after its `taken`. Queued by taken + window/2, a bid ahead of ours shows by our key, so
by the time ours has stood for its window (its key plus another half) with skew under that
half; a bid behind ours is read, ours shown, before it holds, for the same reason.

A bid's `taken` is its writer's word. One that shows on a board this operator was already
watching, with a `taken` over SKEW_BOUND_SECONDS before that earlier look, is no bid a cluster
wrote then (a write plus skew is within that bound): a ghost, never obeyed, so a note pushed
with `taken: 0` makes nobody wait. A bid already there at our first look may be a holder that
has stood for hours (a profile made meanwhile, an operator restarted): obeyed, but queued no
earlier than that first look minus the bound, so it jumps no bid taken since, and only while
it is renewed: a note pushed once before anyone looked, `taken: 0` and a day's expiry, stands
until LIVE_SECONDS after the `renewed` it claims, never the day. (A bid of an earlier release
carries no `renewed` and counts from its `taken`: during an upgrade, such a holder that has
tuned for over LIVE_SECONDS is no longer obeyed, and a second cluster may tune the identity
too; each result is complete and verified, one of them is published.) What was seen
first, and when, is kept in memory (Sightings): a restart forgets and learns again, as a
first look.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from tunefleet.contracts.fleet import (
    MAX_BYTES,
    MAX_CLAIM_SECONDS,
    MAX_SETTLE_SECONDS,
    RENEW_EVERY_SECONDS,
    Claim,
    Holder,
    renew_every,
)
from tunefleet.storage.store import Board

# How far before this operator's look at a board a bid's `taken` may be: a bid is written in
# under half its window (MAX_SETTLE_SECONDS / 2 at most, or taken down) and clocks are kept
# well within the rest; twice that leaves room for a registry's listing to lag.
SKEW_BOUND_SECONDS = MAX_SETTLE_SECONDS
# How long a bid stands after it was last posted (`renewed`; a bid of an earlier release: its
# `taken`): a holder re-posts every RENEW_EVERY_SECONDS at the latest, so this allows one
# missed renewal plus the skew of the two clocks.
LIVE_SECONDS = 2 * RENEW_EVERY_SECONDS + SKEW_BOUND_SECONDS
MAX_BOARDS = 10_000  # boards whose bids are remembered; one forgotten is a first look again


class Move(StrEnum):
    BID = "bid"  # no live bid: post ours
    SETTLE = "settle"  # ours is the earliest, not yet standing for the window
    HOLD = "hold"  # ours is the earliest and has settled
    RENEW = "renew"  # as HOLD, past half its time: post it again with a later expiry
    WAIT = "wait"  # another's is earlier: wait on it, take ours down


def member(me: Holder) -> str:
    """A holder's place on the board (one bid each)."""
    return f"{me.cluster}/{me.namespace}/{me.profile}/{me.uid}"


def key(bid: Claim, floor: Mapping[str, float] | None = None) -> tuple[float, float, str]:
    """A bid's place in the queue: its `taken` plus half its window, no earlier than its
    floor (Sightings.place), then unclamped, then holder (so that all readers agree)."""
    own = bid.taken + bid.window / 2
    at = member(bid.holder)
    return (max(own, floor[at]) if floor and at in floor else own, own, at)


def live(bid: Claim, now: float) -> bool:
    """Whether a bid read at `now` is a claim: not expired, not expiring further ahead than
    any cluster may set, and posted again recently enough (a holder that stopped renewing, or
    a note pushed once, stands no longer than LIVE_SECONDS after its last post)."""
    heard = bid.taken if bid.renewed is None else bid.renewed
    return now < bid.expires <= now + MAX_CLAIM_SECONDS and now < heard + LIVE_SECONDS


def decide(
    bids: list[Claim],
    me: Holder,
    now: float,
    ttl: float,
    settle: float,
    floor: Mapping[str, float] | None = None,
) -> tuple[Move, Claim | None]:
    """What to do about the bids read (pure), and the bid it is about: ours, or the earliest
    that we wait on (None for BID). `settle` is our window, for a bid we post; one read stood
    for the window it carries. `floor`: the earliest place each member's bid may queue at."""
    standing = sorted((b for b in bids if live(b, now)), key=lambda b: key(b, floor))
    if not standing:
        return Move.BID, None
    first = standing[0]
    if first.holder != me:
        return Move.WAIT, first
    if now - first.taken < first.window:
        return Move.SETTLE, first
    if first.expires - now <= ttl - renew_every(ttl):
        return Move.RENEW, first
    return Move.HOLD, first


@dataclass
class _Seen:
    last: float  # when this operator last read the board (its clock)
    # Bid (member, taken) -> when first seen, or None: a ghost, never obeyed.
    first: dict[tuple[str, float], float | None] = field(default_factory=dict)


class Sightings:
    """What one reader (an operator) has seen on each board, and when: in memory only, so a
    restart forgets it and the next read is a first look (whose bids are obeyed, clamped)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # reconcile workers read boards at once
        self._boards: OrderedDict[str, _Seen] = OrderedDict()

    def place(
        self, group: str, bids: list[Claim], now: float
    ) -> tuple[list[Claim], dict[str, float]]:
        """The bids read at `now` less the ghosts, and each one's floor in the queue."""
        with self._lock:
            seen = self._boards.pop(group, None)
            first: dict[tuple[str, float], float | None] = {}
            for bid in bids:
                at = (member(bid.holder), bid.taken)
                if seen is not None and at in seen.first:
                    first[at] = seen.first[at]
                elif seen is not None and bid.taken < seen.last - SKEW_BOUND_SECONDS:
                    first[at] = None  # absent at our last look, and "taken" long before it
                else:
                    first[at] = now
            # Only the bids on the board now are remembered: one taken down is not posted
            # again with the same `taken` (a renewal keeps it, and shows all along).
            self._boards[group] = _Seen(now if seen is None else max(now, seen.last), first)
            while len(self._boards) > MAX_BOARDS:
                self._boards.popitem(last=False)
        kept = [b for b in bids if first[(member(b.holder), b.taken)] is not None]
        floor = {}
        for b in kept:
            sight = first[(member(b.holder), b.taken)]
            assert sight is not None
            floor[member(b.holder)] = sight - SKEW_BOUND_SECONDS
        return kept, floor


SIGHTINGS = Sightings()  # this operator's: one reader for all its profiles


@dataclass(frozen=True)
class Reader:
    """Who reads a board: the clock its bids are taken by, and what it has seen there."""

    clock: Callable[[], float] = time.time
    seen: Sightings = SIGHTINGS


def read(board: Board, group: str, identity: str) -> list[Claim]:
    """The bids on the board that are bids on this identity (anything else is not obeyed)."""
    out = []
    for data in board.notes(group, MAX_BYTES):
        bid = Claim.from_bytes(data, identity)
        if bid is not None:
            out.append(bid)
    return out
