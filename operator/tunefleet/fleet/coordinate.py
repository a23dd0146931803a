"""Claims on whatever the store offers: an atomic swap (claims.py: s3://, file://, pvc://) or
a board of bids settled by time (bids.py: oci://). Whether a store can hold one is asked here;
reconciler/apply.py takes and gives back claims (`take`, `give_back`), where every store
write of a reconcile is."""

from __future__ import annotations

from tunefleet.storage.store import Store, board, swappable


def coordinates(store: Store) -> bool:
    """Whether claims can be taken in this store."""
    return swappable(store) is not None or board(store) is not None
