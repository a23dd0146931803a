"""TuningProfile: kept in the cache (admission and reconciles read it), queued on every event."""

from __future__ import annotations

from typing import Any

import kopf

from tunefleet import GROUP, PLURAL, VERSION, metrics
from tunefleet.handlers.startup import CACHE, CONTROLLER, NODE_MAPS


@kopf.on.event(GROUP, VERSION, PLURAL)
async def tuningprofile_event(
    type: str | None, body: kopf.Body, namespace: str | None, name: str, **_: Any
) -> None:
    # Level-based: whatever changed (created, spec edited, deleted, seen again after a
    # restart), the reconciler recomputes from the cache. Our own status writes come back
    # here too and end as no-op reconciles, or none at all (Controller.wants).
    metrics.HANDLER_CALLS.labels("tuningprofile_event").inc()
    key = (namespace or "", name)
    if type == "DELETED":
        CACHE.drop_profile(key)
        CONTROLLER.get().forget(key, body.metadata.uid)
        NODE_MAPS.profile_changed(key[0])
        return
    view = CACHE.put_profile(dict(body))
    NODE_MAPS.profile_changed(key[0])
    if CONTROLLER.get().wants(view):
        CONTROLLER.get().enqueue(key)
