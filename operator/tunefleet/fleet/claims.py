"""Claims on an identity in the store: never two tunings of it at once across the fleet.

`step` decides (pure) what a profile does about a claim it found; `claim` carries it out with
conditional writes (create when there is none, replace the very version read otherwise), so of
two writers at the same moment exactly one wins and the other reads the winner next time. A
claim is renewed while its Job runs and released (expired now) when the Job ends; a holder
that dies leaves a claim that expires, after which anyone takes it over: a dead cluster costs
one expiry, never a stuck fleet. Clocks of different clusters are compared, so the expiry must
be long against their skew (minutes, with NTP's milliseconds).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum

from tunefleet.contracts.fleet import MAX_BYTES, MAX_CLAIM_SECONDS, Claim, Holder, odd
from tunefleet.storage.store import NotFoundError, StoreError, Swappable, Tagged

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/json"
TRIES = 3  # conditional writes lost to another writer before giving up for this pass


class Step(StrEnum):
    TAKE = "take"  # none there: create it
    TAKE_OVER = "take-over"  # expired (or not a claim): replace the version read
    RENEW = "renew"  # ours, past half its time: push its expiry out
    HOLD = "hold"  # ours, fresh
    WAIT = "wait"  # another's, unexpired


def step(found: Claim | None, unreadable: bool, me: Holder, now: float, ttl: float) -> Step:
    """What to do about the claim found (None: none there, or `unreadable`: something that is
    not a claim on this identity, which is never obeyed)."""
    if found is None:
        return Step.TAKE_OVER if unreadable else Step.TAKE
    if found.expires > now + MAX_CLAIM_SECONDS:
        return Step.TAKE_OVER  # no cluster sets such a claim: never obeyed
    if found.holder == me:
        return Step.RENEW if found.expires - now < ttl / 2 else Step.HOLD
    if found.expires <= now:
        return Step.TAKE_OVER
    return Step.WAIT


@dataclass(frozen=True)
class Standing:
    """Where a profile stands on an identity after `claim` (or bids.claim): it holds the claim
    (until `claim.expires`), or another holds it (`claim` names who, and until when), or, on a
    board, its own bid stands for `settling` more seconds before it holds."""

    held: bool
    claim: Claim
    settling: float = 0.0

    def waiting_words(self, now: float) -> str:
        if self.settling > 0:
            return (
                "this profile bids to tune this identity: its bid in the store stands "
                f"{self.settling:.1f}s more, for any earlier bid to show (the store has no "
                "conditional write)"
            )
        left = max(0, round(self.claim.expires - now))
        return (
            f"{self.claim.holder.describe()} tunes this identity now (its claim in the store "
            f"expires in {left}s unless renewed)"
        )


def claim(
    store: Swappable, key: str, identity: str, me: Holder, now: float, ttl: float
) -> Standing:
    """Take, renew, hold or wait on the claim at `key`. StoreError when the store fails; a race
    lost to another writer is read again (at most TRIES times, then reported as waiting on
    whoever won, or as a StoreError when what won is not a claim)."""
    mine = Claim(identity, me, now, now + ttl)
    found: Claim | None = None
    for _ in range(TRIES):
        tagged = _read(store, key)
        found = Claim.from_bytes(tagged.data, identity) if tagged else None
        what = step(found, tagged is not None and found is None, me, now, ttl)
        if what is Step.WAIT:
            assert found is not None
            return Standing(False, found)
        if what is Step.HOLD:
            assert found is not None
            return Standing(True, found)
        if what is Step.TAKE:
            if store.create(key, mine.to_bytes(), CONTENT_TYPE):
                return Standing(True, mine)
            continue
        assert tagged is not None
        if what is Step.RENEW:
            assert found is not None
            mine = Claim(identity, me, found.taken, now + ttl)
        if store.replace_if(key, mine.to_bytes(), CONTENT_TYPE, tagged.tag):
            if found is None:
                # Said once it is gone: what blocked the identity, for whoever wrote it.
                what_was = odd(tagged.data, tagged.oversize, "a claim on this identity")
                log.warning(f"{key}: held {what_was}; taken over by {me.describe()}")
            return Standing(True, mine)
    if found is not None and found.holder != me:
        return Standing(False, found)
    raise StoreError(f"the claim at {key} changed under each of {TRIES} writes: read again later")


def release(store: Swappable, key: str, identity: str, me: Holder, now: float) -> bool:
    """End our claim now (its Job ended): it stays, expired, for the next taker. False when
    the claim there is not ours (taken over meanwhile) or changed as we wrote."""
    tagged = _read(store, key)
    found = Claim.from_bytes(tagged.data, identity) if tagged else None
    if tagged is None or found is None or found.holder != me or found.expires <= now:
        return False
    ended = Claim(identity, me, found.taken, now)
    return store.replace_if(key, ended.to_bytes(), CONTENT_TYPE, tagged.tag)


def _read(store: Swappable, key: str) -> Tagged | None:
    """The claim's version, None when there is none; one over MAX_BYTES comes as its tag
    alone (Tagged.oversize, no data), which no Claim parses from: not a claim, taken over."""
    try:
        return store.read_tagged(key, MAX_BYTES)
    except NotFoundError:
        return None
