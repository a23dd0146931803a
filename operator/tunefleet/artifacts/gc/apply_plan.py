"""Applying a plan: the compacted library entries are written first (create-only), then the
groups are deleted, several at once, each reported as it is done.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

from tunefleet.storage.store import NotFoundError, Store, StoreError

from .common import WORKERS
from .plan import Delete, Plan
from .report import delete_line, left_line, write_line


def apply(plan: Plan, store: Store, report: Callable[[str], None]) -> None:
    """Compacted entries first (create-only): no entry is deleted unless they are all in.
    Then the deletions, a group per worker; each is reported when done, and the first failure
    is raised once the groups already started have ended."""
    for w in plan.writes:
        store.put_if_absent(w.key, w.data, "application/json")
        report(write_line(w, applied=True))

    def delete(d: Delete) -> bool:
        if not all(_still(store, key, data) for key, data in d.unchanged):
            return False
        for key in d.keys:  # in order: a manifest never outlives its results
            store.delete(key)
        return True

    failed: list[BaseException] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = {pool.submit(delete, d): d for d in plan.deletes}
        for future in concurrent.futures.as_completed(futures):
            if future.cancelled():
                continue
            exc = future.exception()
            if exc is None and future.result():
                report(delete_line(futures[future], plan.rules, applied=True))
            elif exc is None:
                report(left_line(futures[future]))
            elif not failed:
                failed.append(exc)
                for pending in futures:
                    pending.cancel()  # those not started yet; the running ones finish
    if failed:
        raise failed[0]


def _still(store: Store, key: str, data: bytes) -> bool:
    """Whether the object still holds what gc read. Read again just before deleting, so a
    fleet object its owner wrote again meanwhile (a refs doc renewed, a claim taken over) is
    left; the window left is one request long, and the worst it does to a claim is what its
    absence does: the next taker creates one."""
    try:
        return store.get(key, len(data) + 1) == data
    except NotFoundError:
        return False  # already gone
    except StoreError:
        return False  # not known now: left for the next run
