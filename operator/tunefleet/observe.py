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

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from tunefleet import naming
from tunefleet.artifacts import fit
from tunefleet.conditions import Reason
from tunefleet.contracts.artifact import ArtifactRecord

JobState = Literal["Pending", "Running", "Succeeded", "Failed"]
# The steps whose termination message is the artifact record (contracts/artifact.py).
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
# Kueue's word on a suspended Job (kueue.py).
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


@dataclass(frozen=True)
class Hints:
    """What the spec says about a tuning pod, so a stuck pod's message can name the fix."""

    label_key: str = ""
    resource: str = ""
    credentials_secret: str = ""
    credentials_kind: str = "storage credentials"
    credential_keys: tuple[str, ...] = ()
    pull_secrets: tuple[str, ...] = ()
    # Taint keys spec.template.spec.tolerations adds to the GPU resource's.
    tolerations: tuple[str, ...] = ()
    # Named by the kubelet's FailedToRetrieveImagePullSecret Events, when they were read.
    missing_pull_secrets: tuple[str, ...] = ()
    # What a published record must fit (artifacts/fit.py): spec.gpu.vendor ("" when unknown:
    # records are taken as they are) and the operator's stand-in models (config).
    gpu_vendor: str = ""
    stand_in_models: tuple[str, ...] = ()

    def fit_target(self, model: str) -> fit.Target | None:
        if not self.gpu_vendor:
            return None
        stand_in = fit.is_stand_in_model(model, self.stand_in_models)
        return fit.Target(model, self.gpu_vendor, stand_in)


# --- pods -------------------------------------------------------------------------------------


def _statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    st = pod.get("status") or {}
    return list(st.get("initContainerStatuses") or []) + list(st.get("containerStatuses") or [])


def _terminated(pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for cs in _statuses(pod):
        for key in ("state", "lastState"):
            term = (cs.get(key) or {}).get("terminated")
            if term:
                out.append((cs["name"], term))
                break
    return out


# runc's words when the tune step's command is not in the image: `exec: "python3": executable
# file not found in $PATH` (the tune container starts python3 directly, without a shell).
_NOT_FOUND_RE = re.compile(r'exec: "([^"]+)": (?:executable file not found|stat \S+: no such file)')


def start_failure(step: str, image: str, message: str) -> str | None:
    """tunefleet's own words for a container the runtime could not start, when it knows why."""
    m = _NOT_FOUND_RE.search(message)
    if m is None:
        return None
    if step == "tune":
        return (
            f"step tune cannot start: the image {image} has no {m.group(1)} on its PATH. "
            f"tunefleet starts the tuner as `{m.group(1)} /tunefleet/tools/tuner_job` without a "
            "shell (an image without /bin/sh works, one without Python cannot tune): tune in the "
            f"image that serves, with Python 3 and torch (a {m.group(1)} symlink to the image's "
            f"python is enough). runtime: {' '.join(message.split())}"
        )
    return (
        f"step {step} cannot start: {m.group(1)} is not in its image ({' '.join(message.split())})"
    )


def _image_of(pod: dict[str, Any], name: str) -> str:
    """A step's image: its status says (the cache's pod view keeps no container specs), else
    its spec."""
    status, spec = pod.get("status") or {}, pod.get("spec") or {}
    for c in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
        *(spec.get("initContainers") or []),
        *(spec.get("containers") or []),
    ]:
        if c.get("name") == name and c.get("image"):
            return str(c["image"])
    return "?"


def _pod_failure(pod: dict[str, Any]) -> str:
    """The most telling line a failed tuning pod left: a container's own message first."""
    for name, term in _terminated(pod):
        if term.get("exitCode", 0) != 0:
            told = start_failure(name, _image_of(pod, name), term.get("message") or "")
            if told:
                return told
            msg = (term.get("message") or "").strip().splitlines()
            detail = msg[-1] if msg else term.get("reason") or "no message"
            return f"container {name} exited {term.get('exitCode')}: {detail}"
    for cs in _statuses(pod):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "PodInitializing", "ContainerCreating"):
            detail = f"{waiting.get('reason')}: {waiting.get('message', '')}"
            return f"container {cs['name']} {detail}".strip()
    message = (pod.get("status") or {}).get("message")
    return str(message) if message else ""


def _newest_first(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True)


_SCHED_RE = re.compile(r"^0/(\d+) nodes are available: (.*?)\.(?: preemption:.*)?$", re.S)
_SCHED_PART_RE = re.compile(r"(\d+) (.+)")
_SECRET_RE = re.compile(r'secret "([^"]+)" not found', re.I)
_SECRET_KEY_RE = re.compile(r"couldn't find key (\S+) in Secret (\S+)", re.I)
_CONFIGMAP_RE = re.compile(r'configmaps? "([^"]+)" not found', re.I)
PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
CONTAINER_ERRORS = frozenset({"CreateContainerError", "RunContainerError", "StartError"})


def explain_unschedulable(message: str, model: str, hints: Hints) -> str:
    """The scheduler's verdict in the user's terms, then the scheduler's own words."""
    key, res = hints.label_key or "the GPU model label", hints.resource or "GPUs"
    tolerated = f"{res} only" if not hints.tolerations else ", ".join((res, *hints.tolerations))
    tolerate_more = "; add the taint to spec.template.spec.tolerations"
    why = "no node can take the tuning pod"
    m = _SCHED_RE.match(message.strip())
    if m:
        total = int(m.group(1))
        parts: dict[str, int] = {}
        for part in m.group(2).split(", "):
            pm = _SCHED_PART_RE.match(part.strip())
            if pm:
                parts[pm.group(2)] = parts.get(pm.group(2), 0) + int(pm.group(1))
        mismatched = sum(n for p, n in parts.items() if "didn't match Pod's node affinity" in p)
        # The scheduler checks taints before labels: a node of another tainted pool (another
        # vendor's GPUs, say) is counted here whatever its labels.
        tainted = sum(n for p, n in parts.items() if "untolerated taint" in p)
        if total and mismatched and mismatched + tainted >= total:
            why = f"no node has {key}={model}"
            if tainted:
                why += (
                    f" among those the tuning pod tolerates ({tainted} more have a taint it "
                    f"does not tolerate: it tolerates {tolerated})"
                )
            why += (
                f": label the nodes that have this GPU (kubectl label node <node> "
                f"{key}={model}) or fix spec.gpu.models"
            )
        elif any(p == f"Insufficient {res}" for p in parts):
            why = (
                f"every node with {key}={model} has its {res} in use: the Job starts when "
                "one is free (or lower spec.gpu.count)"
            )
        elif any("untolerated taint" in p for p in parts):
            why = (
                f"the nodes with {key}={model} have a taint the tuning pod does not tolerate "
                f"(it tolerates {tolerated}){tolerate_more}"
            )
    return f"{why} (scheduler: {' '.join(message.split())})"


def pull_secrets_missing(events: list[dict[str, Any]]) -> tuple[str, ...]:
    """Names from the kubelet's "Unable to retrieve some image pull secrets (a, b)" Events."""
    names: list[str] = []
    for ev in events:
        if ev.get("reason") != "FailedToRetrieveImagePullSecret":
            continue
        m = re.search(r"image pull secrets \(([^)]*)\)", ev.get("message") or "")
        if m:
            names += [n.strip() for n in m.group(1).split(",") if n.strip()]
    return tuple(dict.fromkeys(names))


def _pull_failure(step: str, image: str, reason: str, msg: str, ns: str, hints: Hints) -> str:
    text = f"step {step} cannot pull image {image}: {reason}: {msg}"
    if hints.missing_pull_secrets:
        missing = ", ".join(hints.missing_pull_secrets)
        return text + (
            f". The image pull Secret(s) {missing} do not exist in namespace {ns}: create them "
            f"(kubectl create secret docker-registry -n {ns} ...) or fix spec.imagePullSecrets"
        )
    if hints.pull_secrets:
        return text + (
            f". It pulls with imagePullSecrets {', '.join(hints.pull_secrets)}: check that they "
            "hold credentials for this registry"
        )
    return text + ". Check the image reference, or add spec.imagePullSecrets for a private registry"


def _config_error(step: str, msg: str, ns: str, hints: Hints) -> tuple[Reason, str]:
    sm, km, cm = _SECRET_RE.search(msg), _SECRET_KEY_RE.search(msg), _CONFIGMAP_RE.search(msg)
    if sm:
        name = sm.group(1)
        if name == hints.credentials_secret:
            literals = " ".join(f"--from-literal={k}=..." for k in hints.credential_keys)
            fix = (
                f"Secret {name} ({hints.credentials_kind} for publishing) does not exist in "
                f"namespace {ns}: create it with kubectl create secret generic {name} -n {ns} "
                f"{literals}, or name another in spec.storage.credentialsSecret"
            )
        else:
            fix = (
                f"Secret {name}, referenced by spec.workload.env or "
                f"spec.template.tune.envFrom, does not exist in namespace "
                f"{ns}: create it or fix the reference"
            )
        return Reason.SECRET_MISSING, f"step {step} cannot start: {fix}"
    if km:
        keys = " and ".join(hints.credential_keys) or "the keys the reference names"
        return Reason.SECRET_MISSING, (
            f"step {step} cannot start: Secret {km.group(2)} has no key {km.group(1)}: add it "
            f"({hints.credentials_kind} need {keys})"
        )
    if cm:
        return Reason.CONFIG_MAP_MISSING, f"step {step} cannot start: {msg}"
    return Reason.CONTAINER_CONFIG_ERROR, f"step {step} cannot start: {msg}"


def pod_blocker(pod: dict[str, Any], model: str, hints: Hints) -> tuple[Reason, str] | None:
    """(reason, message) when a tuning pod that has not finished cannot make progress."""
    ns = (pod.get("metadata") or {}).get("namespace", "")
    for c in (pod.get("status") or {}).get("conditions") or []:
        if (c.get("type"), c.get("status"), c.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            message = explain_unschedulable(c.get("message") or "", model, hints)
            return Reason.UNSCHEDULABLE, message
    for cs in _statuses(pod):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason, msg = waiting.get("reason") or "", " ".join((waiting.get("message") or "").split())
        step = cs.get("name", "?")
        if reason in PULL_REASONS:
            image = cs.get("image", "?")
            return Reason.IMAGE_PULL_FAILED, _pull_failure(step, image, reason, msg, ns, hints)
        if reason == "CreateContainerConfigError":
            return _config_error(step, msg, ns, hints)
        if reason in CONTAINER_ERRORS:
            told = start_failure(step, cs.get("image") or _image_of(pod, step), msg)
            return Reason.CONTAINER_ERROR, told or f"step {step} cannot start: {reason}: {msg}"
    return None


# What in the API server's refusal of a pod points at which field of the spec.
_CREATE_FIXES = (
    ("service account", "spec.template.spec.serviceAccountName"),
    ("serviceaccount", "spec.template.spec.serviceAccountName"),
    ("priorityclass", "spec.template.spec.priorityClassName"),
    ("runtimeclass", "spec.template.spec.runtimeClassName"),
    ("exceeded quota", "the namespace's ResourceQuota (or spec.template.tune.resources)"),
)


def pod_create_failure(events: list[dict[str, Any]]) -> str | None:
    """The newest of the Job controller's FailedCreate Events about a Job, with the fix."""
    failed = [e for e in events if e.get("reason") == "FailedCreate"]
    if not failed:
        return None
    newest = max(failed, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    said = " ".join(str(newest.get("message") or "").split())
    fix = next((f for key, f in _CREATE_FIXES if key in said.lower()), "the spec")
    return (
        f"the Job controller cannot create the tuning pod ({said}): create what it names, or "
        f"fix {fix}"
    )


def _tune_image_id(pods: Iterable[dict[str, Any]]) -> str:
    """The imageID of the newest pod's tune step, as soon as the kubelet reports it (the step
    started): written into the Job's ConfigMap while tuning runs, it is in publish's mount by
    the time publish starts."""
    for pod in _newest_first(pods):
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
    for pod in _newest_first(pods):
        for cname, term in _terminated(pod):
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
    detail = next((d for d in map(_pod_failure, _newest_first(pods)) if d), "")
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
    failed = [p for p in _newest_first(pods) if (p.get("status") or {}).get("phase") == "Failed"]
    return next((d for d in map(_pod_failure, failed) if d), "a pod failed" if failed else "")


def _underway(j: _Job, pods: list[dict[str, Any]], hints: Hints) -> JobObservation:
    obs = j.obs
    if obs.failed_attempts:
        obs = replace(obs, last_failure=_last_failure(pods))
    live = [p for p in _newest_first(pods) if not p["metadata"].get("deletionTimestamp")]
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
    `queued`: why the Job waits if it is suspended (Kueue's word, kueue.py)."""
    j = _read_job(job)
    if "Complete" in j.conditions or "SuccessCriteriaMet" in j.conditions:
        return _completed(j, pods, served, hints)
    if "Failed" in j.conditions or "FailureTarget" in j.conditions:
        return _failed(j, pods)
    if (job.get("spec") or {}).get("suspend"):
        # Waiting in its queue (or suspended again by Kueue: preempted, evicted): not failing,
        # and not ours to resume.
        return replace(j.obs, reason=Reason.QUEUED, message=queued or "the Job is suspended")
    return _underway(j, pods, hints or Hints())


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
