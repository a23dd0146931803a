"""What the operator observes of tuning Jobs, their pods and the kubelet's Events, in status
terms: from watched objects (views.py) to JobObservations. status.py turns observations into
conditions; nothing here decides status, and nothing here calls the API: what the cache lacks
(a stuck pod's Events, a Job's, Kueue's word on a queued Job) the reconcile's gather step
reads first and passes in (Gathered). `observe_wanting` says what it looked for and did not
find there, so the gather step reads exactly that and no more.

A Job's artifact record is read where it lasts longest first: the Job's own annotation (the
operator copies it there when it first reads it), then the publish step's termination message
in a pod, then the profile's status (a Job whose pods were deleted or garbage-collected after
the record was served). Only the first two are a fresh word from the Job.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from tunefleet import naming
from tunefleet.api.conditions import Reason
from tunefleet.artifacts import fit
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.placement import gate
from tunefleet.reconciler.diagnose import (
    Hints,
    newest_first,
    pod_blocker,
    pod_create_failure,
    pod_failure,
    pull_secrets_missing,
    terminated,
)

JobState = Literal["Pending", "Running", "Succeeded", "Failed"]
# The steps whose termination message is the artifact record (contracts/artifact_record.py).
RECORD_STEPS = ("publish", "merge")


@dataclass(frozen=True)
class JobObservation:
    name: str
    model: str
    revision: str
    state: JobState
    message: str = ""
    # The publish (or merge) step's artifact record; None until it has one.
    record: ArtifactRecord | None = None
    uid: str = ""
    # Why a Job that is not finished makes no progress (Unschedulable, ImagePullFailed,
    # SecretMissing, ...): set with `message` while state is Pending.
    reason: str = ""
    # The kubelet's imageID of the tune step, once it has ended well.
    image_id: str = ""
    role: str = "tune"  # or "merge" (parallelism > 1: publishes one artifact from the shares)
    shards_done: int = 0
    shards: int = 1
    # The record came from a pod and is not on the Job yet: the operator copies it there.
    record_to_keep: bool = False
    # Attempts that failed while the Job still retries, and what the newest one said.
    failed_attempts: int = 0
    attempts: int = 1  # the Job's allowance: backoffLimit(PerIndex) + 1
    last_failure: str = ""


# What observing wants read beyond the cache: (what, the pod or Job view). "pod-events": the
# kubelet's Events about a pod; "job-events": the Job controller's about a Job; "workload":
# Kueue's word on a suspended Job (workloads.py).
Want = tuple[Literal["pod-events", "job-events", "workload"], dict[str, Any]]


@dataclass(frozen=True)
class Gathered:
    """What the reconcile's gather step read beyond the cache: Events about a pod or Job (by
    its uid), why a queued Job waits (by Job uid). What is not here is taken as not said."""

    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    queued: dict[str, str] = field(default_factory=dict)


class _Looking:
    """The reads observing makes in `Gathered`, noting each that finds nothing there."""

    def __init__(self, gathered: Gathered, wants: list[Want]) -> None:
        self.gathered, self.wants = gathered, wants

    def events(
        self, what: Literal["pod-events", "job-events"], obj: dict[str, Any]
    ) -> list[dict[str, Any]]:
        uid = (obj.get("metadata") or {}).get("uid", "")
        found = self.gathered.events.get(uid)
        if found is None:
            self.wants.append((what, obj))
            return []
        return found

    def queued(self, job: dict[str, Any]) -> str:
        uid = (job.get("metadata") or {}).get("uid", "")
        found = self.gathered.queued.get(uid)
        if found is None:
            self.wants.append(("workload", job))
            return ""
        return found


def _tune_image_id(pods: Iterable[dict[str, Any]]) -> str:
    """The imageID of the newest pod's tune step, as soon as the kubelet reports it (the step
    started): written into the Job's ConfigMap while tuning runs, it is in publish's mount by
    the time publish starts."""
    for pod in newest_first(pods):
        for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
            state = cs.get("state") or {}
            failed = (state.get("terminated") or {}).get("exitCode", 0) != 0
            if cs.get("name") == "tune" and cs.get("imageID") and not failed:
                return str(cs["imageID"])
    return ""


def _scheduled(pod: dict[str, Any]) -> bool:
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def published_record(pods: Iterable[dict[str, Any]]) -> ArtifactRecord | None:
    """The artifact record the newest pod's publish (or merge) step left on success."""
    for pod in newest_first(pods):
        for cname, term in terminated(pod):
            if cname in RECORD_STEPS and term.get("exitCode") == 0:
                record = ArtifactRecord.from_message(term.get("message"))
                if record is not None:
                    return record
    return None


# --- Jobs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """The parts of a Job view that every verdict below needs."""

    obs: JobObservation  # state Pending, no message: the verdicts replace what they know
    namespace: str
    conditions: dict[str, dict[str, Any]]
    failed_indexes: str
    kept: ArtifactRecord | None  # the record on the Job's annotation

    @property
    def retry(self) -> str:
        return (
            f"Fix the cause, then `kubectl delete job -n {self.namespace} {self.obs.name}` "
            "to tune again."
        )


def _read_job(job: dict[str, Any]) -> _Job:
    meta = job["metadata"]
    labels = meta.get("labels") or {}
    model = (meta.get("annotations") or {}).get(naming.MODEL_ANNOTATION) or labels.get(
        naming.MODEL_LABEL, ""
    )
    role = labels.get(naming.ROLE_LABEL, "tune")
    jstatus = job.get("status") or {}
    jspec = job.get("spec") or {}
    shards = int(jspec.get("completions") or 1) if role == "tune" else 1
    limit = jspec.get("backoffLimitPerIndex", jspec.get("backoffLimit"))
    obs = JobObservation(
        meta["name"],
        model,
        labels.get(naming.REVISION_LABEL, ""),
        "Pending",
        uid=meta.get("uid", ""),
        role=role,
        shards=shards,
        shards_done=_count_indexes(jstatus.get("completedIndexes") or ""),
        failed_attempts=int(jstatus.get("failed") or 0),
        attempts=int(limit) + 1 if isinstance(limit, int) else 1,
    )
    conds = {c["type"]: c for c in jstatus.get("conditions") or [] if c.get("status") == "True"}
    kept = ArtifactRecord.from_message(
        (meta.get("annotations") or {}).get(naming.RECORD_ANNOTATION)
    )
    return _Job(
        obs, meta.get("namespace", ""), conds, str(jstatus.get("failedIndexes") or ""), kept
    )


def _unfit(j: _Job, record: ArtifactRecord, hints: Hints) -> JobObservation | None:
    """A record whose identity does not fit the model (artifacts/fit.py) is not served: the
    Job counts as failed, with why (a publish from before the check, or another publisher)."""
    target = hints.fit_target(j.obs.model)
    found = fit.record_refusals(record.identity, target) if target is not None else []
    if target is None or not found:
        return None
    message = (
        f"Job {j.obs.name} published {record.uri}, which is not served: "
        f"{fit.summary(found, target)}. {j.retry}"
    )
    return replace(j.obs, state="Failed", message=message)


def _completed(
    j: _Job, pods: list[dict[str, Any]], served: ArtifactRecord | None, hints: Hints | None = None
) -> JobObservation:
    obs = j.obs
    if obs.shards > 1:  # the shares are in; the merge Job publishes the artifact
        return replace(obs, state="Succeeded", shards_done=obs.shards)
    for record in (j.kept, published_record(pods), served):
        if record is not None:
            unfit = _unfit(j, record, hints or Hints())
            if unfit is not None:
                return unfit
            break
    if j.kept is not None:
        return replace(obs, state="Succeeded", record=j.kept, image_id=_tune_image_id(pods))
    record = published_record(pods)
    if record is not None:
        image_id = _tune_image_id(pods)
        keep = replace(record, image_id=record.image_id or image_id)
        return replace(obs, state="Succeeded", record=keep, image_id=image_id, record_to_keep=True)
    if served is not None:
        # Its pods are gone (deleted, garbage-collected) but the record was read before.
        return replace(obs, state="Succeeded", record=served)
    step = "merge" if obs.role == "merge" else "publish"
    message = (
        f"Job {obs.name} completed but its {step} step left no artifact record "
        f"(termination message). {j.retry}"
    )
    return replace(obs, state="Failed", message=message)


def _failed(j: _Job, pods: list[dict[str, Any]]) -> JobObservation:
    obs = j.obs
    c = j.conditions.get("Failed") or j.conditions["FailureTarget"]
    detail = next((d for d in map(pod_failure, newest_first(pods)) if d), "")
    why = f"{c.get('reason', 'Failed')}: {c.get('message', '')}".strip()
    msg = f"Job {obs.name} failed ({why})"
    if detail:
        msg += f"; {detail}"
    if obs.shards > 1 and j.failed_indexes:
        msg += f"; shares {j.failed_indexes} of 0-{obs.shards - 1} failed"
    hint = f" Logs: `kubectl logs -n {j.namespace} job/{obs.name} --all-containers`. {j.retry}"
    return replace(obs, state="Failed", message=msg + "." + hint)


def _last_failure(pods: list[dict[str, Any]]) -> str:
    """What the newest failed attempt of a Job that still retries said."""
    failed = [p for p in newest_first(pods) if (p.get("status") or {}).get("phase") == "Failed"]
    return next((d for d in map(pod_failure, failed) if d), "a pod failed" if failed else "")


def _underway(j: _Job, pods: list[dict[str, Any]], hints: Hints) -> JobObservation:
    obs = j.obs
    if obs.failed_attempts:
        obs = replace(obs, last_failure=_last_failure(pods))
    live = [p for p in newest_first(pods) if not p["metadata"].get("deletionTimestamp")]
    live = [p for p in live if (p.get("status") or {}).get("phase") != "Failed"]
    for pod in live[:1]:
        blocker = pod_blocker(pod, obs.model, hints)
        if blocker:
            return replace(obs, message=blocker[1], reason=blocker[0])
        if _scheduled(pod):
            return replace(obs, state="Running", image_id=_tune_image_id([pod]))
    return obs


def observe_job(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    hints: Hints | None = None,
    served: ArtifactRecord | None = None,
    queued: str = "",
) -> JobObservation:
    """What one tuning Job (a view, see views.job_view) and its pods say, in status terms.
    `served`: the artifact status holds from this Job, if any (its record, read earlier);
    `queued`: why the Job waits if it is suspended (Kueue's word, workloads.py)."""
    j = _read_job(job)
    if "Complete" in j.conditions or "SuccessCriteriaMet" in j.conditions:
        return _completed(j, pods, served, hints)
    if "Failed" in j.conditions or "FailureTarget" in j.conditions:
        return _failed(j, pods)
    if gate.held(job):
        return replace(j.obs, reason=Reason.WAITING_FOR_GPU, message=_waits_for_gpu(hints))
    if (job.get("spec") or {}).get("suspend"):
        # Waiting in its queue (or suspended again by Kueue: preempted, evicted): not failing,
        # and not ours to resume.
        return replace(j.obs, reason=Reason.QUEUED, message=queued or "the Job is suspended")
    return _underway(j, pods, hints or Hints())


def _waits_for_gpu(hints: Hints | None) -> str:
    # The same words while it waits, whatever its place: a queue that moves must not rewrite
    # 10,000 statuses at each step.
    h = hints or Hints()
    where = f"nodes labelled {h.label_key}" if h.label_key else "its GPU model's nodes"
    return (
        f"waiting for a free GPU: every {h.resource or 'GPU'} of {where} is held by tunefleet's "
        "tuning Jobs; the Job starts, oldest first, as they end (not a fault; "
        "`kubectl get jobs -l app.kubernetes.io/managed-by=tunefleet` shows who holds them)"
    )


def _count_indexes(ranges: str) -> int:
    """How many indexes a Job's "1,3-5" notation names."""
    total = 0
    for part in filter(None, ranges.split(",")):
        lo, _, hi = part.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total


def pods_by_job(pods: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Pods by the Job that controls them (their controller ownerReference, views.pod_view)."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pod in pods:
        job_uid = (pod.get("metadata") or {}).get("owner")
        if job_uid:
            out[job_uid].append(pod)
    return out


def observe(
    jobs: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]],
    hints: Hints,
    served: dict[str, ArtifactRecord] | None = None,
    gathered: Gathered | None = None,
) -> list[JobObservation]:
    """Every Job that is not on its way out, observed with its pods (those it controls).
    `served`: status's artifacts by the name of the Job that made them; `gathered`: what the
    gather step read beyond the cache (Events, Kueue's word). Pure."""
    return observe_wanting(jobs, pods, hints, served, gathered)[0]


def observe_wanting(
    jobs: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]],
    hints: Hints,
    served: dict[str, ArtifactRecord] | None = None,
    gathered: Gathered | None = None,
) -> tuple[list[JobObservation], list[Want]]:
    """observe(), and what it looked for beyond the cache and did not find in `gathered`:
    the kubelet's Events about a pod stuck pulling with pull Secrets, the Job controller's
    about a started Job that has no pod, Kueue's word on a suspended Job. Pure."""
    look = _Looking(gathered or Gathered(), [])
    by_job = pods_by_job(pods)
    out = []
    for job in jobs:
        if (job.get("metadata") or {}).get("deletionTimestamp"):
            continue  # a Job on its way out (deleted to retry) is not part of the picture
        job_pods = by_job.get(job["metadata"].get("uid", ""), [])
        known = (served or {}).get(job["metadata"]["name"])
        obs = observe_job(job, job_pods, hints, known)
        if obs.reason == Reason.QUEUED:
            obs = replace(obs, message=look.queued(job) or obs.message)
        if obs.reason == Reason.IMAGE_PULL_FAILED and hints.pull_secrets and job_pods:
            # Whether a pull Secret is missing only the kubelet's Events say (the operator
            # may not read Secrets): read them for this one stuck pod, now and then.
            missing = pull_secrets_missing(look.events("pod-events", job_pods[0]))
            if missing:
                hinted = replace(hints, missing_pull_secrets=missing)
                obs = observe_job(job, job_pods, hinted, known)
        job_status = job.get("status") or {}
        started, active = job_status.get("startTime"), job_status.get("active")
        if obs.state == "Pending" and not obs.reason and not job_pods and started and not active:
            # A started Job with no pod: the Job controller's Events say whether the API
            # server refuses its pods (read only then, now and then). One it counts active
            # has its pod, only not in the cache yet (the pod watch trails the Job's in a
            # burst: reading Events for each was a list call a profile).
            refused = pod_create_failure(look.events("job-events", job))
            if refused:
                obs = replace(obs, reason=Reason.POD_CREATE_FAILED, message=refused)
        out.append(obs)
    return out, look.wants
