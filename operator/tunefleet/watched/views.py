"""What the operator keeps of each kind it watches (watched/kinds.py): pure functions from a
watched body to a small plain dict (informers/view_parts.py's pieces), held by the cache
(watched/cache.py) for the operator's lifetime and read by reconciles and admission instead of
lists from the API server.

A Job belongs to a profile, and a pod to a Job, only through its controller ownerReference
(informers/view_parts.controller_uid), never through the labels it carries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from tunefleet import naming
from tunefleet.builders.kueue import QUEUE_LABEL
from tunefleet.contracts.pin import ANNOTATION as PIN_ANNOTATION
from tunefleet.contracts.retune import ANNOTATION as RETUNE_ANNOTATION
from tunefleet.informers.view_parts import controller_uid
from tunefleet.informers.view_parts import pick as _pick

PROFILE_API_GROUP = "tunefleet.io"


def owning_profile(meta: Mapping[str, Any]) -> str | None:
    """The uid of the TuningProfile that controls this object (a Job, a ConfigMap), or None."""
    return controller_uid(meta, "TuningProfile", f"{PROFILE_API_GROUP}/")


def owning_job(meta: Mapping[str, Any]) -> str | None:
    """The uid of the Job that controls this pod, or None."""
    return controller_uid(meta, "Job", "batch/v1")


def profile_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """What admission and reconciliation need of a TuningProfile (of its annotations, only
    a retune request and the pins: contracts/retune.py, contracts/pin.py)."""
    meta = body.get("metadata") or {}
    kept = _pick(
        meta, "name", "namespace", "uid", "generation", "deletionTimestamp", "resourceVersion"
    )
    annotations = _pick(meta.get("annotations"), RETUNE_ANNOTATION, PIN_ANNOTATION)
    if annotations:
        kept["annotations"] = annotations
    finalizers = meta.get("finalizers") or []
    if naming.LEGACY_FINALIZER in finalizers:
        kept["finalizers"] = list(finalizers)  # the reconcile takes the legacy one off
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": kept,
        "spec": dict(body.get("spec") or {}),
        "status": dict(body.get("status") or {}),
    }


class ProfileRef(NamedTuple):
    """Which profile: what its children are owned by and labelled with (the uid tells a
    profile from a later one of the same name)."""

    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, view: Mapping[str, Any]) -> ProfileRef:
        meta = view.get("metadata") or {}
        return cls(
            str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", ""))
        )


def profile_ref(view: Mapping[str, Any]) -> dict[str, Any]:
    """An object reference for Events about the profile."""
    meta = view.get("metadata") or {}
    return {
        "apiVersion": view.get("apiVersion"),
        "kind": view.get("kind"),
        "metadata": _pick(meta, "name", "namespace", "uid"),
    }


# The Job conditions the reconcile reads (reconciler/observe.py): the others (Suspended,
# set on every Job the gate or Kueue holds) are not kept, so their events cost no reconcile.
JOB_CONDITIONS_READ = frozenset({"Complete", "SuccessCriteriaMet", "Failed", "FailureTarget"})


def job_view(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = body.get("status") or {}
    return {
        "metadata": {
            **_pick(meta, "name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"),
            "labels": _pick(
                labels,
                naming.PROFILE_UID_LABEL,
                naming.TUNING_PROFILE_LABEL,
                naming.REVISION_LABEL,
                naming.MODEL_LABEL,
                naming.ROLE_LABEL,
                QUEUE_LABEL,
            ),
            "annotations": _pick(
                meta.get("annotations"),
                naming.MODEL_ANNOTATION,
                naming.RECORD_ANNOTATION,
                naming.GPU_GATE_ANNOTATION,
            ),
            "owner": owning_profile(meta),
        },
        "spec": _pick(
            body.get("spec"), "completions", "completionMode", "backoffLimitPerIndex", "suspend"
        ),
        "status": {
            **_pick(
                status,
                "active",
                "ready",
                "failed",
                "succeeded",
                "startTime",
                "completedIndexes",
                "failedIndexes",
            ),
            "conditions": [
                _pick(c, "type", "status", "reason", "message")
                for c in status.get("conditions") or []
                if c.get("type") in JOB_CONDITIONS_READ
            ],
        },
    }


def _container_status(cs: Mapping[str, Any]) -> dict[str, Any]:
    out = _pick(cs, "name", "image", "imageID", "restartCount")
    for key in ("state", "lastState"):
        state = cs.get(key) or {}
        if state.get("terminated"):
            out[key] = {
                "terminated": _pick(
                    state["terminated"], "exitCode", "reason", "message", "finishedAt"
                )
            }
        elif state.get("waiting"):
            out[key] = {"waiting": _pick(state["waiting"], "reason", "message")}
        elif state.get("running"):
            out[key] = {"running": {}}
    return out


def pod_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """A tuning pod: where it stands, why it waits, how its steps ended."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    return {
        "metadata": {
            **_pick(meta, "name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"),
            "labels": _pick(
                meta.get("labels"),
                naming.JOB_UID_LABEL,
                naming.PROFILE_UID_LABEL,
                naming.TUNING_PROFILE_LABEL,
                naming.REVISION_LABEL,
                naming.MODEL_LABEL,
            ),
            "owner": owning_job(meta),
        },
        "spec": {
            **_pick(spec, "nodeName"),
            "imagePullSecrets": [
                s.get("name") for s in spec.get("imagePullSecrets") or [] if s.get("name")
            ],
        },
        "status": {
            **_pick(status, "phase", "reason", "message"),
            "conditions": [
                _pick(c, "type", "status", "reason", "message")
                for c in status.get("conditions") or []
            ],
            "initContainerStatuses": [
                _container_status(c) for c in status.get("initContainerStatuses") or []
            ],
            "containerStatuses": [
                _container_status(c) for c in status.get("containerStatuses") or []
            ],
        },
    }
