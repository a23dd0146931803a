"""Admission of a model pod, in three steps, as pure functions:

1. `choose_artifact`: the profile, the GPU model the pod runs on, and that model's artifact (or
   why the pod starts untuned: a decision code of contracts/admission_record.py);
2. `check_images`: which containers load TunableOp results, and whether they run the image the
   artifact was tuned in (compared by digest where the pod names one; pinned on request);
3. `build_patch`: the pod to admit: the fetch init container, the results volume and mounts,
   TunableOp's environment, and the marks the contract writes.

`admit` runs them; it is idempotent: a pod that already carries the fetch init container or
the results volume comes back marked only. The kopf handler (handlers/on_pod.py) turns the
decision into the patch.

An artifact the operator delivered as a ConfigMap (delivery.py) is mounted from it: no init
container, no credentials (a gzipped one is unpacked by a local init container). The handler
passes the uid each such ConfigMap has now; one that is gone or was replaced (another uid than
the one made) starts the pod untuned with the reason, or refuses it (failClosed).

The pod's GPU model comes from its nodeSelector or its required node affinity
(webhook/reach.py). A pod that can land on several of the profile's models (or on one and
on others) gets every candidate and the node map, and its init container picks the artifact
of the node it lands on (`AtNode`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from tunefleet import images, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.api.conditions import Phase
from tunefleet.artifacts import kinds
from tunefleet.artifacts.bundle import needs as bundle_needs
from tunefleet.artifacts.volumes import VolumeVerdict
from tunefleet.builders import capture as capture_b
from tunefleet.builders.placement import (
    Mounted,
    build_pick_container,
    candidates_volume,
    mounted_uri,
)
from tunefleet.builders.storage import pod_storage
from tunefleet.builders.webhook import (
    CACHES_DIR,
    IMAGE_VOLUME_DIR,
    RESULTS_DIR,
    VOLUME,
    FetchOrder,
    Serve,
    build_fetch_container,
    build_unpack_container,
    caches_env,
    caches_mount,
    caches_volume,
    image_volume_mount,
    packed_volume,
    pod_budget,
    results_config_map_volume,
    results_mount,
    results_volume,
    serve_caches,
    tunable_env,
    volume_links,
)
from tunefleet.config import Config
from tunefleet.contracts import nodemap
from tunefleet.contracts.admission_record import (
    ADMISSION_LABEL,
    INJECTED,
    STATUS_ANNOTATION,
    UNTUNED,
    Admission,
    Code,
)
from tunefleet.contracts.artifact_record import IMAGE_VOLUME, ArtifactRecord
from tunefleet.contracts.fetch_outcome import CONTAINER as FETCH_CONTAINER
from tunefleet.contracts.fetch_outcome import Candidate
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import PodStorage
from tunefleet.webhook.partition import PARTITION_ANNOTATION, partition_problem
from tunefleet.webhook.reach import reach
from tuner_job import caches as cc


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
        return mountable(self.artifact) and self.spec.serving.delivery == "ConfigMap"

    @property
    def from_image_volume(self) -> bool:
        """The operator verified the artifact's volume image (delivery ImageVolume): pods
        mount it by digest. Only on an oci:// store, only TunableOp results, never a status
        that names no valid digest (ArtifactRecord drops those)."""
        art = self.artifact
        return (
            self.spec.storage.is_oci
            and art.delivery == IMAGE_VOLUME
            and bool(art.volume)
            and parse_uri(art.uri).bucket == parse_uri(self.spec.storage.uri).bucket
        )


@dataclass(frozen=True)
class Untuned:
    """Why a model's pods start untuned: the decision code, the reason, its fix."""

    code: Code
    reason: str
    fix: str = ""
    closable: bool = True  # failClosed refuses the pod (not for DEFAULT_ONLY: nothing is wrong)


@dataclass(frozen=True)
class Offer:
    """One model a pod may land on: its artifact, or why it starts untuned there."""

    model: str
    artifact: ArtifactRecord | None
    untuned: Untuned | None = None

    def from_config_map(self, spec: TuningProfileSpec) -> bool:
        art = self.artifact
        return art is not None and mountable(art) and spec.serving.delivery == "ConfigMap"


def mountable(art: ArtifactRecord) -> bool:
    """Served by mounting its ConfigMap: TunableOp results alone. Caches are unpacked into a
    pod-local copy by fetch, from the store (a status claiming a ConfigMap for them is not
    believed)."""
    return bool(art.config_map) and art.results_only


@dataclass(frozen=True)
class AtNode:
    """The pod may land on several models: the artifact is picked where it lands."""

    spec: TuningProfileSpec
    offers: tuple[Offer, ...]

    @property
    def served(self) -> list[Offer]:
        return [o for o in self.offers if o.artifact is not None]


def _artifact_of(
    pod: dict[str, Any],
    spec: TuningProfileSpec,
    profile_name: str,
    status: dict[str, Any],
    model: str,
) -> ArtifactRecord | Untuned:
    """The artifact for `model`, or why the pod starts untuned with it."""
    entry = next((a for a in status.get("artifacts") or [] if a.get("gpuModel") == model), None)
    artifact = ArtifactRecord.from_status(entry) if entry else None
    if artifact is None:
        phase = status.get("phase") or Phase.PENDING
        reason = f"TuningProfile {profile_name!r} has no artifact for {model} yet (phase {phase})"
        fix = f"Wait until `kubectl get tp {profile_name}` shows Ready, then recreate the pod."
        return Untuned(Code.NO_ARTIFACT, reason, fix)
    mismatch = partition_problem(pod, artifact.identity)
    if mismatch is not None:
        # A partition is not the whole GPU: other kernels win on fewer compute units.
        why, unknown = mismatch
        code = Code.PARTITION_UNKNOWN if unknown else Code.PARTITION_MISMATCH
        fix = (
            f"Annotate the pod {PARTITION_ANNOTATION}: whole|<partition>, or tune the profile "
            "on the partition it runs on."
        )
        return Untuned(code, why, fix)
    if artifact.default_only and not spec.serving.serve_default_only and not artifact.caches:
        # Nothing to gain and a lookup to pay on every GEMM: not switched on unless asked.
        # (Its caches, if any, still serve: serves_results keeps TunableOp off for them.)
        reason = (
            f"the artifact of TuningProfile {profile_name!r} for {model} has no GEMM where a "
            f"kernel beat Default ({artifact.no_gain_reason()}); set "
            "spec.serving.serveDefaultOnly: true to switch TunableOp on anyway"
        )
        return Untuned(Code.DEFAULT_ONLY, reason, closable=False)
    return artifact


def choose_artifact(
    pod: dict[str, Any], profile_name: str, profile: dict[str, Any] | None
) -> Choice | AtNode | Decision:
    """The artifact for the GPU model the pod runs on (or, where that is known only once it
    lands, its candidates), or the untuned Decision with its code."""
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
    models = list(spec.gpu.models)
    where = reach(pod, key, models)
    status = profile.get("status") or {}
    if not where.said:
        if len(models) != 1:
            reason = (
                f"pod has no nodeSelector or required node affinity on {key}, and "
                f"TuningProfile {profile_name!r} tunes {len(models)} GPU models"
            )
            fix = (
                f"Add nodeSelector {{{key}: <one of {', '.join(models)}>}} to the pod, or a "
                f"required node affinity {key} In [the models it may run on]."
            )
            return _untuned(pod, reason, Code.NO_MODEL_SELECTOR, fail_closed=closed, fix=fix)
        model, pin = models[0], True
    elif where.exact is not None:
        model, pin = where.exact, False
    elif where.selector is not None or not where.models:
        model = where.selector or (where.others[0] if len(where.others) == 1 else "")
        said = (
            f"pod selects {key}={where.selector}"
            if where.selector is not None
            else f"pod's required node affinity allows {key} "
            + (f"in {', '.join(where.others)} only" if where.others else "in none of them")
        )
        reason = f"{said}, which TuningProfile {profile_name!r} does not tune"
        fix = (
            f"Add {model or 'the model'} to the profile's spec.gpu.models or select one of "
            f"{', '.join(models)}."
        )
        return _untuned(pod, reason, Code.MODEL_NOT_TUNED, fail_closed=closed, fix=fix, model=model)
    else:
        offers = []
        for m in where.models:
            got = _artifact_of(pod, spec, profile_name, status, m)
            offers.append(Offer(m, None, got) if isinstance(got, Untuned) else Offer(m, got))
        at = AtNode(spec, tuple(offers))
        return at if at.served else _none_served(pod, at, closed)
    got = _artifact_of(pod, spec, profile_name, status, model)
    if isinstance(got, Untuned):
        return _untuned(
            pod, got.reason, got.code, fail_closed=closed and got.closable, fix=got.fix,
            model=model,
        )  # fmt: skip
    return Choice(spec, model, got, pin)


def _none_served(pod: dict[str, Any], at: AtNode, closed: bool) -> Decision:
    """No model the pod may land on has an artifact to serve: untuned wherever it lands."""
    whys = [o.untuned for o in at.offers if o.untuned is not None]
    codes = {w.code for w in whys}
    code = whys[0].code if len(codes) == 1 else Code.NO_ARTIFACT
    reason = "; ".join(w.reason for w in whys)
    closed = closed and all(w.closable for w in whys)
    return _untuned(pod, reason, code, fail_closed=closed, fix=whys[0].fix)


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


def check_images(pod: dict[str, Any], choice: Choice | AtNode) -> ImageCheck:
    if isinstance(choice, AtNode):
        return _check_candidates(pod, choice)
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


def _check_candidates(pod: dict[str, Any], at: AtNode) -> ImageCheck:
    """Every candidate's image check: the containers load whichever is picked, so each
    mismatch is said; an image is pinned only to a digest every candidate was tuned in."""
    checks = [
        check_images(pod, Choice(at.spec, o.model, o.artifact, False))
        for o in at.served
        if o.artifact is not None
    ]
    first = checks[0]
    out = ImageCheck(first.chosen, dict(first.pinned), [], [])
    for c in checks:
        out.mismatches += [m for m in c.mismatches if m not in out.mismatches]
        out.warnings += [w for w in c.warnings if w not in out.warnings]
    if any(c.pinned != first.pinned for c in checks[1:]):
        why = (
            "containers cannot be pinned: the candidates' artifacts were tuned in different "
            "images ("
            + "; ".join(
                f"{o.model}: {o.artifact.image_id or '?'}"
                for o in at.served
                if o.artifact is not None
            )
            + ")"
        )
        out.pinned = {}
        out.mismatches.append(why)
        out.warnings.append(f"{why}: TunableOp may reject the results file")
    return out


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
    order = FetchOrder(art.uri, art.sha256, art.manifest_sha256, choice.model)
    unpack = build_unpack_container(order, Serve(devices, closed), where, config)
    pspec["initContainers"] = [unpack, *(pspec.get("initContainers") or [])]
    pspec["volumes"] = [*volumes, results_volume(), packed_volume(art.config_map)]


def _mount_image_volume(
    pspec: dict[str, Any], choice: Choice, devices: int, config: Config, budget: int, links: bool
) -> bool:
    """The volume image as the results directory, by digest, in the profile's own repository:
    the kubelet pulls it once per node (with the serving Secret as a pull secret) and every
    pod there mounts it read-only. Results need nothing run before the model; caches are
    laid out in the pod's writable directory by fetch, from the mounted volume: their big
    files as links into it where `links` (volume_links), the rest copied. Returns whether
    fetch links them (the serving containers then mount the volume where fetch does)."""
    spec, art = choice.spec, choice.artifact
    reference = f"{parse_uri(spec.storage.uri).bucket}@{art.volume}"
    extra = [caches_volume(art.caches)] if art.caches else []
    pspec["volumes"] = [
        *(pspec.get("volumes") or []),
        {"name": VOLUME, "image": {"reference": reference, "pullPolicy": "IfNotPresent"}},
        *extra,
    ]
    if art.caches:
        order = FetchOrder(
            art.uri, art.sha256, art.manifest_sha256, choice.model,
            from_volume=True, volume_links=links,
        )  # fmt: skip
        serve = serve_caches(devices, spec.serving.fail_closed, art.caches, budget, config)
        copy = build_fetch_container(order, serve, PodStorage(), config)
        pspec["initContainers"] = [copy, *(pspec.get("initContainers") or [])]
    chosen = spec.serving.credentials_secret
    secret = chosen.name if chosen else config.default_serving_credentials_secret
    pulls = pspec.get("imagePullSecrets") or []
    if secret and not any(p.get("name") == secret for p in pulls):
        pspec["imagePullSecrets"] = [*pulls, {"name": secret}]
    return links and bool(art.caches)


def _fetch_from_store(
    pspec: dict[str, Any], choice: Choice, devices: int, config: Config, budget: int
) -> None:
    spec, art = choice.spec, choice.artifact
    # Read-only credentials (spec.serving's or the default serving Secret), never publish's;
    # optional, so a namespace without them never holds the pod: fetch says so and the
    # profile's policy decides (untuned and counted as Degraded, or refused).
    storage = pod_storage(spec, config, read_only=True, serving=True).optional()
    order = FetchOrder(art.uri, art.sha256, art.manifest_sha256, choice.model, art.bundle)
    serve = serve_caches(devices, spec.serving.fail_closed, art.caches, budget, config)
    fetch = build_fetch_container(order, serve, storage, config)
    pspec["initContainers"] = [fetch, *(pspec.get("initContainers") or [])]
    extra = [caches_volume(art.caches)] if art.caches else []
    pspec["volumes"] = [*(pspec.get("volumes") or []), results_volume(), *extra, *storage.volumes]


def _pick_at_node(
    pspec: dict[str, Any],
    at: AtNode,
    devices: int,
    config: Config,
    where: tuple[str, str],
    budget: int,
) -> dict[str, str]:
    """Every candidate and the node map, and the init container that picks by its node.
    Returns the candidates offered ({model: pinned sha256, "" where untuned})."""
    spec, closed = at.spec, at.spec.serving.fail_closed
    mounted: list[Mounted] = []
    candidates: list[Candidate] = []
    from_store = False
    for o in at.offers:
        art = o.artifact
        if art is None:
            why = o.untuned
            assert why is not None
            closes = closed and why.closable
            candidates.append(Candidate(o.model, untuned=why.reason, fail_closed=closes))
            continue
        if o.from_config_map(spec):
            m = Mounted(o.model, art.config_map, art.sha256, "gzip" in art.delivery)
            mounted.append(m)
            uri = mounted_uri(m, *where)
        else:
            uri, from_store = art.uri, True
        bundle = "" if o.from_config_map(spec) else art.bundle
        candidates.append(Candidate(o.model, uri, art.sha256, art.manifest_sha256, bundle=bundle))
    # Read-only credentials (spec.serving's or the default serving Secret), and only when a
    # candidate is fetched from the store: mounted ones need none.
    storage = (
        pod_storage(spec, config, read_only=True, serving=True).optional() if from_store else None
    )
    node_map = nodemap.config_map_name(naming.label_key(spec))
    carried = [c for o in at.served if o.artifact for c in o.artifact.caches]
    # The largest of the candidates' bundles: the node's model decides which is unpacked.
    biggest = max(
        (list(o.artifact.caches) for o in at.served if o.artifact),
        key=bundle_needs,
        default=[],
    )
    serve = serve_caches(devices, closed, biggest, budget, config)
    pick = build_pick_container(candidates, node_map, serve, storage, config)
    pspec["initContainers"] = [pick, *(pspec.get("initContainers") or [])]
    models = [o.model for o in at.offers]
    pspec["volumes"] = [
        *(pspec.get("volumes") or []),
        results_volume(),
        *([caches_volume(carried)] if carried else []),
        candidates_volume(node_map, models, mounted, *where),
        *(storage.volumes if storage is not None else []),
    ]
    return {o.model: o.artifact.sha256 if o.artifact else "" for o in at.offers}


@dataclass(frozen=True)
class Marks:
    """What admission writes on the pod beside its injection: the decision's code (None: none,
    or the image mismatch the check found), and why the volume image it mounts has no valid
    signature (policy Optional; "" when it has one), said in its annotation."""

    code: Code | None = None
    unsigned: str = ""


def build_patch(
    pod: dict[str, Any],
    choice: Choice | AtNode,
    check: ImageCheck,
    config: Config,
    profile_name: str = "",
    marks: Marks = Marks(),
) -> dict[str, Any]:
    """The pod to admit, injected: a copy of `pod`."""
    code, unsigned = marks.code, marks.unsigned
    spec = choice.spec
    out = copy.deepcopy(pod)
    pspec = out.setdefault("spec", {})
    devices = gpu_count(out, naming.resource_name(spec))
    budget = pod_budget(out)  # the disk its caches may take (before we add anything)
    links = volume_links(out)  # (before we add anything too)
    linked = False  # whether fetch links the caches into the image volume (set below)
    capture = _add_capture(pspec, choice, check, config)
    where = (str((out.get("metadata") or {}).get("namespace") or ""), profile_name)
    if code is None:
        code = Code.IMAGE_MISMATCH if check.mismatches else Code.NONE
    warning = "; ".join(check.warnings)
    if isinstance(choice, AtNode):
        offered = _pick_at_node(pspec, choice, devices, config, where, budget)
        mark = Admission(INJECTED, code, image_warning=warning, candidates=offered)
    else:
        art = choice.artifact
        if choice.pin_model:
            pspec["nodeSelector"] = {
                **(pspec.get("nodeSelector") or {}),
                naming.label_key(spec): choice.model,
            }
        if choice.from_config_map:
            _mount_from_config_map(pspec, choice, devices, config, where)
        elif choice.from_image_volume:
            linked = _mount_image_volume(pspec, choice, devices, config, budget, links)
        else:
            _fetch_from_store(pspec, choice, devices, config, budget)
        volume = ""
        if not choice.from_config_map and choice.from_image_volume:
            volume = f"{parse_uri(spec.storage.uri).bucket}@{art.volume}"
        mark = Admission(
            INJECTED, code, uri=art.uri, sha256=art.sha256, gpu_model=choice.model,
            image_warning=warning, config_map=art.config_map if choice.from_config_map else "",
            image_volume=volume, unsigned=unsigned if volume else "",
        )  # fmt: skip
    _serve_containers(pspec, choice, check, capture, linked)
    mark.write(out)
    return out


def _serve_containers(
    pspec: dict[str, Any],
    choice: Choice | AtNode,
    check: ImageCheck,
    capture: bool,
    linked: bool = False,
) -> None:
    """The chosen containers' environment and mounts: TunableOp's, each cache's (and the image
    volume where fetch linked its caches' files, `linked`), capture's; the image pinned
    where asked."""
    spec = choice.spec
    served = _served(choice)
    for c in pspec.get("containers") or []:
        if c.get("name") not in check.chosen:
            continue
        env = c.setdefault("env", [])
        mounts = c.setdefault("volumeMounts", [])
        # What the user set on a container wins: they may want tuning on, or another file.
        if served.tunableop:
            env.extend(tunable_env({e.get("name") for e in env}, capture))
            if not any(m.get("mountPath") == RESULTS_DIR for m in mounts):
                mounts.append(results_mount())
        if served.caches:
            env.extend(
                caches_env(
                    spec.artifacts.cache_specs(),
                    served.caches,
                    {e.get("name") for e in env},
                    served.settings,
                )
            )
            if not any(m.get("mountPath") == CACHES_DIR for m in mounts):
                mounts.append(caches_mount())
            if linked and not any(m.get("mountPath") == IMAGE_VOLUME_DIR for m in mounts):
                mounts.append(image_volume_mount())
        if capture:
            c["env"] = capture_b.serving_env(env, cache_log=_serves_vllm(spec, served))
            mounts.extend(capture_b.serving_mounts())
        if c.get("name") in check.pinned:
            c["image"] = check.pinned[c["name"]]


def _serves_vllm(spec: TuningProfileSpec, served: _Served) -> bool:
    return any(s.kind == cc.VLLM and s.name in served.caches for s in spec.artifacts.cache_specs())


@dataclass(frozen=True)
class _Served:
    tunableop: bool
    caches: tuple[str, ...]  # names
    # What those caches were made with and need set to take (tuner_job/caches.py SETTINGS,
    # checked when the record was read): sorted (variable, value) pairs.
    settings: tuple[tuple[str, str], ...] = ()


def _served(choice: Choice | AtNode) -> _Served:
    """What the serving containers get: TunableOp's settings unless every artifact offered is
    caches alone, and the variables of each cache some artifact offered carries."""
    arts = (
        [choice.artifact]
        if isinstance(choice, Choice)
        else [o.artifact for o in choice.served if o.artifact is not None]
    )
    tunableop = any(serves_results(a, choice.spec) for a in arts) or not arts
    names = tuple(sorted({c.name for a in arts for c in a.caches}))
    settings = tuple(sorted({kv for a in arts for c in a.caches for kv in c.settings}))
    return _Served(tunableop, names, settings)


def serves_results(art: ArtifactRecord, spec: TuningProfileSpec) -> bool:
    """Whether TunableOp is switched on for this artifact: it has results, and they gain
    something (or the profile asks for Default-only results anyway)."""
    return art.kind == kinds.DEFAULT and (not art.default_only or spec.serving.serve_default_only)


def _add_capture(
    pspec: dict[str, Any], choice: Choice | AtNode, check: ImageCheck, config: Config
) -> bool:
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


def already_injected(pod: dict[str, Any]) -> bool:
    """The pod has our results volume or fetch container: an earlier webhook entry of ours
    injected it (the chart registers one per replica, called in turn), or a copied pod spec
    carries an injection. Told from the pod alone, before any lookup."""
    spec_ = pod.get("spec") or {}
    if any(c.get("name") == FETCH_CONTAINER for c in spec_.get("initContainers") or []):
        return True
    return any(v.get("name") == VOLUME for v in spec_.get("volumes") or [])


def seen_injected(pod: dict[str, Any]) -> Decision:
    """An injected pod admitted again: only say it was seen (the label, if it lacks it)."""
    out = copy.deepcopy(pod)
    out.setdefault("metadata", {}).setdefault("labels", {})[ADMISSION_LABEL] = INJECTED
    return Decision(pod=out, code=Code.ALREADY_ADMITTED)


def repeats(pod: dict[str, Any], decision: Decision) -> bool:
    """The decision says what the pod already says (an earlier entry of ours decided it
    untuned the same way): admitted as it is, not announced twice."""
    said = ((pod.get("metadata") or {}).get("annotations") or {}).get(STATUS_ANNOTATION)
    now = ((decision.pod.get("metadata") or {}).get("annotations") or {}).get(STATUS_ANNOTATION)
    return bool(decision.reason) and not decision.deny and said is not None and said == now


def admit(
    pod: dict[str, Any],
    profile_name: str,
    profile: dict[str, Any] | None,
    config: Config,
    config_maps: dict[str, str] | None = None,
    volumes: Mapping[str, VolumeVerdict] | None = None,
) -> Decision:
    """`config_maps`: the uid each artifact ConfigMap of the profile has now, by name ("" for
    one that does not exist); None when not known (the pod then mounts it as it is).
    `volumes`: the verdict on each volume image status names, by digest, for the profile's key
    and policy now (artifacts/volumes.py); one without a verdict is never mounted."""
    if already_injected(pod):
        return seen_injected(pod)
    choice = choose_artifact(pod, profile_name, profile)
    if isinstance(choice, Decision):
        return choice
    fallback, unsigned = "", ""
    if isinstance(choice, AtNode):
        choice, fallback = _settle_config_maps(choice, config_maps)
    elif choice.from_config_map and (problem := config_map_problem(choice, config_maps)):
        # The same artifact, verified, from the store while the operator makes its ConfigMap
        # again: never mounted from an object that is not the one made.
        choice = replace(choice, artifact=from_store(choice.artifact))
        fallback = f"{problem}: the artifact is fetched from the store instead (verified)"
    elif choice.from_image_volume:
        choice, fallback, unsigned = _settle_volume(choice, volumes)
    check = check_images(pod, choice)
    if check.mismatches and choice.spec.serving.fail_closed:
        return Decision(
            pod=pod,
            deny=f"tunefleet: {'; '.join(check.mismatches)}. TuningProfile {profile_name!r} "
            "serves only the image it was tuned in (spec.serving.failClosed): run that image, "
            "set spec.serving.pinImage, or retune in this one.",
            code=Code.IMAGE_MISMATCH,
        )
    if fallback:
        check.notes.append(fallback)
    code = Code.STORE_FALLBACK if fallback else Code.NONE
    code = Code.IMAGE_MISMATCH if check.mismatches else code
    out = build_patch(pod, choice, check, config, profile_name, Marks(code, unsigned))
    return Decision(pod=out, injected=True, warnings=check.warnings, code=code, notes=check.notes)


def _settle_volume(
    choice: Choice, volumes: Mapping[str, VolumeVerdict] | None
) -> tuple[Choice, str, str]:
    """The volume image status names is mounted only on a verdict for exactly that digest,
    key and policy (status is shown, never trusted); otherwise the pod fetches the artifact
    and verifies its signature itself. Returns (choice, fallback note, why unsigned)."""
    digest = choice.artifact.volume
    verdict = (volumes or {}).get(digest)
    if verdict is not None and verdict.mountable:
        return choice, "", "" if verdict.signed else (verdict.reason or "not signed")
    why = verdict.reason if verdict is not None else "no verdict for it in time"
    note = (
        f"the volume image {digest[:19]} is not mounted ({why}): the artifact is fetched, "
        "and its signature checked, by the pod instead"
    )
    return replace(choice, artifact=from_store(choice.artifact)), note, ""


def from_store(artifact: ArtifactRecord) -> ArtifactRecord:
    """The artifact, to be fetched from the store rather than mounted from its ConfigMap."""
    return replace(artifact, config_map="", config_map_uid="", delivery="Store")


def _settle_config_maps(at: AtNode, seen: dict[str, str] | None) -> tuple[AtNode, str]:
    """Candidates whose ConfigMap is gone or replaced are fetched from the store where they
    are picked; returns the candidates and what was found ("" when nothing)."""
    offers, found = [], []
    for o in at.offers:
        if o.artifact is not None and o.from_config_map(at.spec):
            problem = config_map_problem(Choice(at.spec, o.model, o.artifact, False), seen)
            if problem:
                found.append(problem)
                o = Offer(o.model, from_store(o.artifact))
        offers.append(o)
    said = "; ".join(found)
    return AtNode(at.spec, tuple(offers)), (
        f"{said}: fetched from the store instead (verified)" if said else ""
    )
