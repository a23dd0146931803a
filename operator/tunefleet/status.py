"""From what the operator observes to TuningProfile status: pure functions, no API calls.

The status is recomputed from scratch from the Jobs each time (level-based), so a missed or
repeated event never leaves it wrong, and it is written only when it changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Observed:
    generation: int
    spec: TuningProfileSpec | None
    problems: list[str] = field(default_factory=list)
    jobs: list[JobObservation] = field(default_factory=list)
    previous: dict[str, Any] = field(default_factory=dict)


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
    return artifact


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
        }

    spec = obs.spec
    rev = naming.revision(spec)
    models = list(spec.gpu.models)
    current = {j.model: j for j in obs.jobs if j.revision == rev and j.model in models}

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
    running = [
        m for m in models if current.get(m) is None or current[m].state in ("Pending", "Running")
    ]
    up_to_date = [m for m in models if artifacts.get(m, {}).get("revision") == rev]
    served = [m for m in models if m in artifacts]

    if failed:
        fail_msg = " | ".join(f"{j.model}: {j.message}" for j in failed)
        failed_cond = cond("Failed", True, "TuningFailed", fail_msg)
    else:
        failed_cond = cond("Failed", False, "NoFailures", "No tuning Job of this revision failed.")

    if running:
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
        else:
            msg = f"{len(models)} of {len(models)} GPU models have an artifact."
        ready = cond("Ready", True, "ArtifactsPublished", msg)
    elif failed:
        ready = cond(
            "Ready",
            False,
            "TuningFailed",
            f"No artifact for {', '.join(m for m in models if m not in served)}. {fail_msg}",
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
    elif any(current.get(m) and current[m].state == "Running" for m in models):
        phase = "Tuning"
    else:
        phase = "Pending"

    ordered = [artifacts[m] for m in models if m in artifacts]
    return {
        "observedGeneration": gen,
        "phase": phase,
        "revision": rev,
        **_summary(ordered, models),
        "conditions": [ready, progressing, failed_cond],
        "jobs": [
            {"gpuModel": j.model, "name": j.name, "state": j.state, "message": j.message}
            for j in (current[m] for m in models if m in current)
        ],
        "artifacts": ordered,
        "history": history,
    }


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


def observe_job(job: dict[str, Any], pods: list[dict[str, Any]]) -> JobObservation:
    meta = job["metadata"]
    labels = meta.get("labels") or {}
    name = meta["name"]
    ns = meta.get("namespace", "")
    model = (meta.get("annotations") or {}).get("tunefleet.io/gpu-model") or labels.get(
        naming.MODEL_LABEL, ""
    )
    rev = labels.get(naming.REVISION_LABEL, "")
    conds = {
        c["type"]: c
        for c in (job.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }
    retry = f"Fix the cause, then `kubectl delete job -n {ns} {name}` to tune again."

    if "Complete" in conds or "SuccessCriteriaMet" in conds:
        result = None
        for pod in _newest_first(pods):
            for cname, term in _terminated(pod):
                if cname == "publish" and term.get("exitCode") == 0:
                    result = parse_result(term.get("message"))
            if result:
                break
        if result is None:
            return JobObservation(
                name,
                model,
                rev,
                "Failed",
                f"Job {name} completed but its publish step left no artifact record "
                f"(termination message). {retry}",
            )
        return JobObservation(name, model, rev, "Succeeded", "", result)

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
        hint = f" Logs: `kubectl logs -n {ns} job/{name} --all-containers`. {retry}"
        return JobObservation(name, model, rev, "Failed", msg + "." + hint)

    active = (job.get("status") or {}).get("active") or 0
    return JobObservation(name, model, rev, "Running" if active else "Pending")
