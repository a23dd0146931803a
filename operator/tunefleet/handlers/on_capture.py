"""Capture stores and retune sets (capture/retune_sets.py): kept in the capture cache on every
replica; a change queues the profile it belongs to (the leader recomputes status.capture)."""

from __future__ import annotations

from typing import Any

from tunefleet import metrics, naming
from tunefleet.handlers.startup import Operator
from tunefleet.runtime import reflector
from tunefleet.watched import kinds


@reflector.on(kinds.CAPTURE_CONFIGMAPS)
def capture_event(operator: Operator, type: str | None, body: dict[str, Any]) -> None:
    metrics.HANDLER_CALLS.labels("capture_event").inc()
    if operator.captures.follow(type, body) is None:
        return
    # By the name its label gives: only a trigger; the reconcile reads what the profile owns.
    meta = body.get("metadata") or {}
    profile = (meta.get("labels") or {}).get(naming.TUNING_PROFILE_LABEL)
    operator.controller.enqueue_owner(meta.get("namespace"), profile)
