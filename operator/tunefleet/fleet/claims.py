"""Claims on an identity in the store: never two tunings of it at once across the fleet.

`step` decides (pure) what a profile does about a claim it found; reconciler/apply.py carries
it out (`swap_claim`, where every store write of a reconcile is) with conditional writes
(create when there is none, replace the very version read otherwise), so of
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

from tunefleet.contracts.fleet import MAX_BYTES, MAX_CLAIM_SECONDS, Claim, Holder, renew_every
from tunefleet.storage.store import NotFoundError, Swappable, Tagged

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/json"
TRIES = 3  # conditional writes lost to another writer before giving up for this pass


class Step(StrEnum):
    TAKE = "take"  # none there: create it
    TAKE_OVER = "take-over"  # expired (or not a claim): replace the version read
    RENEW = "renew"  # ours, due (contracts/fleet.renew_every): push its expiry out
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
        return Step.RENEW if found.expires - now <= ttl - renew_every(ttl) else Step.HOLD
    if found.expires <= now:
        return Step.TAKE_OVER
    return Step.WAIT


@dataclass(frozen=True)
class Standing:
    """Where a profile stands on an identity after a claim (apply.swap_claim, or apply.bid):
    it holds the claim (until `claim.expires`), or another holds it (`claim` names who, and
    until when), or, on a board, its own bid stands for `settling` more seconds before it
    holds."""

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


def read_claim(store: Swappable, key: str) -> Tagged | None:
    """The claim's version, None when there is none; one over MAX_BYTES comes as its tag
    alone (Tagged.oversize, no data), which no Claim parses from: not a claim, taken over."""
    try:
        return store.read_tagged(key, MAX_BYTES)
    except NotFoundError:
        return None
