"""TuningProfile: kept in an index (admission and reconciles read it), queued on every event."""

from __future__ import annotations

from typing import Any

import kopf

from tunefleet import GROUP, PLURAL, VERSION, metrics, views
from tunefleet.handlers.startup import CONTROLLER


@kopf.index(GROUP, VERSION, PLURAL)
async def tuningprofile_index(
    body: kopf.Body, namespace: str | None, name: str, **_: Any
) -> dict[tuple[str | None, str], dict[str, Any]]:
    """What the pod webhook and the reconciler need, so neither waits on the API server."""
    return {(namespace, name): views.profile_view(body)}


@kopf.on.event(GROUP, VERSION, PLURAL)
async def tuningprofile_event(
    type: str | None, body: kopf.Body, namespace: str | None, name: str, **_: Any
) -> None:
    # Level-based: whatever changed (created, spec edited, deleted, seen again after a
    # restart), the reconciler recomputes from the indexes. Our own status writes come back
    # here too and end as no-op reconciles.
    metrics.HANDLER_CALLS.labels("tuningprofile_event").inc()
    key = (namespace or "", name)
    if type == "DELETED":
        CONTROLLER.get().forget(key, body.metadata.uid)
        return
    if CONTROLLER.get().wants(views.profile_view(body)):
        CONTROLLER.get().enqueue(key)
