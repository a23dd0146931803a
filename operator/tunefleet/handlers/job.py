"""Tuning Jobs: kept in the cache by profile uid; any change queues the owning profile."""

from __future__ import annotations

from typing import Any

import kopf

from tunefleet.handlers.startup import CHILD_LABELS, follow_child


@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS)
async def job_event(type: str | None, body: kopf.Body, **_: Any) -> None:
    # A deleted Job is made again by the reconcile this queues: deleting a failed Job is how
    # a user asks for a retry.
    follow_child("jobs", type, body)
