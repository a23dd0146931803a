"""Deterministic names, labels and the spec revision.

A Job's name is a pure function of (profile, its uid, GPU model, revision), so a re-delivered
event, a resync or an operator restart finds the Job it already created instead of making
another, and a profile deleted and created again under the same name never meets the Jobs of
its predecessor (still being garbage-collected).

What the webhook writes on a model pod it admits (its admission label, decision, pinned
artifact and warnings) is not here but contracts/admission_record.py's, which writes and reads it.
"""

from __future__ import annotations

import hashlib
import json
import re
import weakref
from typing import Any

from tunefleet import images
from tunefleet.api import TuningProfileSpec, base
from tunefleet.storage import registry

PROFILE_LABEL = "tunefleet.io/profile"  # a model pod's opt-in: the webhook selects on it
# Tuning Jobs and their pods: deliberately not PROFILE_LABEL, so the webhook never sees them.
TUNING_PROFILE_LABEL = "tunefleet.io/tuning-profile"
PROFILE_UID_LABEL = "tunefleet.io/profile-uid"
MODEL_LABEL = "tunefleet.io/gpu-model"
REVISION_LABEL = "tunefleet.io/revision"
# "tune" (the tuning Job: one pod, or one per share with parallelism) or "merge" (the Job that
# publishes one artifact from the shares). Jobs of versions before 0.2 have none: tune.
ROLE_LABEL = "tunefleet.io/role"
# ROLE_LABEL on the capture cache's ConfigMaps (capture/retune_sets.py writes them, watched/kinds.py
# selects them): a pod's recorded misses, and the frozen set a retune tunes.
ROLE_CAPTURE = "capture"
ROLE_RETUNE = "retune"
MODEL_ANNOTATION = "tunefleet.io/gpu-model"  # on Jobs and ConfigMaps too, read first
# On a tuning (or merge) Job, written by the operator when it first reads the publish step's
# termination message: the artifact record (contracts/artifact_record.py) outlives the Job's pods.
RECORD_ANNOTATION = "tunefleet.io/artifact-record"
# On a tuning Job the GPU gate made suspended (placement/gate.py): "true" while it may start it.
GPU_GATE_ANNOTATION = "tunefleet.io/waits-for-gpu"
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"  # set by the Job controller on its pods
# On a model pod, set by its author: the most disk its caches may take (a quantity), where its
# node accounts no local storage and no ephemeral-storage limit can say it (builders/webhook.py
# pod_budget).
CACHES_LIMIT_ANNOTATION = "tunefleet.io/caches-limit"
# On a model pod, set by its author to "true": every file of the caches its image volume holds
# is copied into the pod, none linked (for a stack that rewrites a big cache file in place;
# builders/webhook.py volume_links).
CACHES_COPY_ANNOTATION = "tunefleet.io/caches-copy"
# On an artifact's ConfigMap (builders/artifact.py): the manifest's SHA-256, and whether the
# results are gzipped into binaryData ("gzip") or plain data ("none").
MANIFEST_SHA_ANNOTATION = "tunefleet.io/manifest-sha256"
PACKED_ANNOTATION = "tunefleet.io/packed"
# Set by the user: comma-separated names of the containers that load TunableOp results (they
# get the env and mount, and have their image compared with the tuned one). Default: the
# containers that run the profile's image repository; when none does, every container.
CONTAINERS_ANNOTATION = "tunefleet.io/containers"
# Versions before 0.2 put this finalizer on every profile; the operator takes it off.
LEGACY_FINALIZER = "tunefleet.io/finalizer"
MANAGED_KEY, MANAGED_VALUE = "app.kubernetes.io/managed-by", "tunefleet"
MANAGED_BY = {MANAGED_KEY: MANAGED_VALUE}

DEFAULT_LABEL_KEYS, DEFAULT_RESOURCES = base.DEFAULT_LABEL_KEYS, base.DEFAULT_RESOURCES

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL_CHARS = re.compile(r"[^a-z0-9-]+")
_QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


# Tuning settings that bound a Job's run but not what it measures: out of the revision and
# out of the tuner's configuration (builders/job.py), both from this one set.
TUNING_NOT_SHAPING = frozenset(
    {"active_deadline_seconds", "adopt", "backoff_limit", "checkpoint", "queue_name"}
)
# Fields that bound the run's scheduling or where results go, not the results: out of the
# revision. Models are out on purpose too: adding a model must not retune the others.
GPU_NOT_SHAPING = frozenset({"models", "parallelism"})
# spec.template's fields that say where and when a tuning pod runs, or how it is labelled, not
# what its record run sees (its data, environment, resources, runtime and identity): out of
# the revision. By their path in the template (docs/operator.md has the table).
TEMPLATE_NOT_SHAPING = frozenset(
    {"metadata", "spec.affinity", "spec.nodeSelector", "spec.priorityClassName", "spec.tolerations"}
)

# What tunefleet 0.1 hashed at its defaults. The revision hashes every shaping field that differs
# from its default; fields of this baseline count at their default too, exactly as 0.1 hashed
# them, so no upgrade changes the revision of an existing profile. A field added later is left
# out at its default by that rule alone: adding an option never retunes the fleet. A field
# whose default changes is hashed as set (see rotatingBufferMB in revision()).
_REVISION_BASELINE: dict[str, Any] = {
    "gpu": {"labelKey": None, "resourceName": None, "count": 1},
    "tuning": {
        "maxDurationMs": 30,
        "maxIterations": 100,
        "warmupDurationMs": 0,
        "warmupIterations": 0,
        "rotatingBufferMB": 0,
        "numericalCheck": False,
        "budgetSeconds": 3600,
    },
}
_SHAPE_BASELINE: dict[str, Any] = {
    "batch": 1,
    "dtype": "bfloat16",
    "transA": False,
    "transB": False,
}


def _template_shaping(spec: TuningProfileSpec) -> dict[str, Any]:
    """What of spec.template shapes tuning; {} when nothing does (no template, or one of
    placement and labels only), so that such a profile hashes exactly as one without."""
    if spec.template is None:
        return {}
    template: dict[str, Any] = spec.template.model_dump(by_alias=True, exclude_none=True)
    for path in TEMPLATE_NOT_SHAPING:
        section, _, name = path.partition(".")
        if name:
            template.get(section, {}).pop(name, None)
        else:
            template.pop(section, None)
    out: dict[str, Any] = {}
    for key, value in template.items():
        if isinstance(value, dict):  # a section: its empty fields say nothing
            value = {k: v for k, v in value.items() if v not in ({}, [])}
            if not value:
                continue
        out[key] = value
    return out


# The revision of each parsed spec alive, by identity (a reconcile asks its spec ~10 times).
# An entry goes when its spec does (the weak reference's callback, before the id can be
# reused): a table of the last 64 specs hashed kept ~400 KB made during a burst alive after
# it, each object keeping its slab of the heap the burst grew (bench/scale.md). Plain dict
# operations only, each atomic under the GIL: no lock a finalizer could wait on.
_REVISIONS: dict[int, tuple[weakref.ref[TuningProfileSpec], str]] = {}


def revision(spec: TuningProfileSpec) -> str:
    """Hash of the spec fields that shape tuning results (storage and serving move or serve
    results without changing them)."""
    key = id(spec)
    found = _REVISIONS.get(key)
    if found is not None and found[0]() is spec:
        return found[1]
    rev = _revision(spec)
    _REVISIONS[key] = (weakref.ref(spec, lambda _ref: _REVISIONS.pop(key, None)), rev)
    return rev


def _revision(spec: TuningProfileSpec) -> str:
    return hashlib.sha256(_shaping(spec)).hexdigest()[:10]


def fleet_identity(spec: TuningProfileSpec, model: str) -> str | None:
    """What a tuning of `model` under this spec is, anywhere (fleet/: adoption and claims):
    the full SHA-256 of the fields that shape its results, with the image by its digest alone
    (a mirror's name for the same image is the same identity), and the GPU model. None for an
    image not pinned by digest: a tag names different images over time and across clusters.
    The revision's 10 characters keep one profile's revisions apart, not a fleet's tunings."""
    digest = images.parse(spec.image).digest
    if not digest:
        return None
    blob = _shaping(spec, image=digest.lower())
    return hashlib.sha256(blob + b"\0" + model.encode()).hexdigest()


def _shaping(spec: TuningProfileSpec, image: str | None = None) -> bytes:
    return json.dumps(_shaping_doc(spec, image), sort_keys=True, separators=(",", ":")).encode()


def _shaping_doc(spec: TuningProfileSpec, image: str | None = None) -> dict[str, Any]:
    workload = spec.workload.model_dump(by_alias=True, exclude_defaults=True)
    workload["shapes"] = [{**_SHAPE_BASELINE, **s} for s in workload.get("shapes") or []]
    if not workload["shapes"]:
        del workload["shapes"]
    shaping: dict[str, Any] = {
        "image": image or spec.image,
        "gpu": {
            **_REVISION_BASELINE["gpu"],
            **spec.gpu.model_dump(
                by_alias=True, exclude_defaults=True, exclude=set(GPU_NOT_SHAPING)
            ),
            "vendor": spec.gpu.vendor,
        },
        "workload": workload,
        "tuning": {
            **_REVISION_BASELINE["tuning"],
            **spec.tuning.model_dump(
                by_alias=True, exclude_defaults=True, exclude=set(TUNING_NOT_SHAPING)
            ),
            # Its default changed (0 -> -1, torch's L2 size) after 0.1: hashed as set, always,
            # so -1 and 0 stay apart. Profiles stored before keep the 0 the API server wrote
            # into them at creation, so their revision (0, the baseline's) does not change and
            # nothing retunes; setting -1 is a new revision that retunes with the L2 buffer.
            "rotatingBufferMB": spec.tuning.rotating_buffer_mb,
        },
    }
    template = _template_shaping(spec)
    if template:
        shaping["template"] = template
    # What is produced shapes the artifact; TunableOp results alone (the default, and every
    # profile from before caches) adds nothing, so those keep their revision.
    artifacts = spec.artifacts.model_dump(by_alias=True, exclude_defaults=True, exclude_none=True)
    if artifacts:
        shaping["artifacts"] = artifacts
    return shaping


# The identity document's own version: an adopter compares documents of the same version only.
IDENTITY_VERSION = 1


def identity_document(spec: TuningProfileSpec, model: str) -> dict[str, Any] | None:
    """What a tuning of `model` under this spec was for, as a document that travels in the
    artifact's signed manifest (tuner_job/manifest.py's fleetIdentity), so that fleet adoption
    (fleet/adopt.py) compares it field by field with its own: the image by digest, the GPU
    model and vendor, every field fleet_identity hashes, and what decides what the artifact's
    "measured" means (spec.promotion) and how it was tuned (gpu.parallelism: a sharded run
    measures nothing). fleet_identity's hash leaves the last two out, so claims and entries
    keep their keys; an entry is still refused when they differ. None where fleet_identity is
    None (an image by tag)."""
    digest = images.parse(spec.image).digest
    if not digest:
        return None
    doc = _shaping_doc(spec, image=digest.lower())
    doc["gpu"] = {**doc["gpu"], "model": model, "parallelism": spec.gpu.parallelism}
    # Only what is set away from its default: a later release that adds a promotion field
    # (with a default) still matches what this one signed. A release that changes a default
    # bumps IDENTITY_VERSION, so documents from before it differ at `version`.
    doc["promotion"] = spec.promotion.model_dump(by_alias=True, exclude_defaults=True)
    doc["version"] = IDENTITY_VERSION
    # As JSON reads it back (tuples become lists): what the adopter compares is what a
    # manifest can hold.
    loaded: dict[str, Any] = json.loads(json.dumps(doc, sort_keys=True))
    return loaded


def shown(value: Any) -> str:
    """One side of an identity_difference as messages show it."""
    if value is MISSING:
        # The document leaves out what is at its default (identity_document).
        return "unset (the default)"
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


def identity_difference(ours: Any, theirs: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first field (by sorted path) where two identity documents differ: its dotted path
    and both values (MISSING where one side has none); None when they are the same. Types
    count (false is not 0), numbers compare by value (0 and 0.0 are one minGain)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs)):
            at = f"{path}.{key}" if path else str(key)
            if key not in ours or key not in theirs:
                return at, ours.get(key, MISSING), theirs.get(key, MISSING)
            found = identity_difference(ours[key], theirs[key], at)
            if found is not None:
                return found
        return None
    if isinstance(ours, list) and isinstance(theirs, list):
        for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            found = identity_difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        if len(ours) != len(theirs):
            return f"{path} (length)", len(ours), len(theirs)
        return None
    if _kind(ours) != _kind(theirs) or ours != theirs:
        return path, ours, theirs
    return None


MISSING = "(absent)"


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def retune_revision(base: str, digest: str) -> str:
    """The revision a retune of captured misses tunes under: the spec's revision and the
    digest of the shape set the retune froze (capture/loop.py). Stable across reconciles and
    restarts (both are kept in status), and another set is another revision."""
    return hashlib.sha256(f"{base}\0capture\0{digest}".encode()).hexdigest()[:10]


def job_name(profile: str, model: str, rev: str, uid: str, step: str = "tune") -> str:
    """A DNS-1123 label (<= 63 chars) unique per (profile incarnation, model, revision, step).

    Readable prefixes are truncated; the hash keeps distinct inputs apart, whatever their
    length or characters.
    """
    key = f"{profile}\0{uid}\0{model}\0{rev}" + ("" if step == "tune" else f"\0{step}")
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    slug = _DNS_LABEL_CHARS.sub("-", model.lower()).strip("-")
    # Vendor words say little and would eat the readable part of the name.
    for noise in ("amd-instinct-", "nvidia-", "amd-"):
        slug = slug.removeprefix(noise)
    name = _DNS_LABEL_CHARS.sub("-", profile)[:28].strip("-")
    return f"{step}-{name}-{slug[:16].strip('-')}-{digest}".replace("--", "-")


def label_key(spec: TuningProfileSpec) -> str:
    return spec.gpu.label_key or DEFAULT_LABEL_KEYS[spec.gpu.vendor]


def resource_name(spec: TuningProfileSpec) -> str:
    return spec.gpu.resource_name or DEFAULT_RESOURCES[spec.gpu.vendor]


def is_label_value(value: str) -> bool:
    return len(value) <= 63 and bool(_LABEL_VALUE.match(value))


def is_qualified_name(value: str) -> bool:
    name = value.rsplit("/", 1)[-1]
    prefix = value.rsplit("/", 1)[0] if "/" in value else ""
    return len(name) <= 63 and len(prefix) <= 253 and bool(_QUALIFIED_NAME.match(value))


def spec_problems(spec: TuningProfileSpec, operator_signs: bool = False) -> list[str]:
    """What the schema cannot judge but Kubernetes will refuse later, each with the fix.
    `operator_signs`: the operator signs this profile's artifacts (builders/storage.py), so it
    needs no signing Secret of its own, and its merge Job signs too."""
    problems = []
    for model in spec.gpu.models:
        if not is_label_value(model):
            problems.append(
                f"gpu.models: {model!r} can't be a node label value (at most 63 of A-Z a-z "
                "0-9 - _ . , starting and ending alphanumeric); use the value of the node "
                f"label {label_key(spec)} exactly as `kubectl get nodes -L {label_key(spec)}` "
                "shows it"
            )
    if not is_qualified_name(label_key(spec)):
        problems.append(
            f"gpu.labelKey: {label_key(spec)!r} is not a valid label key "
            "(optional DNS prefix/, then a name of at most 63 characters)"
        )
    try:
        registry.parse_uri(spec.storage.uri)
    except ValueError as exc:
        problems.append(f"storage.uri: {exc}")
    problems += signing_problems(spec, operator_signs)
    if not is_qualified_name(resource_name(spec)):
        problems.append(
            f"gpu.resourceName: {resource_name(spec)!r} is not a valid extended resource "
            "name such as amd.com/gpu"
        )
    return problems


def signing_problems(spec: TuningProfileSpec, operator_signs: bool = False) -> list[str]:
    storage = spec.storage
    if (
        storage.signing is not None
        and not storage.is_oci
        and spec.gpu.parallelism > 1
        and not operator_signs
    ):
        return [
            "gpu.parallelism: sharded tuning publishes through a merge Job, which does not sign "
            "yet: use parallelism 1 with storage.signing, or remove storage.signing"
        ]
    if storage.signing_policy == "Required" and not storage.is_oci and not storage.public_key:
        return [
            "storage.signing.publicKey: model pods and the operator verify each artifact's "
            "signature with it, and a signature is required (policy Required, the default): "
            "set it to the PEM of cosign.pub, or set storage.signing.policy: Optional"
        ]
    if storage.is_oci and spec.gpu.parallelism > 1:
        return [
            "gpu.parallelism: sharded tuning publishes through a merge Job, which does not push "
            "OCI bundles yet: use parallelism 1 with an oci:// store, or an s3:// one"
        ]
    if storage.signing_policy == "Required" and not storage.signing_secret and not operator_signs:
        return [
            "storage.signing.secret: the store signs every artifact and serves only signed "
            "ones (policy Required, the default): name a Secret in this namespace holding "
            "cosign.key, cosign.password and cosign.pub (`cosign generate-key-pair "
            "k8s://<namespace>/<name>` makes one), or set storage.signing.policy: Optional "
            "(on s3:// and pvc:// stores, the chart's signing.secret has the operator sign "
            "instead)"
        ]
    return []


def artifact_config_map_labels(uid: str) -> dict[str, str]:
    """What an artifact ConfigMap carries and the watch selects it by (watched/kinds.py): put
    back by the reconcile when a user removes them from the object it made (delivery heals)."""
    return {**MANAGED_BY, PROFILE_UID_LABEL: uid, ROLE_LABEL: "artifact"}


def job_labels(profile: str, uid: str, model: str, rev: str, role: str = "tune") -> dict[str, str]:
    labels = {
        **MANAGED_BY,
        TUNING_PROFILE_LABEL: profile,
        PROFILE_UID_LABEL: uid,
        REVISION_LABEL: rev,
        ROLE_LABEL: role,
    }
    # A model that can't be a label value is reported by spec_problems and never gets here.
    labels[MODEL_LABEL] = model
    return labels
