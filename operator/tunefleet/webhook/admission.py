"""Admission of a model pod, in three steps, as pure functions:

1. `choose_artifact`: the profile, the GPU model the pod runs on, and that model's artifact (or
   why the pod starts untuned: a decision code of contracts/admission.py);
2. `check_images`: which containers load TunableOp results, and whether they run the image the
   artifact was tuned in (compared by digest where the pod names one; pinned on request);
3. `build_patch`: the pod to admit: the fetch init container, the results volume and mounts,
   TunableOp's environment, and the marks the contract writes.

`admit` runs them; it is idempotent: a pod that already carries the fetch init container or
the results volume comes back marked only. The kopf handler (handlers/pod.py) turns the
decision into the patch.

An artifact the operator delivered as a ConfigMap (delivery.py) is mounted from it: no init
container, no credentials (a gzipped one is unpacked by a local init container). The handler
passes the uid each such ConfigMap has now; one that is gone or was replaced (another uid than
the one made) starts the pod untuned with the reason, or refuses it (failClosed).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tunefleet import images, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.builders import capture as capture_b
from tunefleet.builders.storage import pod_storage
from tunefleet.builders.webhook import (
    RESULTS_DIR,
    VOLUME,
    build_fetch_container,
    build_unpack_container,
    packed_volume,
    results_config_map_volume,
    results_mount,
    results_volume,
    tunable_env,
)
from tunefleet.config import Config
from tunefleet.contracts.admission import INJECTED, UNTUNED, Admission, Code
from tunefleet.contracts.artifact import ArtifactRecord
from tunefleet.contracts.fetch import CONTAINER as FETCH_CONTAINER
from tunefleet.webhook.partition import PARTITION_ANNOTATION, partition_problem


@dataclass
class Decision:
    pod: dict[str, Any]  # the pod to admit (a copy; unchanged when nothing applies)
    injected: bool = False
    deny: str | None = None  # set: refuse the pod with this message
    reason: str = ""  # why the pod starts untuned, when it does
    warnings: list[str] = field(default_factory=list)
    code: Code = Code.NONE
    notes: list[str] = field(default_factory=list)  # capture's, shown to the pod's creator

    @property
    def outcome(self) -> str:
        if self.deny:
            return "refused"
        if self.injected:
            return "injected"
        return "untuned" if self.reason else "unchanged"


def _untuned(
    pod: dict[str, Any],
    reason: str,
    code: Code,
    *,
    fail_closed: bool = False,
    fix: str = "",
    model: str = "",
) -> Decision:
    if fail_closed:
        return Decision(pod=pod, deny=f"tunefleet: {reason}. {fix}".strip(), code=code)
    out = copy.deepcopy(pod)
    Admission(UNTUNED, code, reason, gpu_model=model).write(out)
    return Decision(pod=out, reason=reason, code=code)


# --- 1. the artifact ------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    spec: TuningProfileSpec
    model: str
    artifact: ArtifactRecord
    pin_model: bool  # the profile's only model: the pod is pinned to it

    @property
    def from_config_map(self) -> bool:
        return bool(self.artifact.config_map) and self.spec.serving.delivery == "ConfigMap"


def choose_artifact(
    pod: dict[str, Any], profile_name: str, profile: dict[str, Any] | None
) -> Choice | Decision:
    """The artifact for the GPU model the pod runs on, or the untuned Decision with its code."""
    if profile is None:
        reason = f"TuningProfile {profile_name!r} does not exist in this namespace"
        return _untuned(pod, reason, Code.NO_PROFILE)
    try:
        spec = TuningProfileSpec.model_validate(profile.get("spec") or {})
    except ValidationError:
        reason = f"TuningProfile {profile_name!r} has an invalid spec (see its status)"
        return _untuned(pod, reason, Code.INVALID_PROFILE)
    closed = spec.serving.fail_closed
    key = naming.label_key(spec)
    model = ((pod.get("spec") or {}).get("nodeSelector") or {}).get(key)
    pin = model is None
    if model is None:
        if len(spec.gpu.models) != 1:
            reason = (
                f"pod has no nodeSelector on {key}, and TuningProfile {profile_name!r} tunes "
                f"{len(spec.gpu.models)} GPU models"
            )
            fix = f"Add nodeSelector {{{key}: <one of {', '.join(spec.gpu.models)}>}} to the pod."
            return _untuned(pod, reason, Code.NO_MODEL_SELECTOR, fail_closed=closed, fix=fix)
        model = spec.gpu.models[0]
    elif model not in spec.gpu.models:
        reason = f"pod selects {key}={model}, which TuningProfile {profile_name!r} does not tune"
        fix = (
            f"Add {model} to the profile's spec.gpu.models or select one of "
            f"{', '.join(spec.gpu.models)}."
        )
        return _untuned(pod, reason, Code.MODEL_NOT_TUNED, fail_closed=closed, fix=fix, model=model)
    status = profile.get("status") or {}
    entry = next((a for a in status.get("artifacts") or [] if a.get("gpuModel") == model), None)
    artifact = ArtifactRecord.from_status(entry) if entry else None
    if artifact is None:
        phase = status.get("phase") or "Pending"
        reason = f"TuningProfile {profile_name!r} has no artifact for {model} yet (phase {phase})"
        fix = f"Wait until `kubectl get tp {profile_name}` shows Ready, then recreate the pod."
        return _untuned(pod, reason, Code.NO_ARTIFACT, fail_closed=closed, fix=fix, model=model)
    mismatch = partition_problem(pod, artifact.identity)
    if mismatch is not None:
        # A partition is not the whole GPU: other kernels win on fewer compute units.
        why, unknown = mismatch
        code = Code.PARTITION_UNKNOWN if unknown else Code.PARTITION_MISMATCH
        fix = (
            f"Annotate the pod {PARTITION_ANNOTATION}: whole|<partition>, or tune the profile "
            "on the partition it runs on."
        )
        return _untuned(pod, why, code, fail_closed=closed, fix=fix, model=model)
    if artifact.default_only and not spec.serving.serve_default_only:
        # Nothing to gain and a lookup to pay on every GEMM: not switched on unless asked.
        reason = (
            f"the artifact of TuningProfile {profile_name!r} for {model} has no GEMM where a "
            f"kernel beat Default ({artifact.no_gain_reason()}); set "
            "spec.serving.serveDefaultOnly: true to switch TunableOp on anyway"
        )
        return _untuned(pod, reason, Code.DEFAULT_ONLY, model=model)
    return Choice(spec, model, artifact, pin)


# --- 2. the images --------------------------------------------------------------------------


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

    @property
    def pin_target(self) -> str | None:
        found = self.repo_digest
        return f"{found[0]}@{found[1]}" if found else None

    def describe(self) -> str:
        return f"{self.reference} (imageID {self.id})" if self.id else self.reference


def image_mismatch(image: str, tuned: TunedImage) -> str | None:
    """Why a container's image is not the tuned one, or None. By digest where the pod names
    one (and the tuned imageID has a registry digest to compare with), else by reference."""
    if "@" in image and tuned.repo_digest:
        digest = image.rsplit("@", 1)[1]
        if digest == tuned.repo_digest[1]:
            return None
        return f"runs {image}, but the artifact was tuned in {tuned.describe()}: other digest"
    if image == tuned.reference or (tuned.repo_digest and image == tuned.pin_target):
        return None
    return f"runs {image}, but the artifact was tuned in {tuned.describe()}"


def serving_containers(pod: dict[str, Any], tuned_image: str) -> tuple[list[str], list[str]]:
    """(names of the containers that load TunableOp results, warnings about the choice)."""
    containers = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]
    named = ((pod.get("metadata") or {}).get("annotations") or {}).get(naming.CONTAINERS_ANNOTATION)
    if named is not None:
        wanted = [n.strip() for n in named.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in containers]
        where = f"annotation {naming.CONTAINERS_ANNOTATION}"
        warnings = [f"{where} names {', '.join(unknown)}, not in this pod"] if unknown else []
        return [n for n in containers if n in wanted], warnings
    repo = images.repository(tuned_image)
    same = [
        c.get("name", "")
        for c in (pod.get("spec") or {}).get("containers") or []
        if repo is not None and images.repository(c.get("image") or "") == repo
    ]
    return (same or containers), []


@dataclass
class ImageCheck:
    chosen: list[str]  # containers that load results
    pinned: dict[str, str]  # container -> the tuned digest it is rewritten to
    mismatches: list[str]
    warnings: list[str]
    notes: list[str] = field(default_factory=list)


def check_images(pod: dict[str, Any], choice: Choice) -> ImageCheck:
    image = choice.artifact
    tuned = TunedImage(image.image_reference or choice.spec.image, image.image_id)
    chosen, warnings = serving_containers(pod, tuned.reference)
    check = ImageCheck(chosen, {}, [], warnings)
    repo = images.repository(tuned.reference)
    for c in (pod.get("spec") or {}).get("containers") or []:
        name, ref = c.get("name", ""), c.get("image") or ""
        if name not in chosen:
            continue  # a sidecar that never loads PyTorch: nothing to give, nothing to compare
        if choice.spec.serving.pin_image and images.repository(ref) == repo:
            if tuned.pin_target:
                check.pinned[name] = tuned.pin_target
            else:
                check.mismatches.append(
                    f"container {name} cannot be pinned: the image the artifact was tuned in "
                    f"has no registry digest (imageID {tuned.id or 'unknown'})"
                )
            continue
        why = image_mismatch(ref, tuned)
        if why:
            check.mismatches.append(f"container {name} {why}")
    check.warnings += [f"{m}: TunableOp may reject the results file" for m in check.mismatches]
    return check


# --- 3. the patch ---------------------------------------------------------------------------


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


def config_map_problem(choice: Choice, seen: dict[str, str] | None) -> str:
    """Why the artifact's ConfigMap cannot be trusted now ("" when it can, or is not known)."""
    name, made = choice.artifact.config_map, choice.artifact.config_map_uid
    if seen is None or name not in seen:
        return ""  # not known now: mounted as it is (the kubelet reads it by name)
    now = seen[name]
    if now == made:
        return ""
    state = f"was replaced (uid {now}, made as {made})" if now else "is gone"
    return f"the ConfigMap {name} that holds the artifact for {choice.model} {state}"


def _mount_from_config_map(
    pspec: dict[str, Any], choice: Choice, devices: int, config: Config, where: tuple[str, str]
) -> None:
    art, closed = choice.artifact, choice.spec.serving.fail_closed
    volumes = pspec.get("volumes") or []
    if "gzip" not in art.delivery:
        pspec["volumes"] = [
            *volumes,
            results_config_map_volume(art.config_map, devices, not closed),
        ]
        return
    unpack = build_unpack_container(
        where=(*where, choice.model),
        sha256=art.sha256, manifest_sha256=art.manifest_sha256, devices=devices,
        gpu_model=choice.model, fail_closed=closed, config=config,
    )  # fmt: skip
    pspec["initContainers"] = [unpack, *(pspec.get("initContainers") or [])]
    pspec["volumes"] = [*volumes, results_volume(), packed_volume(art.config_map)]


def _fetch_from_store(pspec: dict[str, Any], choice: Choice, devices: int, config: Config) -> None:
    spec, art = choice.spec, choice.artifact
    # Read-only credentials (spec.serving's or the default serving Secret), never publish's.
    storage = pod_storage(spec, config, read_only=True, serving=True)
    fetch = build_fetch_container(
        uri=art.uri,
        sha256=art.sha256,
        manifest_sha256=art.manifest_sha256,
        devices=devices,
        gpu_model=choice.model,
        fail_closed=spec.serving.fail_closed,
        storage=storage,
        config=config,
    )
    pspec["initContainers"] = [fetch, *(pspec.get("initContainers") or [])]
    pspec["volumes"] = [*(pspec.get("volumes") or []), results_volume(), *storage.volumes]


def build_patch(
    pod: dict[str, Any], choice: Choice, check: ImageCheck, config: Config, profile_name: str = ""
) -> dict[str, Any]:
    """The pod to admit, injected: a copy of `pod`."""
    spec, art = choice.spec, choice.artifact
    out = copy.deepcopy(pod)
    pspec = out.setdefault("spec", {})
    if choice.pin_model:
        pspec["nodeSelector"] = {
            **(pspec.get("nodeSelector") or {}),
            naming.label_key(spec): choice.model,
        }
    devices = gpu_count(out, naming.resource_name(spec))
    capture = _add_capture(pspec, choice, check, config)
    if choice.from_config_map:
        where = (str((out.get("metadata") or {}).get("namespace") or ""), profile_name)
        _mount_from_config_map(pspec, choice, devices, config, where)
    else:
        _fetch_from_store(pspec, choice, devices, config)
    for c in pspec.get("containers") or []:
        if c.get("name") not in check.chosen:
            continue
        env = c.setdefault("env", [])
        # What the user set on a container wins: they may want tuning on, or another file.
        env.extend(tunable_env({e.get("name") for e in env}, capture))
        mounts = c.setdefault("volumeMounts", [])
        if not any(m.get("mountPath") == RESULTS_DIR for m in mounts):
            mounts.append(results_mount())
        if capture:
            c["env"] = capture_b.serving_env(env)
            mounts.extend(capture_b.serving_mounts())
        if c.get("name") in check.pinned:
            c["image"] = check.pinned[c["name"]]
    mark = Admission(
        INJECTED,
        Code.IMAGE_MISMATCH if check.mismatches else Code.NONE,
        uri=art.uri,
        sha256=art.sha256,
        gpu_model=choice.model,
        image_warning="; ".join(check.warnings),
        config_map=art.config_map if choice.from_config_map else "",
    )
    mark.write(out)
    return out


def _add_capture(pspec: dict[str, Any], choice: Choice, check: ImageCheck, config: Config) -> bool:
    """Capture's volumes, hook and sidecar (before fetch, which goes first: the sidecar reads
    the pinned artifact when it starts); False when capture is off or cannot be had."""
    endpoint = capture_b.endpoint_of(config)
    if not choice.spec.capture.enabled or endpoint is None:
        if choice.spec.capture.enabled:
            check.notes.append(
                "spec.capture is enabled, but this operator has no capture endpoint (the "
                "chart's capture settings): the pod does not record its misses"
            )
        return False
    for c in pspec.get("containers") or []:
        if c.get("name") not in check.chosen:
            continue
        for e in c.get("env") or []:
            if e.get("name") == "PYTHONPATH" and e.get("valueFrom") is not None:
                check.notes.append(
                    f"container {c.get('name')} sets PYTHONPATH from valueFrom: tunefleet "
                    "cannot put its capture hook first on it, so that container records every "
                    "GEMM and serves untuned; set PYTHONPATH as a value"
                )
    sidecar = capture_b.build_sidecar(config, choice.spec.capture, endpoint, VOLUME, RESULTS_DIR)
    hook = capture_b.build_hook_container(config)
    pspec["initContainers"] = [hook, sidecar, *(pspec.get("initContainers") or [])]
    pspec["volumes"] = [*(pspec.get("volumes") or []), *capture_b.volumes()]
    return True


def admit(
    pod: dict[str, Any],
    profile_name: str,
    profile: dict[str, Any] | None,
    config: Config,
    config_maps: dict[str, str] | None = None,
) -> Decision:
    """`config_maps`: the uid each artifact ConfigMap of the profile has now, by name ("" for
    one that does not exist); None when not known (the pod then mounts it as it is)."""
    spec_ = pod.get("spec") or {}
    injected = any(c.get("name") == FETCH_CONTAINER for c in spec_.get("initContainers") or [])
    injected = injected or any(v.get("name") == VOLUME for v in spec_.get("volumes") or [])
    if injected:
        # Already injected (admission re-run, or a copied pod spec): only say it was seen.
        out = copy.deepcopy(pod)
        out.setdefault("metadata", {}).setdefault("labels", {})[naming.ADMISSION_LABEL] = INJECTED
        return Decision(pod=out)
    choice = choose_artifact(pod, profile_name, profile)
    if isinstance(choice, Decision):
        return choice
    problem = config_map_problem(choice, config_maps) if choice.from_config_map else ""
    if problem:
        fix = "The operator makes it again when it reconciles the profile; recreate the pod then."
        closed = choice.spec.serving.fail_closed
        code = Code.CONFIG_MAP_REPLACED
        return _untuned(pod, problem, code, fail_closed=closed, fix=fix, model=choice.model)
    check = check_images(pod, choice)
    if check.mismatches and choice.spec.serving.fail_closed:
        return Decision(
            pod=pod,
            deny=f"tunefleet: {'; '.join(check.mismatches)}. TuningProfile {profile_name!r} "
            "serves only the image it was tuned in (spec.serving.failClosed): run that image, "
            "set spec.serving.pinImage, or retune in this one.",
            code=Code.IMAGE_MISMATCH,
        )
    out = build_patch(pod, choice, check, config, profile_name)
    code = Code.IMAGE_MISMATCH if check.mismatches else Code.NONE
    return Decision(pod=out, injected=True, warnings=check.warnings, code=code, notes=check.notes)
