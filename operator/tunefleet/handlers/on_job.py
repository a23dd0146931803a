"""Tuning Jobs: kept in the cache by profile uid; any change queues the owning profile."""

from __future__ import annotations

from typing import Any

from tunefleet.handlers.startup import Operator
from tunefleet.runtime import reflector
from tunefleet.watched import kinds


@reflector.on(kinds.JOBS)
def job_event(operator: Operator, type: str | None, body: dict[str, Any]) -> None:
    # A deleted Job is made again by the reconcile this queues: deleting a failed Job is how
    # a user asks for a retry.
    operator.follow_child("jobs", type, body)
