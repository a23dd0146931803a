"""Tuning Jobs: kept in the cache by profile uid; any change queues the owning profile."""

from __future__ import annotations

from typing import Any

import kopf

from tunefleet import metrics, naming
from tunefleet.handlers.startup import CACHE, CONTROLLER


@kopf.on.event(
    "batch",
    "v1",
    "jobs",
    labels={naming.MANAGED_KEY: naming.MANAGED_VALUE, naming.PROFILE_UID_LABEL: kopf.PRESENT},
)
async def job_event(
    type: str | None, body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any
) -> None:
    # A deleted Job is made again by the reconcile this queues: deleting a failed Job is how
    # a user asks for a retry. The short delay folds a burst of one Job's events into one.
    metrics.HANDLER_CALLS.labels("job_event").inc()
    CACHE.follow("jobs", type, labels[naming.PROFILE_UID_LABEL], dict(body))
    CONTROLLER.get().enqueue_owner(namespace, labels.get(naming.TUNING_PROFILE_LABEL))
