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

A holder renews by posting its bid again with the same `taken`, and releases it by taking it
down. A bid past its expiry is no claim; a holder whose own bid expired bids afresh, since its
old `taken` would jump a later bid that may have settled meanwhile. A bid that expires more
than MAX_CLAIM_SECONDS ahead is none any cluster made, and is not obeyed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum

from tunefleet.contracts.fleet import MAX_BYTES, MAX_CLAIM_SECONDS, Claim, Holder
from tunefleet.fleet.claims import Standing
from tunefleet.storage.store import Board, StoreError


class Move(StrEnum):
    BID = "bid"  # no live bid: post ours
    SETTLE = "settle"  # ours is the earliest, not yet standing for the window
    HOLD = "hold"  # ours is the earliest and has settled
    RENEW = "renew"  # as HOLD, past half its time: post it again with a later expiry
    WAIT = "wait"  # another's is earlier: wait on it, take ours down


def member(me: Holder) -> str:
    """A holder's place on the board (one bid each)."""
    return f"{me.cluster}/{me.namespace}/{me.profile}/{me.uid}"


def decide(
    bids: list[Claim], me: Holder, now: float, ttl: float, settle: float
) -> tuple[Move, Claim | None]:
    """What to do about the bids read (pure), and the bid it is about: ours, or the earliest
    that we wait on (None for BID)."""
    live = sorted(
        (b for b in bids if now < b.expires <= now + MAX_CLAIM_SECONDS),
        key=lambda b: (b.taken, member(b.holder)),
    )
    if not live:
        return Move.BID, None
    first = live[0]
    if first.holder != me:
        return Move.WAIT, first
    if now - first.taken < settle:
        return Move.SETTLE, first
    if first.expires - now < ttl / 2:
        return Move.RENEW, first
    return Move.HOLD, first


def claim(
    board: Board,
    group: str,
    identity: str,
    me: Holder,
    times: tuple[float, float, float],
    clock: Callable[[], float] = time.time,
) -> Standing:
    """Bid, settle, hold, renew or wait on the identity's board `group`; `times` is (now, the
    claim's life, the settle window). A Standing that is not held but `settling` is our own
    bid standing: ask again after that many seconds. StoreError when the store fails."""
    now, ttl, settle = times
    bids = read(board, group, identity)
    move, which = decide(bids, me, now, ttl, settle)
    if move is Move.WAIT:
        assert which is not None
        if any(b.holder == me for b in bids):
            board.unpost(group, member(me))
        return Standing(False, which)
    if move is Move.HOLD:
        assert which is not None
        return Standing(True, which)
    if move is Move.SETTLE:
        assert which is not None
        return Standing(False, which, settling=settle - (now - which.taken))
    if move is Move.RENEW:
        assert which is not None
        renewed = Claim(identity, me, which.taken, now + ttl)
        board.post(group, member(me), renewed.to_bytes())
        return Standing(True, renewed)
    taken = clock()
    mine = Claim(identity, me, taken, taken + ttl)
    board.post(group, member(me), mine.to_bytes())
    took = clock() - taken
    if took > settle / 2:
        board.unpost(group, member(me))
        raise StoreError(
            f"posting a bid took {took:.1f}s, over half the {settle:g}s settle window: taken "
            "down (it might show after a later bid settled); bidding again"
        )
    return Standing(False, mine, settling=settle)


def release(board: Board, group: str, me: Holder) -> None:
    """Take our bid down (its Job ended): the next bidder holds after its own window."""
    board.unpost(group, member(me))


def read(board: Board, group: str, identity: str) -> list[Claim]:
    """The bids on the board that are bids on this identity (anything else is not obeyed)."""
    out = []
    for data in board.notes(group, MAX_BYTES):
        bid = Claim.from_bytes(data, identity)
        if bid is not None:
            out.append(bid)
    return out
