"""Artifact ConfigMaps and admitted model pods: kept on every replica (delivered.py, served.py);
a change queues the profile concerned, whose reconcile makes a deleted or replaced ConfigMap
again and counts the pods that run untuned for a cause of ours (Degraded)."""

from __future__ import annotations

from typing import Any

from tunefleet import metrics
from tunefleet.handlers.startup import Operator
from tunefleet.runtime import reflector
from tunefleet.watched import kinds


@reflector.on(kinds.ARTIFACT_CONFIGMAPS)
def artifact_config_map_event(operator: Operator, type: str | None, body: dict[str, Any]) -> None:
    metrics.HANDLER_CALLS.labels("artifact_config_map_event").inc()
    owner = operator.delivered.follow(type, body)
    # Only a trigger: the reconcile checks the ConfigMap its status names against the API.
    if owner is not None and type is not None:
        operator.controller.enqueue_owner(*owner)


@reflector.on(kinds.MODEL_PODS)
def model_pod_event(operator: Operator, type: str | None, body: dict[str, Any]) -> None:
    metrics.HANDLER_CALLS.labels("model_pod_event").inc()
    changed = operator.served.follow(type, body)
    if changed is not None:
        operator.controller.enqueue_owner(*changed)
