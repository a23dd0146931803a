"""The tuning Job for one GPU model of a profile (design: bootstrap, tune, publish), the merge
Job of a sharded one, and the ConfigMap that carries the tuning configuration.

Sizes: the configuration (shapes, limits) travels as a file from a ConfigMap, never as one
environment string (Linux refuses any single one over 128 KiB); the workload's command and
args are the tune container's own argv, verbatim. The CRD's bounds keep both, and the Job,
within what Kubernetes and exec(2) accept (tests/unit/test_size_limits.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tunefleet import GROUP, KIND, VERSION, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.artifacts import fit
from tunefleet.builders.kueue import under_queue
from tunefleet.builders.security import SMALL_RESOURCES, hardened, tunefleet_container
from tunefleet.builders.storage import (
    broker_storage,
    brokers,
    operator_signs,
    pod_storage,
    remote_signing,
    signing_storage,
    with_storage,
)
from tunefleet.builders.template import apply_to_merge_job, apply_to_tuning_job
from tunefleet.config import Config
from tunefleet.storage.store import PodStorage
from tuner_job import caches as cc

TOOLS_DIR = "/tunefleet/tools"
OUT_DIR = "/tunefleet/out"
CONFIG_DIR = "/tunefleet/config"
CONFIG_KEY = "config.json"
# The operator adds this key to the Job's ConfigMap once the tune step has ended: the kubelet's
# imageID of the tune container, which publish records in the manifest.
IMAGE_ID_KEY = "tune-image-id"
# What the artifact is tuned for (naming.identity_document), which publish (or the merge Job)
# writes into its manifest, so the manifest's signature binds it (fleet adoption compares it).
IDENTITY_KEY = "fleet-identity.json"
# Shared by sync (the sidecar), tune and publish: library, checkpoints, progress (see
# tuner_job/exchange.py). No '.' and no '0' in the path: mgpu_tune_gemm_in_file's quirks.
EXCHANGE_DIR = "/tunefleet/exchange"
EXCHANGE_WAIT_SECONDS = 300
# A retune's captured shapes (capture/retune_sets.py's retune set), as an untuned file the tuner
# adds.
CAPTURED_DIR = "/tunefleet/captured"
CAPTURED_KEY = "untuned.csv"
# The tune container starts python3 itself, with no shell (distroless Python images have none)
# and runs the tuner by its path, so neither the image's PYTHONPATH nor a user's PYTHONPATH in
# workload.env is replaced or can hide the package. The workload's command and args follow
# "--" as the container's args, verbatim. An image without python3 on its PATH fails to start
# with the kubelet's 'executable file not found'; observe.py says what that means.
TUNE_PYTHON = "python3"
TUNER_PATH = f"{TOOLS_DIR}/tuner_job"
TUNE_COMMAND = [
    TUNE_PYTHON, TUNER_PATH, "run", "--config", f"{CONFIG_DIR}/{CONFIG_KEY}", "--out", OUT_DIR,
    "--",
]  # fmt: skip


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


@dataclass(frozen=True)
class Child:
    """What every child of a profile's GPU model is named and labelled by."""

    spec: TuningProfileSpec
    namespace: str
    profile: str
    uid: str
    model: str
    config: Config = field(default_factory=Config)
    # A retune of captured misses (capture/loop.py): the revision it tunes under, and the
    # immutable ConfigMap of the shapes it adds to what the workload records.
    revision_override: str = ""
    captured: str = ""

    @property
    def revision(self) -> str:
        return self.revision_override or naming.revision(self.spec)

    def identity(self) -> dict[str, Any] | None:
        """What this model's artifact is tuned for (naming.identity_document); None for a
        retune (the profile's own captured shapes: no fleet identity's artifact) and for an
        image by tag."""
        if self.revision_override:
            return None
        return naming.identity_document(self.spec, self.model)

    def identity_args(self) -> list[str]:
        """Where publish and merge read the identity document, when there is one."""
        if self.identity() is None:
            return []
        return ["--identity-file", f"{CONFIG_DIR}/{IDENTITY_KEY}"]

    def name(self, step: str = "tune") -> str:
        return naming.job_name(self.profile, self.model, self.revision, self.uid, step)

    def labels(self, role: str = "tune") -> dict[str, str]:
        return naming.job_labels(self.profile, self.uid, self.model, self.revision, role)

    def metadata(self, name: str, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": labels,
            "annotations": {naming.MODEL_ANNOTATION: self.model},
            "ownerReferences": [owner_reference(self.profile, self.uid)],
        }

    def where(self) -> list[str]:
        """Where an artifact of (namespace, profile, model) lives: the arguments every store
        step of a tuning pod or the merge Job takes (sync, publish, merge)."""
        return [
            "--uri", self.spec.storage.uri, "--namespace", self.namespace,
            "--profile", self.profile, "--gpu-model", self.model,
        ]  # fmt: skip

    def step(
        self, name: str, command: list[str], mounts: list[dict[str, Any]], **kw: Any
    ) -> dict[str, Any]:
        """A container of tunefleet's own image."""
        return tunefleet_container(
            name,
            command,
            self.config,
            mounts=mounts,
            **kw,
        )


def tuning_config(
    spec: TuningProfileSpec,
    namespace: str,
    profile: str,
    model: str,
    rev: str,
    captured: bool = False,
) -> dict[str, Any]:
    """What the tuner reads from --config (tuner_job/config.py's contract). The workload
    command is not in it: it is the tune container's argv (see TUNE_COMMAND)."""
    workload = spec.workload.model_dump(
        by_alias=True, exclude_none=True, exclude={"env", "command", "args"}
    )
    for shape in workload.get("shapes", []):
        shape["m"], shape["n"], shape["k"] = shape.pop("mnk")
    if captured:
        workload["untunedFiles"] = [f"{CAPTURED_DIR}/{CAPTURED_KEY}"]
    extra: dict[str, Any] = {}
    if spec.artifacts.caches or not spec.artifacts.tunableop:
        # tuner_job/config.py's artifacts (absent: TunableOp results alone, as before caches).
        extra["artifacts"] = {
            "tunableop": spec.artifacts.tunableop,
            "caches": [c.to_dict() for c in spec.artifacts.cache_specs()],
        }
    return {
        **extra,
        "namespace": namespace,
        "profile": profile,
        "gpuModel": model,
        "revision": rev,
        "gpus": spec.gpu.count,
        "shards": spec.gpu.parallelism,
        "exchange": {"dir": EXCHANGE_DIR, "waitSeconds": EXCHANGE_WAIT_SECONDS},
        "workload": workload,
        "tuning": spec.tuning.model_dump(by_alias=True, exclude=set(naming.TUNING_NOT_SHAPING)),
        "promotion": promotion_config(spec),
    }


# What the Job keeps for itself after the tuner's budget: publishing, and the measuring's end.
MEASURE_MARGIN_SECONDS = 120


def promotion_config(spec: TuningProfileSpec) -> dict[str, Any]:
    """The tuner's measuring (tuner_job/config.py): spec.promotion, its budget cut to what the
    Job's activeDeadlineSeconds leaves after the tuning budget, so measuring never gets the
    Job killed. A sharded Job's pods each hold a share: the merge Job measures nothing."""
    p, t = spec.promotion, spec.tuning
    room = t.active_deadline_seconds - t.budget_seconds - MEASURE_MARGIN_SECONDS
    measure = p.measure and spec.gpu.parallelism == 1
    return {
        "measure": measure,
        "servingMode": p.serving_mode,
        "budgetSeconds": max(0, min(p.budget_seconds, room)),
    }


def build_tuning_config_map(c: Child) -> dict[str, Any]:
    """The tune step's configuration, under the Job's own name (made before the Job)."""
    data = json.dumps(
        tuning_config(c.spec, c.namespace, c.profile, c.model, c.revision, bool(c.captured)),
        separators=(",", ":"),
        sort_keys=True,
    )
    out: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": c.metadata(c.name(), c.labels()),
        "data": {CONFIG_KEY: data},
    }
    identity = c.identity()
    if identity is not None:
        out["data"][IDENTITY_KEY] = json.dumps(identity, separators=(",", ":"), sort_keys=True)
    return out


def _pod_spec(
    containers: list[dict[str, Any]], volumes: list[dict[str, Any]], storage: PodStorage
) -> dict[str, Any]:
    """What every pod of tunefleet's Jobs has: no token, no service links, no retries in place
    (the Job retries), RuntimeDefault seccomp; the store's volumes."""
    security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if storage.fs_group is not None:
        security["fsGroup"] = storage.fs_group
    return {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": security,
        "volumes": [*volumes, *storage.volumes],
        "containers": containers,
    }


def _job(
    c: Child, name: str, labels: dict[str, str], pod: dict[str, Any], **spec: Any
) -> dict[str, Any]:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": c.metadata(name, labels),
        "spec": {**spec, "template": {"metadata": {"labels": labels}, "spec": pod}},
    }
    # Kueue's label on the Job only (not the pod template's labels, which select its pods).
    return under_queue(job, c.spec.tuning.queue_name)


def _sync_container(c: Child, storage: PodStorage) -> dict[str, Any]:
    """The tuning pod's native sidecar: library in, checkpoints out (tuner_job can't reach
    the store)."""
    every = c.spec.tuning.checkpoint
    command = [
        "tunefleet-sync", "--exchange", EXCHANGE_DIR, *c.where(), "--revision", c.revision,
        "--shards", str(c.spec.gpu.parallelism), "--library-scope", c.config.library_scope,
        "--checkpoint-every-gemms", str(every.every_gemms),
        "--checkpoint-every-seconds", str(every.every_seconds),
    ]  # fmt: skip
    mounts = [
        {"name": "exchange", "mountPath": EXCHANGE_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    # Merging a large library (bounded: 500 entries, 32 MiB) peaks near 130 MiB.
    resources = {**SMALL_RESOURCES, "limits": {"memory": "384Mi"}}
    sync = with_storage(c.step("sync", command, mounts, resources=resources), storage)
    # A native sidecar: starts before tune, runs beside it and publish, stopped after.
    sync["restartPolicy"] = "Always"
    del sync["terminationMessagePolicy"]  # its end is the kubelet stopping it, not a verdict
    return sync


def _tune_container(c: Child) -> dict[str, Any]:
    """The user's image, with the GPUs: records, reuses, tunes, writes results + manifest."""
    spec = c.spec
    resource, gpus = naming.resource_name(spec), str(spec.gpu.count)
    user_env = [e.model_dump(by_alias=True, exclude_none=True) for e in spec.workload.env or []]
    return {
        "name": "tune",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(TUNE_COMMAND),
        "args": [*(spec.workload.command or []), *(spec.workload.args or [])],
        # No PYTHONPATH: the image's own stays in force for the workload it records.
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, *user_env],
        "resources": {"requests": {resource: gpus}, "limits": {resource: gpus}},
        "volumeMounts": [
            {"name": "tools", "mountPath": TOOLS_DIR, "readOnly": True},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "out", "mountPath": OUT_DIR},
            {"name": "exchange", "mountPath": EXCHANGE_DIR},
        ],
        # The user's image decides its user and writes where it likes; we only take away
        # what tuning never needs.
        "securityContext": hardened(read_only_root=False, run_as_user=None),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _fit_args(c: Child) -> list[str]:
    """What the artifact must fit (artifacts/fit.py): publish and merge refuse output whose
    validators or solutions the model's vendor's torch would refuse, or the stand-in torch's
    output for a model that is not a stand-in."""
    stand_in = fit.is_stand_in_model(c.model, c.config.stand_in_models)
    return ["--gpu-vendor", c.spec.gpu.vendor, *(["--stand-in-model"] if stand_in else [])]


def _publish_container(c: Child, storage: PodStorage) -> dict[str, Any]:
    shards = c.spec.gpu.parallelism
    command = [
        "tunefleet-publish", "--dir", OUT_DIR, *c.where(), *_fit_args(c),
        "--image-reference", c.spec.image, "--image-id-file", f"{CONFIG_DIR}/{IMAGE_ID_KEY}",
        "--library-scope", c.config.library_scope,
        *(["--shards", str(shards)] if shards > 1 else []), *c.identity_args(),
    ]  # fmt: skip
    mounts: list[dict[str, Any]] = [
        {"name": "out", "mountPath": OUT_DIR, "readOnly": True},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    publish = with_storage(c.step("publish", command, mounts), storage)
    return with_storage(publish, signing_storage(c.spec, serving=False, config=c.config))


def _out_limit(spec: TuningProfileSpec) -> str:
    caches = sum(c.max_bytes for c in spec.artifacts.cache_specs())
    return "1Gi" if not caches else str((1 << 30) + caches)


def _tuning_storage(c: Child) -> PodStorage:
    """Brokered where the operator can: no credential of the store in a pod that runs the
    user's image."""
    if brokers(c.spec, c.config):
        return broker_storage(c.config)
    return pod_storage(c.spec, c.config)


def build_tuning_job(c: Child) -> dict[str, Any]:
    """One Indexed Job per GPU model: spec.gpu.parallelism pods, each tuning its share."""
    spec, model = c.spec, c.model
    storage = _tuning_storage(c)
    labels = c.labels()
    bootstrap = c.step(
        "bootstrap",
        ["tunefleet-bootstrap", "--dest", TOOLS_DIR],
        [{"name": "tools", "mountPath": TOOLS_DIR}],
    )
    volumes = [
        {"name": "tools", "emptyDir": {"sizeLimit": "64Mi"}},
        # Caches are packed here too: room for each at its bound (compressed, it is less).
        {"name": "out", "emptyDir": {"sizeLimit": _out_limit(spec)}},
        {"name": "exchange", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "tmp", "emptyDir": {}},
        # Every key, so that IMAGE_ID_KEY appears in publish's mount when the operator adds it.
        {"name": "config", "configMap": {"name": c.name()}},
    ]
    tune = _tune_container(c)
    if c.captured:
        volumes.append({"name": "captured", "configMap": {"name": c.captured}})
        tune["volumeMounts"].append(
            {"name": "captured", "mountPath": CAPTURED_DIR, "readOnly": True}
        )
        # A retune's missed cache keys: the workload runs again with each pod's key flags
        # (tuner_job/caches.py's variants; the file is there only when the set has some).
        tune["env"].append({"name": cc.VARIANTS_ENV, "value": f"{CAPTURED_DIR}/{cc.VARIANTS_KEY}"})
    volumes += signing_storage(spec, serving=False, config=c.config).volumes
    pod = _pod_spec([_publish_container(c, storage)], volumes, storage)
    pod["initContainers"] = [bootstrap, _sync_container(c, storage), tune]
    pod["nodeSelector"] = {naming.label_key(spec): model}
    # GPU nodes are commonly tainted with their resource name; tolerate only that.
    pod["tolerations"] = [
        {"key": naming.resource_name(spec), "operator": "Exists", "effect": "NoSchedule"}
    ]
    if spec.gpu.parallelism > 1:
        # One share per node: the point of parallelism is more nodes' GPUs at once.
        pod["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": labels},
                    }
                ]
            }
        }
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s.name} for s in spec.image_pull_secrets]
    shards = spec.gpu.parallelism
    # Indexed: pod i tunes share i (JOB_COMPLETION_INDEX); a failed share is retried alone,
    # up to backoffLimitPerIndex times.
    job = _job(
        c, c.name(), labels, pod,
        completionMode="Indexed", completions=shards, parallelism=shards,
        backoffLimitPerIndex=spec.tuning.backoff_limit,
        activeDeadlineSeconds=spec.tuning.active_deadline_seconds,
    )  # fmt: skip
    return apply_to_tuning_job(job, spec)


def held_for_gpu(job: dict[str, Any]) -> dict[str, Any]:
    """The tuning Job made suspended by the GPU gate (placement/gate.py), marked so that the
    gate, and only it, starts it; a suspended Job with no mark is someone else's to resume."""
    out = {**job, "metadata": dict(job["metadata"]), "spec": {**job["spec"], "suspend": True}}
    out["metadata"]["annotations"] = {
        **(job["metadata"].get("annotations") or {}),
        naming.GPU_GATE_ANNOTATION: "true",
    }
    return out


def build_merge_job(c: Child) -> dict[str, Any]:
    """With parallelism > 1: publish one artifact from the shares (no GPU, our image)."""
    spec, config = c.spec, c.config
    storage = pod_storage(spec, config)
    command = [
        "tunefleet-merge", *c.where(), *_fit_args(c), "--revision", c.revision,
        "--shards", str(spec.gpu.parallelism), "--library-scope", config.library_scope,
        "--image-reference", spec.image, *c.identity_args(),
    ]  # fmt: skip
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    if c.identity_args():
        # The identity document alone, from the tuning Job's ConfigMap (this revision's, which
        # lives as long as the tuning Job). Optional: a ConfigMap deleted meanwhile costs the
        # manifest its identity (the artifact serves its profile; no fleet adopts it), not
        # the merge.
        mounts.append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
        volumes.append(
            {
                "name": "config",
                "configMap": {
                    "name": c.name(),
                    "optional": True,
                    "items": [{"key": IDENTITY_KEY, "path": IDENTITY_KEY}],
                },
            }
        )
    merge = with_storage(c.step("merge", command, mounts), storage)
    if operator_signs(spec, config):
        # Only where the operator signs: the merge Job never mounts a key pair.
        signs = remote_signing(spec, config)
        merge = with_storage(merge, signs)
        volumes += signs.volumes
    pod = _pod_spec([merge], volumes, storage)
    labels = c.labels(role="merge")
    job = _job(c, c.name("merge"), labels, pod, backoffLimit=2, activeDeadlineSeconds=1800)
    return apply_to_merge_job(job, spec)
