"""The reconcile's decisions about a profile's children, as pure functions of what the cache
holds: which GPU models need a tuning Job, which Jobs an earlier revision left, which queued
Jobs follow a changed queue, which sharded models are ready to merge. decide.plan builds the
reconcile's plan from them; they read no API and write nothing, so their unit tests need no
fake API (tests/unit/test_children.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tunefleet import naming
from tunefleet.api.conditions import Reason
from tunefleet.builders.kueue import QUEUE_LABEL
from tunefleet.placement import gate
from tunefleet.reconciler.observe import JobObservation

Revision = Callable[[str], str]  # GPU model -> the revision it tunes under now


def model_of(job: dict[str, Any]) -> str:
    """The GPU model a Job tunes (its annotation; the label of older versions)."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    return str(
        (meta.get("annotations") or {}).get(naming.MODEL_ANNOTATION)
        or labels.get(naming.MODEL_LABEL, "")
    )


def present(jobs: Iterable[dict[str, Any]], role: str = "tune") -> set[tuple[str, str]]:
    """(model, revision) of the profile's Jobs of one role; names of older versions count too."""
    out = set()
    for job in jobs:
        labels = (job.get("metadata") or {}).get("labels") or {}
        if labels.get(naming.ROLE_LABEL, "tune") == role:
            out.add((model_of(job), labels.get(naming.REVISION_LABEL, "")))
    return out


def models_to_tune(
    models: Sequence[str],
    revision: Revision,
    jobs: Iterable[dict[str, Any]],
    served: Iterable[str],
    too_few: Iterable[str],
) -> list[str]:
    """GPU models, in the spec's order, with neither a Job nor an artifact of their current
    revision (a finished Job removed after its record was served is not made again: deleting
    a failed Job is how to retry), and enough nodes for their parallelism."""
    have, done, short = present(jobs), set(served), set(too_few)
    return [m for m in models if (m, revision(m)) not in have and m not in short and m not in done]


def superseded(jobs: Iterable[dict[str, Any]], revision: Revision) -> list[dict[str, Any]]:
    """Jobs of an earlier revision than their model's current one, not already going."""
    out = []
    for job in jobs:
        meta = job["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        if meta["labels"].get(naming.REVISION_LABEL) != revision(model_of(job)):
            out.append(job)
    return out


@dataclass(frozen=True)
class QueueMove:
    """A Job that has not started, following spec.tuning.queueName: `relabel` moves it to
    the new LocalQueue (Kueue takes a suspended Job's new label); `remake` deletes it to be
    made again outside Kueue (a suspended Job nobody admits would wait forever)."""

    action: Literal["relabel", "remake"]
    job: dict[str, Any]
    queue: str = ""


def queue_moves(jobs: Iterable[dict[str, Any]], want: str | None, revision: str) -> list[QueueMove]:
    """What follows a changed spec.tuning.queueName (`want`, None or "" for none) among the current
    revision's Jobs: only suspended ones that never started; a running Job keeps its queue."""
    out = []
    for job in jobs:
        meta = job["metadata"]
        labels = meta.get("labels") or {}
        have = labels.get(QUEUE_LABEL)
        suspended = bool((job.get("spec") or {}).get("suspend"))
        if meta.get("deletionTimestamp") or labels.get(naming.REVISION_LABEL) != revision:
            continue
        if not suspended or (job.get("status") or {}).get("startTime") or have == want:
            continue
        if want and (have or gate.held(job)):
            # A Job the GPU gate holds goes to the queue named since: Kueue's from then on.
            out.append(QueueMove("relabel", job, want))
        elif not want and have:
            out.append(QueueMove("remake", job))
    return out


def admitted(
    jobs: Iterable[dict[str, Any]], let_go: Callable[[str], bool], revision: Revision
) -> list[dict[str, Any]]:
    """The current revision's Jobs the GPU gate holds and has let go (placement/gate.py):
    the reconcile starts them."""
    out = []
    for job in jobs:
        meta = job["metadata"]
        if not gate.held(job) or meta.get("deletionTimestamp"):
            continue
        current = (meta.get("labels") or {}).get(naming.REVISION_LABEL) == revision(model_of(job))
        if current and let_go(meta.get("uid", "")):
            out.append(job)
    return out


def merges_due(
    observations: Iterable[JobObservation], revision: Revision, jobs: Iterable[dict[str, Any]]
) -> list[str]:
    """GPU models whose sharded tuning Job of the current revision has every share in, and no
    merge Job yet: one Job merges the shares into the artifact."""
    merged = present(jobs, role="merge")
    out = []
    for obs in observations:
        rev = revision(obs.model)
        shares_done = obs.role == "tune" and obs.shards > 1 and obs.state == "Succeeded"
        if shares_done and obs.revision == rev and (obs.model, rev) not in merged:
            out.append(obs.model)
    return out


def holds_legacy_finalizer(meta: dict[str, Any]) -> bool:
    """Versions before 0.2 held a profile's deletion with a finalizer; nothing does now."""
    return naming.LEGACY_FINALIZER in (meta.get("finalizers") or [])


@dataclass(frozen=True)
class Tend:
    """What to do for one observed Job beyond its status: the image id tune ran to tell
    publish (its ConfigMap), the record read from its pod to keep on it, the GPU model whose
    tuning ConfigMap to make again (someone deleted it; the pod waits for it)."""

    name: str
    uid: str
    image_id: str = ""
    record: str = ""
    config_map_of: str = ""


def tend(
    observations: Iterable[JobObservation], image_ids: dict[str, str], has_spec: bool
) -> list[Tend]:
    """What each running or finished Job needs (image_ids: what each Job's ConfigMap was told
    already, by Job uid)."""
    out = []
    for obs in observations:
        image_id = ""
        if obs.state == "Running" and obs.image_id and image_ids.get(obs.uid) != obs.image_id:
            image_id = obs.image_id
        record = obs.record.to_message() if obs.record_to_keep and obs.record is not None else ""
        missing = obs.model if obs.reason == Reason.CONFIG_MAP_MISSING and has_spec else ""
        if image_id or record or missing:
            out.append(Tend(obs.name, obs.uid, image_id, record, missing))
    return out
