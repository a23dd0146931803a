"""Capture stores and retune sets (capture/store.py): kept in the capture cache on every
replica; a change queues the profile it belongs to (the leader recomputes status.capture)."""

from __future__ import annotations

from typing import Any

import kopf

from tunefleet import metrics, naming
from tunefleet.handlers.startup import CAPTURES, CONTROLLER


@kopf.on.event(
    "", "v1", "configmaps",
    labels={naming.MANAGED_KEY: naming.MANAGED_VALUE, naming.ROLE_LABEL: kopf.PRESENT},
)  # fmt: skip
async def capture_event(type: str | None, body: kopf.Body, **_: Any) -> None:
    metrics.HANDLER_CALLS.labels("capture_event").inc()
    if CAPTURES.follow(type, dict(body)) is None:
        return
    # By the name its label gives: only a trigger; the reconcile reads what the profile owns.
    profile = body.metadata.labels.get(naming.TUNING_PROFILE_LABEL)
    CONTROLLER.get().enqueue_owner(body.metadata.namespace, profile)
