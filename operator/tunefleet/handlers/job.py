"""Tuning Jobs: kept in an index by profile uid; any change queues the owning profile."""

from __future__ import annotations

from typing import Any

import kopf

from tunefleet import metrics, naming, views
from tunefleet.handlers.startup import CONTROLLER, EVENT_DELAY


@kopf.index(
    "batch",
    "v1",
    "jobs",
    labels={naming.MANAGED_KEY: naming.MANAGED_VALUE, naming.PROFILE_UID_LABEL: kopf.PRESENT},
)
async def job_index(body: kopf.Body, labels: kopf.Labels, **_: Any) -> dict[str, Any]:
    return {labels[naming.PROFILE_UID_LABEL]: views.job_view(body)}


@kopf.on.event(
    "batch",
    "v1",
    "jobs",
    labels={naming.MANAGED_KEY: naming.MANAGED_VALUE, naming.PROFILE_UID_LABEL: kopf.PRESENT},
)
async def job_event(namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
    # A deleted Job is made again by the reconcile this queues: deleting a failed Job is how
    # a user asks for a retry. The short delay folds a burst of one Job's events into one.
    metrics.HANDLER_CALLS.labels("job_event").inc()
    profile = labels.get(naming.TUNING_PROFILE_LABEL)
    if profile and namespace:
        CONTROLLER.get().enqueue((namespace, profile), EVENT_DELAY)
