"""From what the operator observes to TuningProfile status: pure functions, no API calls.

The status is recomputed from scratch from the Jobs each time (level-based), so a missed or
repeated event never leaves it wrong, and it is written only when it changes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from tunefleet import naming
from tunefleet.api import TuningProfileSpec

JobState = Literal["Pending", "Running", "Succeeded", "Failed"]
HISTORY_LIMIT = 10


@dataclass(frozen=True)
class JobObservation:
    name: str
    model: str
    revision: str
    state: JobState
    message: str = ""
    # The publish step's termination message, parsed; None until it has one.
    result: dict[str, Any] | None = None
    uid: str = ""
    # Why a Job that is not finished makes no progress (Unschedulable, ImagePullFailed,
    # SecretMissing, ...): set with `message` while state is Pending.
    reason: str = ""
    # The kubelet's imageID of the tune step, once it has ended well.
    image_id: str = ""
    role: str = "tune"  # or "merge" (parallelism > 1: publishes one artifact from the shares)
    shards_done: int = 0
    shards: int = 1


@dataclass(frozen=True)
class Observed:
    generation: int
    spec: TuningProfileSpec | None
    problems: list[str] = field(default_factory=list)
    jobs: list[JobObservation] = field(default_factory=list)
    previous: dict[str, Any] = field(default_factory=dict)
    # Labelled pods the webhook never saw (created while it was unreachable).
    unadmitted: int = 0
    # A tuning Job (or its ConfigMap) could not be made just now; retried with backoff.
    create_error: str = ""
    # Models whose Jobs were not started because too few nodes have them (parallelism).
    capacity: dict[str, str] = field(default_factory=dict)


def parse_result(message: str | None) -> dict[str, Any] | None:
    """The publish step's termination message, or None when it isn't one."""
    if not message:
        return None
    try:
        data = json.loads(message.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    if not isinstance(data, dict) or not {"uri", "sha256"} <= data.keys():
        return None
    return data


def artifact_from(job: JobObservation) -> dict[str, Any]:
    result = job.result or {}
    artifact: dict[str, Any] = {
        "gpuModel": job.model,
        "uri": str(result["uri"]),
        "sha256": str(result["sha256"]),
        "revision": job.revision,
        "job": job.name,
    }
    if isinstance(result.get("gemms"), int):
        artifact["gemms"] = result["gemms"]
    if result.get("tunedAt"):
        artifact["tunedAt"] = str(result["tunedAt"])
    if isinstance(result.get("tuningSeconds"), int | float):
        artifact["tuningSeconds"] = float(result["tuningSeconds"])
    identity = result.get("identity")
    if isinstance(identity, dict):
        artifact["identity"] = {str(k): str(v) for k, v in identity.items()}
    for key in ("recorded", "reused", "resumed", "newlyTuned", "shards"):
        if isinstance(result.get(key), int) and not isinstance(result.get(key), bool):
            artifact[key] = result[key]
    if isinstance(result.get("libraryKey"), str) and result["libraryKey"]:
        artifact["libraryKey"] = result["libraryKey"]
    if isinstance(result.get("librarySkipped"), int) and result["librarySkipped"] > 0:
        artifact["librarySkipped"] = result["librarySkipped"]
        artifact["librarySkippedReason"] = str(result.get("librarySkippedReason") or "")[:300]
    outcomes = result.get("outcomes")
    if isinstance(outcomes, dict) and all(
        isinstance(outcomes.get(k), int) for k in ("tuned", "default")
    ):
        artifact["outcomes"] = {"tuned": outcomes["tuned"], "default": outcomes["default"]}
    if isinstance(result.get("manifestSha256"), str) and result["manifestSha256"]:
        artifact["manifestSha256"] = result["manifestSha256"]
    image: dict[str, Any] = result["image"] if isinstance(result.get("image"), dict) else {}
    reference, image_id = str(image.get("reference") or ""), str(image.get("id") or "")
    if reference or image_id or job.image_id:
        # The manifest's word first; the pod's own status if publish could not wait for it.
        artifact["image"] = {"reference": reference, "id": image_id or job.image_id}
    return artifact


def default_only(artifact: dict[str, Any]) -> bool:
    """No GEMM where a kernel other than Default won (unknown for artifacts without counts)."""
    outcomes = artifact.get("outcomes") or {}
    return outcomes.get("tuned") == 0 and (outcomes.get("default") or 0) > 0


def _torch_version(text: str) -> tuple[int, int] | None:
    m = re.match(r"^(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def no_gain_reason(artifact: dict[str, Any]) -> str:
    """Why a Default-only artifact came out so, in one clause."""
    identity = artifact.get("identity") or {}
    torch = identity.get("torch", "")
    version = _torch_version(torch)
    if identity.get("cuda") and not identity.get("hip") and version and version < (2, 14):
        return (
            f"torch {torch} on CUDA offers only Default; TunableOp chooses cuBLASLt kernels "
            "from torch 2.14"
        )
    return (
        "no kernel beat Default within the tuning limits (raise spec.tuning.maxDurationMs or "
        "maxIterations, or Default is simply the fastest here)"
    )


def condition(
    previous: list[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> dict[str, Any]:
    """A metav1.Condition; lastTransitionTime moves only when status flips."""
    value = "True" if status else "False"
    before = next((c for c in previous if c.get("type") == type_), None)
    since = before["lastTransitionTime"] if before and before.get("status") == value else now
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }


def _summary(artifacts: list[dict[str, Any]], models: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"gpuModels": ",".join(models)}
    current = [a for a in artifacts if a["gpuModel"] in models]
    if current:
        out["gemms"] = sum(int(a.get("gemms") or 0) for a in current)
        counted = [a for a in current if a.get("outcomes")]
        if len(counted) == len(current):
            won = sum(int(a["outcomes"]["tuned"]) for a in current)
            out["tunedGemms"] = f"{won}/{out['gemms']}"
        else:
            out["tunedGemms"] = f"?/{out['gemms']}"  # artifacts from before outcomes were counted
        flat = [a["gpuModel"] for a in current if default_only(a)]
        if flat and len(flat) == len(current):
            out["note"] = "Default only: no gain, not served"
        elif flat:
            out["note"] = f"Default only on {', '.join(flat)}"
        else:
            out["note"] = ""
        if all(isinstance(a.get("reused"), int) and a.get("recorded") for a in current):
            reused = sum(int(a["reused"]) for a in current)
            recorded = sum(int(a["recorded"]) for a in current)
            out["reuse"] = f"{reused}/{recorded}"
        else:
            out["reuse"] = ""
        out["shortSha256"] = ",".join(a["sha256"][:12] for a in current)
        tuned = [a["tunedAt"] for a in current if a.get("tunedAt")]
        if tuned:
            out["lastTunedAt"] = max(tuned)
    return out


def compute_status(obs: Observed, now: str) -> dict[str, Any]:
    prev_conditions: list[dict[str, Any]] = list(obs.previous.get("conditions") or [])
    gen = obs.generation

    def cond(type_: str, status: bool, reason: str, message: str) -> dict[str, Any]:
        return condition(prev_conditions, type_, status, reason, message, gen, now)

    prev_artifacts = {a["gpuModel"]: a for a in obs.previous.get("artifacts") or []}
    history: list[dict[str, Any]] = list(obs.previous.get("history") or [])

    if obs.spec is None or obs.problems:
        message = "; ".join(obs.problems) or "the spec is invalid"
        message = f"Invalid spec, nothing was tuned. Fix and re-apply: {message}"
        return {
            "observedGeneration": gen,
            "phase": "Invalid",
            "conditions": [
                cond("Ready", False, "InvalidSpec", message),
                cond("Progressing", False, "InvalidSpec", "No tuning Jobs for an invalid spec."),
                cond("Failed", True, "InvalidSpec", message),
            ],
            "artifacts": list(prev_artifacts.values()),
            "history": history,
            "jobs": [],
            "unadmittedPods": obs.unadmitted,
        }

    spec = obs.spec
    rev = naming.revision(spec)
    models = list(spec.gpu.models)
    mine = [j for j in obs.jobs if j.revision == rev and j.model in models]
    current: dict[str, JobObservation] = {}
    for m in models:
        found = effective([j for j in mine if j.model == m])
        if found is not None:
            current[m] = found

    artifacts: dict[str, dict[str, Any]] = {}
    for model in models:
        job = current.get(model)
        fresh = artifact_from(job) if job and job.state == "Succeeded" and job.result else None
        old = prev_artifacts.get(model)
        if fresh and old and (old["sha256"], old["uri"]) != (fresh["sha256"], fresh["uri"]):
            history.insert(0, old)
        if fresh:
            artifacts[model] = fresh
        elif old:
            artifacts[model] = old
    for model, old in prev_artifacts.items():
        if model not in models:
            history.insert(0, old)  # a model dropped from the spec: kept for the record
    history = history[:HISTORY_LIMIT]

    failed = [j for m, j in current.items() if j.state == "Failed"]
    blocked = [j for m, j in current.items() if j.state == "Pending" and j.reason]
    running = [
        m for m in models if current.get(m) is None or current[m].state in ("Pending", "Running")
    ]
    up_to_date = [m for m in models if artifacts.get(m, {}).get("revision") == rev]
    served = [m for m in models if m in artifacts]

    fail_msg = " | ".join(f"{j.model}: {j.message}" for j in failed)
    block_msg = " | ".join(f"{j.model}: {j.message}" for j in blocked)
    if failed:
        failed_cond = cond("Failed", True, "TuningFailed", fail_msg)
    else:
        failed_cond = cond("Failed", False, "NoFailures", "No tuning Job of this revision failed.")

    if obs.capacity:
        progressing = cond(
            "Progressing",
            False,
            "ParallelismTooHigh",
            " | ".join(f"{m}: {msg}" for m, msg in obs.capacity.items()) + ".",
        )
    elif obs.create_error:
        progressing = cond(
            "Progressing",
            False,
            "JobCreateFailed",
            f"{obs.create_error}. Retrying with backoff.",
        )
    elif blocked:
        progressing = cond(
            "Progressing",
            True,
            blocked[0].reason,
            f"{len(blocked)} of {len(models)} tuning Jobs cannot start. {block_msg}",
        )
    elif running:
        progressing = cond(
            "Progressing",
            True,
            "TuningJobsRunning",
            f"Tuning {len(running)} of {len(models)} GPU models: " + ", ".join(running),
        )
    else:
        progressing = cond(
            "Progressing", False, "TuningFinished", f"Tuning of revision {rev} has finished."
        )

    if len(served) == len(models):
        stale = [m for m in models if m not in up_to_date]
        if stale:
            msg = f"Serving earlier artifacts for {', '.join(stale)} while revision {rev} tunes."
            if blocked:
                msg += f" It cannot start: {block_msg}"
        else:
            msg = f"{len(models)} of {len(models)} GPU models have an artifact."
        for m in models:
            if default_only(artifacts[m]):
                msg += (
                    f" {m}: no GEMM where a kernel beat Default ({no_gain_reason(artifacts[m])}):"
                    " it gains nothing, so pods get it only with spec.serving.serveDefaultOnly."
                )
        ready = cond("Ready", True, "ArtifactsPublished", msg)
    elif obs.capacity:
        ready = cond(
            "Ready",
            False,
            "ParallelismTooHigh",
            f"No artifact for {', '.join(m for m in models if m not in served)}: "
            + " | ".join(f"{m}: {msg}" for m, msg in obs.capacity.items())
            + ".",
        )
    elif obs.create_error:
        ready = cond(
            "Ready",
            False,
            "JobCreateFailed",
            f"No artifact for {', '.join(m for m in models if m not in served)}: "
            f"{obs.create_error}. Retrying with backoff.",
        )
    elif failed:
        ready = cond(
            "Ready",
            False,
            "TuningFailed",
            f"No artifact for {', '.join(m for m in models if m not in served)}. {fail_msg}",
        )
    elif blocked:
        ready = cond(
            "Ready",
            False,
            blocked[0].reason,
            f"No artifact for {', '.join(m for m in models if m not in served)}: "
            f"{len(blocked)} tuning Job(s) cannot start. {block_msg}",
        )
    else:
        waiting = [m for m in models if m not in served]
        ready = cond(
            "Ready",
            False,
            "Tuning",
            f"Waiting for tuning Jobs of {', '.join(waiting)} to publish.",
        )

    if failed:
        phase = "Failed"
    elif len(up_to_date) == len(models):
        phase = "Ready"
    elif any(current.get(m) and current[m].state == "Running" for m in models) and not blocked:
        phase = "Tuning"
    else:
        phase = "Pending"

    ordered = [artifacts[m] for m in models if m in artifacts]
    jobs = []
    for j in sorted(mine, key=lambda j: (models.index(j.model), j.role != "tune")):
        entry: dict[str, Any] = {
            "gpuModel": j.model,
            "name": j.name,
            "state": j.state,
            "message": j.message,
        }
        if j.uid:
            entry["uid"] = j.uid
        if j.reason:
            entry["reason"] = j.reason
        if j.role == "tune" and j.shards > 1:
            entry["shards"] = f"{j.shards_done}/{j.shards}"
        jobs.append(entry)
    progress = []
    for m in models:
        now_ = current.get(m)
        if now_ is None or now_.state in ("Succeeded", "Failed"):
            continue
        tune = next((t for t in mine if t.model == m and t.role == "tune"), None)
        if now_.role == "merge" or (tune and tune.shards > 1 and tune.state == "Succeeded"):
            progress.append(f"{m}: merging")
        elif tune and tune.shards > 1:
            progress.append(f"{m}: {tune.shards_done}/{tune.shards} shards")
        else:
            progress.append(f"{m}: {now_.state.lower()}")
    return {
        "observedGeneration": gen,
        "phase": phase,
        "revision": rev,
        **_summary(ordered, models),
        "conditions": [ready, progressing, failed_cond],
        "jobs": jobs,
        "progress": "; ".join(progress),
        "artifacts": ordered,
        "history": history,
        "unadmittedPods": obs.unadmitted,
    }


def effective(jobs: list[JobObservation]) -> JobObservation | None:
    """What one model's Jobs of a revision amount to: the merge Job's word once there is
    one; a sharded tuning Job whose shares are all done is still running (merging)."""
    merge = next((j for j in jobs if j.role == "merge"), None)
    if merge is not None:
        return merge
    tune = next((j for j in jobs if j.role == "tune"), None)
    if tune is not None and tune.shards > 1 and tune.state == "Succeeded":
        return replace(tune, state="Running", result=None)
    return tune


def status_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return {k: old.get(k) for k in new} != new


def _terminated(pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    st = pod.get("status") or {}
    out = []
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        for key in ("state", "lastState"):
            term = (cs.get(key) or {}).get("terminated")
            if term:
                out.append((cs["name"], term))
                break
    return out


def _pod_failure(pod: dict[str, Any]) -> str:
    """The most telling line a failed tuning pod left: a container's own message first."""
    for name, term in _terminated(pod):
        if term.get("exitCode", 0) != 0:
            msg = (term.get("message") or "").strip().splitlines()
            detail = msg[-1] if msg else term.get("reason") or "no message"
            return f"container {name} exited {term.get('exitCode')}: {detail}"
    st = pod.get("status") or {}
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "PodInitializing", "ContainerCreating"):
            detail = f"{waiting.get('reason')}: {waiting.get('message', '')}"
            return f"container {cs['name']} {detail}".strip()
    if st.get("message"):
        return str(st["message"])
    return ""


def _newest_first(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True)


@dataclass(frozen=True)
class Hints:
    """What the spec says about a tuning pod, so a stuck pod's message can name the fix."""

    label_key: str = ""
    resource: str = ""
    credentials_secret: str = ""
    pull_secrets: tuple[str, ...] = ()
    # Named by the kubelet's FailedToRetrieveImagePullSecret Events, when they were read.
    missing_pull_secrets: tuple[str, ...] = ()


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
                    f"does not tolerate: it tolerates {res} only)"
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
                f"(it tolerates {res} only)"
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


def pod_blocker(pod: dict[str, Any], model: str, hints: Hints) -> tuple[str, str] | None:
    """(reason, message) when a tuning pod that has not finished cannot make progress."""
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace", "")
    st = pod.get("status") or {}
    for c in st.get("conditions") or []:
        if (c.get("type"), c.get("status"), c.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            return "Unschedulable", explain_unschedulable(c.get("message") or "", model, hints)
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason, msg = waiting.get("reason") or "", " ".join((waiting.get("message") or "").split())
        step = cs.get("name", "?")
        if reason in PULL_REASONS:
            text = f"step {step} cannot pull image {cs.get('image', '?')}: {reason}: {msg}"
            if hints.missing_pull_secrets:
                missing = ", ".join(hints.missing_pull_secrets)
                text += (
                    f". The image pull Secret(s) {missing} do not exist in namespace {ns}: "
                    f"create them (kubectl create secret docker-registry -n {ns} ...) or fix "
                    "spec.imagePullSecrets"
                )
            elif hints.pull_secrets:
                text += (
                    f". It pulls with imagePullSecrets {', '.join(hints.pull_secrets)}: check "
                    "that they hold credentials for this registry"
                )
            else:
                text += (
                    ". Check the image reference, or add spec.imagePullSecrets for a private "
                    "registry"
                )
            return "ImagePullFailed", text
        if reason == "CreateContainerConfigError":
            sm, km, cm = (
                _SECRET_RE.search(msg),
                _SECRET_KEY_RE.search(msg),
                _CONFIGMAP_RE.search(msg),
            )
            if sm:
                name = sm.group(1)
                if name == hints.credentials_secret:
                    fix = (
                        f"Secret {name} (S3 credentials for publishing) does not exist in "
                        f"namespace {ns}: create it with kubectl create secret generic {name} "
                        f"-n {ns} --from-literal=AWS_ACCESS_KEY_ID=... "
                        "--from-literal=AWS_SECRET_ACCESS_KEY=..., or name another in "
                        "spec.storage.credentialsSecret"
                    )
                else:
                    fix = (
                        f"Secret {name}, referenced by spec.workload.env, does not exist in "
                        f"namespace {ns}: create it or fix the reference"
                    )
                return "SecretMissing", f"step {step} cannot start: {fix}"
            if km:
                return "SecretMissing", (
                    f"step {step} cannot start: Secret {km.group(2)} has no key "
                    f"{km.group(1)}: add it (S3 credentials need AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY)"
                )
            if cm:
                return "ConfigMapMissing", f"step {step} cannot start: {msg}"
            return "ContainerConfigError", f"step {step} cannot start: {msg}"
        if reason in CONTAINER_ERRORS:
            return "ContainerError", f"step {step} cannot start: {reason}: {msg}"
    return None


def _tune_image_id(pods: list[dict[str, Any]]) -> str:
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


def observe_job(
    job: dict[str, Any], pods: list[dict[str, Any]], hints: Hints | None = None
) -> JobObservation:
    """What one tuning Job (a view, see views.job_view) and its pods say, in status terms."""
    hints = hints or Hints()
    meta = job["metadata"]
    labels = meta.get("labels") or {}
    name, uid = meta["name"], meta.get("uid", "")
    ns = meta.get("namespace", "")
    model = (meta.get("annotations") or {}).get(naming.MODEL_ANNOTATION) or labels.get(
        naming.MODEL_LABEL, ""
    )
    rev = labels.get(naming.REVISION_LABEL, "")
    role = labels.get(naming.ROLE_LABEL, "tune")
    jstatus = job.get("status") or {}
    shards = int((job.get("spec") or {}).get("completions") or 1) if role == "tune" else 1
    done = _count_indexes(jstatus.get("completedIndexes") or "")
    conds = {c["type"]: c for c in jstatus.get("conditions") or [] if c.get("status") == "True"}
    retry = f"Fix the cause, then `kubectl delete job -n {ns} {name}` to tune again."
    more = {"uid": uid, "role": role, "shards": shards, "shards_done": done}

    if ("Complete" in conds or "SuccessCriteriaMet" in conds) and shards > 1:
        # The shares are in; the merge Job publishes the artifact.
        return JobObservation(name, model, rev, "Succeeded", **{**more, "shards_done": shards})
    if "Complete" in conds or "SuccessCriteriaMet" in conds:
        result = None
        for pod in _newest_first(pods):
            for cname, term in _terminated(pod):
                if cname in ("publish", "merge") and term.get("exitCode") == 0:
                    result = parse_result(term.get("message"))
            if result:
                break
        if result is None:
            step = "merge" if role == "merge" else "publish"
            return JobObservation(
                name,
                model,
                rev,
                "Failed",
                f"Job {name} completed but its {step} step left no artifact record "
                f"(termination message). {retry}",
                **more,
            )
        return JobObservation(
            name, model, rev, "Succeeded", "", result, image_id=_tune_image_id(pods), **more
        )

    if "Failed" in conds or "FailureTarget" in conds:
        c = conds.get("Failed") or conds["FailureTarget"]
        detail = ""
        for pod in _newest_first(pods):
            detail = _pod_failure(pod)
            if detail:
                break
        why = f"{c.get('reason', 'Failed')}: {c.get('message', '')}".strip()
        msg = f"Job {name} failed ({why})"
        if detail:
            msg += f"; {detail}"
        if shards > 1 and jstatus.get("failedIndexes"):
            msg += f"; shares {jstatus['failedIndexes']} of 0-{shards - 1} failed"
        hint = f" Logs: `kubectl logs -n {ns} job/{name} --all-containers`. {retry}"
        return JobObservation(name, model, rev, "Failed", msg + "." + hint, **more)

    live = [
        p for p in _newest_first(pods) if not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    for pod in live[:1]:
        blocker = pod_blocker(pod, model, hints)
        if blocker:
            reason, message = blocker
            return JobObservation(name, model, rev, "Pending", message, reason=reason, **more)
        if _scheduled(pod):
            return JobObservation(
                name, model, rev, "Running", image_id=_tune_image_id([pod]), **more
            )
    return JobObservation(name, model, rev, "Pending", **more)


def _count_indexes(ranges: str) -> int:
    """How many indexes a Job's "1,3-5" notation names."""
    total = 0
    for part in filter(None, ranges.split(",")):
        lo, _, hi = part.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total
