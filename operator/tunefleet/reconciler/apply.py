"""Every API write of a reconcile, in one place: sync_profile (reconcile.py) gathers what it
needs through the client's reads, decides with pure functions (decide.py, observe.py,
status.py, announce.py, capture's plan, delivery's checks) and carries out what they decided
here: children first (retune sets, tuning ConfigMaps and Jobs, superseded and requeued Jobs,
merges, tending, artifact ConfigMaps, retired ones), then the status, then the Events.
Nothing else on a reconcile's path writes (tests/unit/test_layering.py fails if it does).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tunefleet import kube, metrics, naming
from tunefleet.api.conditions import EventReason
from tunefleet.api.status import TuningProfileStatus
from tunefleet.builders.artifact import is_packed
from tunefleet.builders.job import (
    IMAGE_ID_KEY,
    build_merge_job,
    build_tuning_config_map,
    build_tuning_job,
    held_for_gpu,
)
from tunefleet.builders.kueue import QUEUE_LABEL
from tunefleet.capture import step as capture_step
from tunefleet.capture.store import RetuneSet, build_retune_config_map
from tunefleet.contracts.artifact import ArtifactRecord
from tunefleet.kube import Kube
from tunefleet.placement import gate
from tunefleet.reconciler import decide
from tunefleet.reconciler.announce import announce
from tunefleet.reconciler.state import Sync
from tunefleet.reconciler.status import status_changed
from tunefleet.serving import delivery
from tunefleet.storage.store import StoreError
from tunefleet.watched import views
from tunefleet.watched.views import profile_ref

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Superseded:
    """A Job of an earlier revision, and the uid of its ConfigMap when that is ours ("")."""

    job: dict[str, Any]
    config_map_uid: str


def drop_legacy_finalizer(s: Sync) -> None:
    """Versions before 0.2 held a profile's deletion with a finalizer; nothing does now."""
    meta = s.meta
    if decide.holds_legacy_finalizer(meta):
        s.client.remove_profile_finalizer(
            meta["namespace"], meta["name"], meta["uid"], meta["finalizers"],
            naming.LEGACY_FINALIZER,
        )  # fmt: skip


def freeze_retunes(s: Sync, planned: capture_step.Planned) -> list[RetuneSet]:
    """Make the retune sets the capture step froze (each a ConfigMap of its own); one that
    cannot be made is taken back from the plan, with why, and retried at the next reconcile."""
    made = []
    for frozen in list(planned.plan.freezes):
        try:
            s.client.create_owned(build_retune_config_map(frozen))
            made.append(frozen)
        except (kube.NotOurs, kube.Temporary, kube.Permanent) as e:
            log.info(f"TuningProfile {planned.where}: retune of {frozen.model}: {e}")
            planned.revert(frozen.model, str(e))
    return made


def remove_retune_sets(s: Sync, stale: list[RetuneSet]) -> None:
    """Retune sets no status entry names (capture_step.stale_sets): nothing mounts them, and
    each is up to 900 KiB: they do not pile up in etcd."""
    for old in stale:
        try:
            s.client.delete_owned("ConfigMap", old.namespace, old.name, old.uid)
        except (kube.Temporary, kube.Permanent) as e:
            log.info(f"retune set {old.namespace}/{old.name} not removed now: {e}")


def create_missing(s: Sync, todo: list[str]) -> None:
    """A ConfigMap and a Job for each GPU model decided (decide.models_to_tune); a Job made is
    observed in this very pass, what the API server refused is said in status."""
    for model in todo:
        child = s.child(model)
        try:
            job = _gated(s, build_tuning_job(child))
            if not gate.held(job):
                # The ConfigMap first: the Job's pod mounts it. A Job the GPU gate holds has
                # no pod yet; its ConfigMap is made when it starts (_config_before_start), so
                # a burst of profiles on few GPUs costs the API server one write fewer each.
                s.client.create_owned(build_tuning_config_map(child))
            made = s.client.create_owned(job)
            if made is not None:
                if not (made.get("spec") or {}).get("suspend") or gate.held(made):
                    # Observed in this reconcile's status: the watch's echo of it then finds
                    # the status already saying so (one status write a Job fewer). Not a
                    # suspended (Kueue) one: Kueue cannot have made its Workload yet, and why
                    # it waits is Kueue's to say once it has (its echo's reconcile reads it).
                    # One the GPU gate holds says why at once.
                    s.jobs = [*s.jobs, views.job_view(made)]
                    s.memory.made.add(made["metadata"]["uid"])
                name, ns = job["metadata"]["name"], s.meta["namespace"]
                log.info(f"created tuning Job {ns}/{name} for TuningProfile {s.meta['name']}")
                if not gate.held(made):  # one held says so in status; its Event is its start
                    s.events.append(
                        ("Normal", EventReason.TUNING_JOB_CREATED, f"Created tuning Job {name}.")
                    )
        except kube.Permanent as e:
            # The API server refused what the spec made: a spec problem to report.
            s.problems.append(f"gpu model {model}: {e}")
            return
        except kube.NotOurs as e:
            # Someone else's object sits under our deterministic name: never use it.
            s.create_error = kube.Temporary(str(e), delay=30)
            return
        except kube.Temporary as e:
            # Quota, RBAC, an API hiccup: say so in status, then retry with backoff.
            s.create_error = e
            return


def _gated(s: Sync, job: dict[str, Any]) -> dict[str, Any]:
    """The Job as the GPU gate lets it be made: started, or suspended while every GPU of its
    model is held by our Jobs (placement/gate.py). Kueue's Jobs are Kueue's to hold."""
    if s.gate is None or (job.get("spec") or {}).get("suspend"):
        return job
    d = gate.demand(job)
    return job if d is None or s.gate.may_start(d) else held_for_gpu(job)


def start_admitted(s: Sync, jobs: list[dict[str, Any]]) -> None:
    """Start the Jobs the GPU gate let go (decide.admitted); each is observed started in
    this very pass."""
    ns, uid = s.meta["namespace"], s.meta["uid"]
    for job in jobs:
        name = job["metadata"]["name"]
        if not _config_before_start(s, job):
            continue
        if s.client.patch_owned("Job", ns, name, uid, {"spec": {"suspend": False}}):
            log.info(f"Job {ns}/{name}: a GPU is free; started")
            s.events.append(
                ("Normal", EventReason.TUNING_JOB_STARTED,
                 f"Started tuning Job {name}: a GPU of its model is free.")
            )  # fmt: skip
            started = {**job, "spec": {**(job.get("spec") or {}), "suspend": False}}
            s.jobs = [started if j is job else j for j in s.jobs]


def _config_before_start(s: Sync, job: dict[str, Any]) -> bool:
    """Make the tuning ConfigMap of a Job the GPU gate held (create_missing left it out) before
    anything may start the Job: its pod mounts it. False when it cannot be made now: the Job
    stays held and the next pass tries again (a ConfigMap already there, ours, is kept)."""
    child = s.child(decide.model_of(job))
    if child.name() != job["metadata"]["name"]:
        return True  # not the current revision's: decide.admitted and queue_moves skip those
    try:
        s.client.create_owned(build_tuning_config_map(child))
    except (kube.Temporary, kube.Permanent, kube.NotOurs) as e:
        log.info(f"Job {s.meta['namespace']}/{child.name()} not started now: {e}")
        return False
    return True


def stop_superseded(s: Sync, jobs: list[Superseded]) -> None:
    """Jobs of an earlier revision (decide.superseded) are not served: stop the running ones
    (their sync sidecar keeps what they tuned: its final checkpoint, and a library entry) and
    remove the finished ones, with their ConfigMaps (ours, as read) and pods. Their artifacts
    stay in status.history."""
    ns = s.meta["namespace"]
    for gone in jobs:
        meta = gone.job["metadata"]
        rev = s.rev(decide.model_of(gone.job))
        name = meta["name"]
        s.client.delete_owned("Job", ns, name, meta["uid"])
        if gone.config_map_uid:
            s.client.delete_owned("ConfigMap", ns, name, gone.config_map_uid)
        log.info(f"TuningProfile {ns}/{s.meta['name']}: removed Job {name} of an earlier revision")
        s.events.append(
            (
                "Normal",
                EventReason.SUPERSEDED,
                f"Removed tuning Job {name} of revision "
                f"{meta['labels'].get(naming.REVISION_LABEL)}: revision {rev} replaces it.",
            )
        )


def follow_queue(s: Sync, moves: list[decide.QueueMove]) -> None:
    """A Job that has not started follows spec.tuning.queueName: moved to the new LocalQueue
    (Kueue takes a suspended Job's new label), or, once the spec names none, made again
    outside Kueue (a suspended Job nobody admits would wait forever; tunefleet never resumes
    one). A running Job keeps its queue, and its name never changes."""
    ns, uid = s.meta["namespace"], s.meta["uid"]
    for move in moves:
        meta = move.job["metadata"]
        if move.action == "relabel":
            # Kueue starts it without us: a Job the gate held needs its ConfigMap first.
            if gate.held(move.job) and not _config_before_start(s, move.job):
                continue
            patch = {"metadata": {"labels": {QUEUE_LABEL: move.queue}}}
            if s.client.patch_owned("Job", ns, meta["name"], uid, patch):
                log.info(f"Job {ns}/{meta['name']}: moved to Kueue LocalQueue {move.queue}")
        else:
            s.client.delete_owned("Job", ns, meta["name"], meta["uid"])
            log.info(f"Job {ns}/{meta['name']}: no queue any more; made again outside Kueue")


def merge(s: Sync, models: list[str]) -> None:
    """The merge Job of each sharded model whose shares are in (decide.merges_due)."""
    for model in models:
        s.client.create_owned(build_merge_job(s.child(model)))


def tend(s: Sync, ops: list[decide.Tend]) -> None:
    """Tell publish which image tune ran (through the Job's ConfigMap, for the manifest); keep
    a record read from a pod on its Job, where it outlives the pods; make a ConfigMap that
    someone deleted again (the pod waits for it): what decide.tend says."""
    ns, uid = s.meta["namespace"], s.meta["uid"]
    for op in ops:
        if op.image_id:
            s.client.patch_owned(
                "ConfigMap", ns, op.name, uid, {"data": {IMAGE_ID_KEY: op.image_id}}
            )
            s.memory.image_ids[op.uid] = op.image_id
        if op.record:
            kept = {"metadata": {"annotations": {naming.RECORD_ANNOTATION: op.record}}}
            s.client.patch_owned("Job", ns, op.name, uid, kept)
        if op.config_map_of:
            s.client.create_owned(build_tuning_config_map(s.child(op.config_map_of)))


def relabel(s: Sync, there: dict[str, Any], record: ArtifactRecord) -> None:
    """Put the artifact ConfigMap's labels back (only on the object controlled by this
    profile, fenced by the resourceVersion read: kube.patch_owned)."""
    meta, uid = there.get("metadata") or {}, str(s.meta.get("uid") or "")
    want = naming.artifact_config_map_labels(uid)
    labels = meta.get("labels") or {}
    if all(labels.get(k) == v for k, v in want.items()):
        return  # the watch has not caught up with one just made: nothing to put back
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    try:
        if not s.client.patch_owned("ConfigMap", ns, name, uid, {"metadata": {"labels": want}}):
            return
    except (kube.Temporary, kube.Permanent) as e:
        log.warning(f"ConfigMap {ns}/{name} lost its labels; labelling it again failed: {e}")
        return
    s.remade.append(
        f"{record.gpu_model or '?'}: the ConfigMap {name} of artifact "
        f"{record.sha256[:12]} had lost its labels (so new pods could not mount "
        "it); labelled again"
    )
    metrics.CONFIG_MAPS_REMADE.inc()


def place_config_map(
    client: Kube, cm: dict[str, Any], record: ArtifactRecord
) -> delivery.Delivered:
    """Make the artifact's ConfigMap (delivery.artifact_config_map), or take the one under
    its name if it holds exactly the artifact; a foreign one is stepped around under a name
    derived from its uid (delivery.NAMES_TRIED names)."""
    namespace = cm["metadata"]["namespace"]
    uid = views.owning_profile(cm["metadata"]) or ""  # the profile it is made for
    base = name = cm["metadata"]["name"]
    foreign: list[delivery.Foreign] = []
    for _ in range(delivery.NAMES_TRIED):
        cm["metadata"]["name"] = name
        there, made = _create_or_read(client, cm, namespace, name)
        meta = there.get("metadata") or {}
        # What we made holds the verified bytes; what we found is judged by what it holds.
        problem = (
            ""
            if made
            else delivery.content_problem(there, record.sha256, record.manifest_sha256, uid)
        )
        if not problem:
            log.info(f"delivered {record.uri} as ConfigMap {namespace}/{name}")
            return delivery.Delivered(
                name, str(meta.get("uid") or ""), is_packed(cm), tuple(foreign)
            )
        squatter = str(meta.get("uid") or "")
        foreign.append(delivery.Foreign(name, squatter, problem))
        log.warning(
            f"ConfigMap {namespace}/{name} is not the artifact {record.sha256[:12]} ({problem}): "
            "never mounted; delivering under another name"
        )
        name = delivery.next_name(base, squatter)
    raise delivery.DeliveryError(
        f"{delivery.NAMES_TRIED} objects under the names of the artifact's ConfigMap are not it "
        f"({', '.join(f.name for f in foreign)}); pods fetch it from the store",
        tuple(foreign),
    )


def _create_or_read(
    client: Kube, cm: dict[str, Any], namespace: str, name: str
) -> tuple[dict[str, Any], bool]:
    """What stands under `name` once we tried to make `cm` there, and whether we made it."""
    try:
        made = client.create_owned(cm)
    except kube.NotOurs:
        made = None  # judged by content, like any object found there
    if made is not None:
        return made, True
    there = client.read("ConfigMap", namespace, name)
    if there is None:
        raise StoreError(f"ConfigMap {namespace}/{name} vanished as it was made")
    return there, False


def retire_config_maps(s: Sync, unused: list[tuple[str, str]]) -> None:
    """Delete the artifact ConfigMaps nothing uses any more (delivery.to_retire)."""
    ns = s.meta["namespace"]
    for name, uid in unused:
        s.client.delete_owned("ConfigMap", ns, name, uid)
        log.info(f"removed artifact ConfigMap {ns}/{name}: no status or pod names it")


def write_status(s: Sync, typed: TuningProfileStatus) -> dict[str, Any]:
    """Write status (the model's one serialisation, returned) only when it changed, over the
    version it was computed from; then what the change announces (Events, capture's Events,
    retune metrics)."""
    status = typed.to_status()
    previous = s.profile.get("status") or {}
    if not status_changed(previous, status):
        return status
    rv = str(s.meta.get("resourceVersion") or "")
    written = s.client.replace_profile_status(s.meta["namespace"], s.meta["name"], rv, status)
    s.memory.written_rv = written
    s.on_written(written, status)
    said = announce(s.profile, previous, status, s.unadmitted)
    s.events += [*said, *s.capture.events]
    for reason in s.capture.retunes:
        metrics.RETUNES.labels(reason).inc()
    return status


def post_events(s: Sync) -> None:
    """Every Event the reconcile has to say, by one route, after its writes: what it made
    stays said even when its status write did not land."""
    ref = profile_ref(s.profile)
    for type_, reason, message in s.events:
        s.client.post_event_soon(ref, type_, reason, message)
