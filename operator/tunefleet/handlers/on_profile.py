"""TuningProfile: kept in the cache (admission and reconciles read it), queued on every event."""

from __future__ import annotations

from typing import Any

from tunefleet import metrics
from tunefleet.handlers.startup import Operator
from tunefleet.informers.view_cache import spec_seen
from tunefleet.runtime import reflector
from tunefleet.watched import kinds


@reflector.on(kinds.PROFILES)
def tuningprofile_event(operator: Operator, type: str | None, body: dict[str, Any]) -> None:
    # Level-based: whatever changed (created, spec edited, deleted, listed again after a
    # restart), the reconciler recomputes from the cache. Our own status writes come back
    # here too and end as no-op reconciles, or none at all (Controller.wants).
    metrics.HANDLER_CALLS.labels("tuningprofile_event").inc()
    meta = body.get("metadata") or {}
    key = (meta.get("namespace") or "", meta.get("name") or "")
    if type == "DELETED":
        operator.cache.drop_profile(key)
        operator.controller.forget(key, meta.get("uid"))
        operator.profile_changed(*key)
        return
    before = operator.cache.spec_seen(key)
    view = operator.cache.put_profile(body)
    if before != spec_seen(body):
        # The node maps follow specs: a status write (most events in a burst) changes
        # nothing they hold, and recomputing a namespace unpacks every profile in it.
        operator.profile_changed(*key)
    if operator.controller.wants(view):
        operator.controller.enqueue(key)
