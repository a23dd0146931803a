"""Claims on whatever the store offers: an atomic swap (claims.py: s3://, file://, pvc://) or
a board of bids settled by time (bids.py: oci://). The reconcile asks here and need not know
which."""

from __future__ import annotations

from tunefleet.contracts.fleet import Holder
from tunefleet.fleet import bids, claims
from tunefleet.fleet.claims import Standing
from tunefleet.storage.store import Store, StoreError, board, swappable


def coordinates(store: Store) -> bool:
    """Whether claims can be taken in this store."""
    return swappable(store) is not None or board(store) is not None


def take(
    store: Store, key: str, identity: str, me: Holder, times: tuple[float, float, float]
) -> Standing:
    """Take, renew, hold or wait on the claim on `identity` at `key`; `times` is (now, the
    claim's life, the settle window a board's bid stands for)."""
    now, ttl, _ = times
    swap = swappable(store)
    if swap is not None:
        return claims.claim(swap, key, identity, me, now, ttl)
    posts = board(store)
    if posts is None:
        raise StoreError(f"{store.uri(key)}: this store cannot hold a claim")
    return bids.claim(posts, key, identity, me, times)


def give_back(store: Store, key: str, identity: str, me: Holder, now: float) -> None:
    """End our claim now (its Job ended), for the next taker."""
    swap = swappable(store)
    if swap is not None:
        claims.release(swap, key, identity, me, now)
        return
    posts = board(store)
    if posts is not None:
        bids.release(posts, key, me)
