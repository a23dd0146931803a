"""The pod webhook's registration and the injection it applies, as pure functions.

`inject` turns (pod, profile) into the pod to admit, or a refusal, and is idempotent: a pod
that already carries the fetch init container comes back unchanged.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any

from tunefleet import images, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.builders.job import storage_args, storage_env
from tunefleet.builders.security import tunefleet_container
from tunefleet.config import Config
from tunefleet.status import default_only, no_gain_reason

HANDLER_ID = "pod-inject"
FETCH_CONTAINER = "tunefleet-fetch"
VOLUME = "tunefleet-results"
RESULTS_DIR = "/tunefleet/results"
FILENAME = f"{RESULTS_DIR}/tunableop_results%d.csv"

ANN_STATUS = "tunefleet.io/status"
ANN_URI = "tunefleet.io/artifact-uri"
ANN_SHA = "tunefleet.io/artifact-sha256"
ANN_MODEL = "tunefleet.io/gpu-model"
ANN_IMAGE_WARNING = "tunefleet.io/image-warning"
# Comma-separated names of the containers that load TunableOp results (get the env and mount,
# and have their image compared with the tuned one). Default: the containers that run the
# profile's image repository; when none does, every container.
ANN_CONTAINERS = "tunefleet.io/containers"


def build_webhook_configuration(
    name: str,
    client_config: dict[str, Any],
    timeout_seconds: int = 5,
    failure_policy: str = "Ignore",
) -> dict[str, Any]:
    """Only labelled pods ever reach us; Ignore keeps pod creation working when we're down."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "tunefleet"}},
        "webhooks": [
            {
                "name": "pods.tunefleet.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": failure_policy,
                "timeoutSeconds": timeout_seconds,
                "reinvocationPolicy": "Never",
                "matchPolicy": "Equivalent",
                "clientConfig": client_config,
                "objectSelector": {
                    "matchExpressions": [{"key": naming.PROFILE_LABEL, "operator": "Exists"}]
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
            }
        ],
    }


@dataclass
class Decision:
    pod: dict[str, Any]  # the pod to admit (a copy; unchanged when nothing applies)
    injected: bool = False
    deny: str | None = None  # set: refuse the pod with this message
    reason: str = ""  # why the pod starts untuned, when it does
    warnings: list[str] = field(default_factory=list)
    # A reason code from a small fixed set, for metrics: none, no_profile, invalid_profile,
    # no_model_selector, model_not_tuned, no_artifact, default_only, image_mismatch.
    code: str = "none"

    @property
    def outcome(self) -> str:
        if self.deny:
            return "refused"
        if self.injected:
            return "injected"
        return "untuned" if self.reason else "unchanged"


def gpu_count(pod: dict[str, Any], resource: str) -> int:
    """GPUs each container sees as ordinals 0..n-1; the largest request decides."""
    counts = [1]
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            value = (res.get(part) or {}).get(resource)
            if value is not None:
                with contextlib.suppress(ValueError):
                    counts.append(int(str(value)))
    return max(counts)


def _mark(pod: dict[str, Any], outcome: str) -> dict[str, Any]:
    """Every pod the webhook admits says so in a label: pods without it were never seen."""
    labels = pod.setdefault("metadata", {}).setdefault("labels", {})
    labels[naming.ADMISSION_LABEL] = outcome
    return pod


def _untuned(pod: dict[str, Any], reason: str, fail_closed: bool, fix: str, code: str) -> Decision:
    if fail_closed:
        return Decision(pod=pod, deny=f"tunefleet: {reason}. {fix}".strip(), code=code)
    out = _mark(copy.deepcopy(pod), "untuned")
    anns = out["metadata"].setdefault("annotations", {})
    anns[ANN_STATUS] = f"untuned: {reason}"
    return Decision(pod=out, reason=reason, code=code)


@dataclass(frozen=True)
class TunedImage:
    reference: str  # what the tuning Job asked for
    id: str  # the kubelet's imageID: repo@sha256:... (registry digest) or sha256:... or ""

    @property
    def repo_digest(self) -> tuple[str, str] | None:
        """(repository, sha256:...) when the imageID names a registry digest."""
        if "@" in self.id:
            repo, digest = self.id.rsplit("@", 1)
            if digest.startswith("sha256:") and repo:
                return repo, digest
        return None

    def describe(self) -> str:
        return f"{self.reference} (imageID {self.id})" if self.id else self.reference


def _tuned_image(artifact: dict[str, Any], fallback: str) -> TunedImage:
    image = artifact.get("image") or {}
    return TunedImage(str(image.get("reference") or fallback), str(image.get("id") or ""))


def _pin_target(tuned: TunedImage) -> str | None:
    found = tuned.repo_digest
    return f"{found[0]}@{found[1]}" if found else None


def image_mismatch(image: str, tuned: TunedImage) -> str | None:
    """Why a container's image is not the tuned one, or None. By digest where the pod names
    one (and the tuned imageID has a registry digest to compare with), else by reference."""
    if "@" in image and tuned.repo_digest:
        digest = image.rsplit("@", 1)[1]
        if digest == tuned.repo_digest[1]:
            return None
        return f"runs {image}, but the artifact was tuned in {tuned.describe()}: other digest"
    if image == tuned.reference or (tuned.repo_digest and image == _pin_target(tuned)):
        return None
    return f"runs {image}, but the artifact was tuned in {tuned.describe()}"


def serving_containers(pod: dict[str, Any], tuned_image: str) -> tuple[list[str], list[str]]:
    """(names of the containers that load TunableOp results, warnings about the choice)."""
    containers = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]
    named = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_CONTAINERS)
    if named is not None:
        wanted = [n.strip() for n in named.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in containers]
        warnings = (
            [f"annotation {ANN_CONTAINERS} names {', '.join(unknown)}, not in this pod"]
            if unknown
            else []
        )
        return [n for n in containers if n in wanted], warnings
    repo = images.repository(tuned_image)
    same = [
        c.get("name", "")
        for c in (pod.get("spec") or {}).get("containers") or []
        if repo is not None and images.repository(c.get("image") or "") == repo
    ]
    return (same or containers), []


def inject(
    pod: dict[str, Any],
    profile_name: str,
    profile: dict[str, Any] | None,
    config: Config,
) -> Decision:
    spec_ = pod.get("spec") or {}
    if any(c.get("name") == FETCH_CONTAINER for c in spec_.get("initContainers") or []):
        # Already injected (admission re-run, or a copied pod spec): only say it was seen.
        return Decision(pod=_mark(copy.deepcopy(pod), "injected"))

    if profile is None:
        return _untuned(
            pod,
            f"TuningProfile {profile_name!r} does not exist in this namespace",
            False,
            "",
            "no_profile",
        )
    from pydantic import ValidationError

    try:
        spec = TuningProfileSpec.model_validate(profile.get("spec") or {})
    except ValidationError:
        return _untuned(
            pod,
            f"TuningProfile {profile_name!r} has an invalid spec (see its status)",
            False,
            "",
            "invalid_profile",
        )
    fail_closed = spec.serving.fail_closed
    key = naming.label_key(spec)
    selector = dict(spec_.get("nodeSelector") or {})
    model = selector.get(key)
    pin = False
    if model is None:
        if len(spec.gpu.models) != 1:
            return _untuned(
                pod,
                f"pod has no nodeSelector on {key}, and TuningProfile {profile_name!r} tunes "
                f"{len(spec.gpu.models)} GPU models",
                fail_closed,
                f"Add nodeSelector {{{key}: <one of {', '.join(spec.gpu.models)}>}} to the pod.",
                "no_model_selector",
            )
        model, pin = spec.gpu.models[0], True
    elif model not in spec.gpu.models:
        return _untuned(
            pod,
            f"pod selects {key}={model}, which TuningProfile {profile_name!r} does not tune",
            fail_closed,
            f"Add {model} to the profile's spec.gpu.models or select one of "
            f"{', '.join(spec.gpu.models)}.",
            "model_not_tuned",
        )

    status = profile.get("status") or {}
    artifact = next((a for a in status.get("artifacts") or [] if a.get("gpuModel") == model), None)
    if artifact is None:
        phase = status.get("phase") or "Pending"
        return _untuned(
            pod,
            f"TuningProfile {profile_name!r} has no artifact for {model} yet (phase {phase})",
            fail_closed,
            f"Wait until `kubectl get tp {profile_name}` shows Ready, then recreate the pod.",
            "no_artifact",
        )
    if default_only(artifact) and not spec.serving.serve_default_only:
        # Nothing to gain and a lookup to pay on every GEMM: not switched on unless asked.
        return _untuned(
            pod,
            f"the artifact of TuningProfile {profile_name!r} for {model} has no GEMM where a "
            f"kernel beat Default ({no_gain_reason(artifact)}); set "
            "spec.serving.serveDefaultOnly: true to switch TunableOp on anyway",
            False,
            "",
            "default_only",
        )
    tuned = _tuned_image(artifact, spec.image)
    pinned: dict[str, str] = {}
    mismatches: list[str] = []
    chosen, warnings = serving_containers(pod, tuned.reference)
    for c in spec_.get("containers") or []:
        if c.get("name") not in chosen:
            continue  # a sidecar that never loads PyTorch: nothing to give, nothing to compare
        image = c.get("image") or ""
        if spec.serving.pin_image and images.repository(image) == images.repository(
            tuned.reference
        ):
            target = _pin_target(tuned)
            if target:
                pinned[c.get("name", "")] = target
                continue
            mismatches.append(
                f"container {c.get('name')} cannot be pinned: the image the artifact was tuned "
                f"in has no registry digest (imageID {tuned.id or 'unknown'})"
            )
            continue
        why = image_mismatch(image, tuned)
        if why:
            mismatches.append(f"container {c.get('name')} {why}")
    if mismatches and fail_closed:
        return Decision(
            pod=pod,
            deny=f"tunefleet: {'; '.join(mismatches)}. TuningProfile {profile_name!r} serves "
            "only the image it was tuned in (spec.serving.failClosed): run that image, set "
            "spec.serving.pinImage, or retune in this one.",
            code="image_mismatch",
        )
    warnings += [f"{m}: TunableOp may reject the results file" for m in mismatches]

    out = copy.deepcopy(pod)
    meta = out.setdefault("metadata", {})
    anns = meta.setdefault("annotations", {})
    pspec = out.setdefault("spec", {})
    if pin:
        pspec["nodeSelector"] = {**selector, key: model}

    devices = gpu_count(out, naming.resource_name(spec))
    fetch_cmd = [
        "tunefleet-fetch",
        "--uri",
        artifact["uri"],
        "--sha256",
        artifact["sha256"],
        "--dest",
        RESULTS_DIR,
        "--devices",
        str(devices),
        "--gpu-model",
        model,
        *storage_args(spec, config),
    ]
    if artifact.get("manifestSha256"):
        fetch_cmd += ["--manifest-sha256", artifact["manifestSha256"]]
    if fail_closed:
        fetch_cmd.append("--fail-closed")
    fetch = tunefleet_container(
        FETCH_CONTAINER,
        fetch_cmd,
        image=config.image,
        pull_policy=config.image_pull_policy,
        mounts=[{"name": VOLUME, "mountPath": RESULTS_DIR}],
        env=storage_env(spec, config),
    )
    pspec["initContainers"] = [fetch, *(pspec.get("initContainers") or [])]
    pspec["volumes"] = [
        *(pspec.get("volumes") or []),
        {"name": VOLUME, "emptyDir": {"sizeLimit": "256Mi"}},
    ]
    tunable_env = {
        "PYTORCH_TUNABLEOP_ENABLED": "1",
        "PYTORCH_TUNABLEOP_TUNING": "0",
        "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
        "PYTORCH_TUNABLEOP_FILENAME": FILENAME,
    }
    for c in pspec.get("containers") or []:
        if c.get("name") not in chosen:
            continue
        env = c.setdefault("env", [])
        have = {e.get("name") for e in env}
        # What the user set on a container wins: they may want tuning on, or another file.
        env.extend({"name": k, "value": v} for k, v in tunable_env.items() if k not in have)
        mounts = c.setdefault("volumeMounts", [])
        if not any(m.get("mountPath") == RESULTS_DIR for m in mounts):
            mounts.append({"name": VOLUME, "mountPath": RESULTS_DIR, "readOnly": True})
        if c.get("name") in pinned:
            c["image"] = pinned[c["name"]]
    _mark(out, "injected")
    anns.update(
        {
            ANN_STATUS: "injected",
            ANN_URI: artifact["uri"],
            ANN_SHA: artifact["sha256"],
            ANN_MODEL: model,
        }
    )
    if warnings:
        anns[ANN_IMAGE_WARNING] = "; ".join(warnings)[:1000]
    return Decision(
        pod=out, injected=True, warnings=warnings, code="image_mismatch" if mismatches else "none"
    )
