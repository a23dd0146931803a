"""Why a tuning pod does not start or failed, from what the kubelet, the scheduler and the
Job controller say, turned into the fix: a pull Secret or image missing, a node that does
not fit (labels, taints, resources), a Secret or ConfigMap the pod needs, a command not in
the image, a pod the API server refuses. `Hints` is what the spec says of the pod, so that a
message can name the field to change. Pure: Events are read by the reconcile's gather step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tunefleet.api.conditions import Reason
from tunefleet.artifacts import fit


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


def terminated(pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
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


def pod_failure(pod: dict[str, Any]) -> str:
    """The most telling line a failed tuning pod left: a container's own message first."""
    for name, term in terminated(pod):
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


def newest_first(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
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
