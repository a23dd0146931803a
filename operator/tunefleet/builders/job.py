"""The tuning Job for one GPU model of a profile (design: bootstrap, tune, publish), and the
ConfigMap that carries its tuning configuration.

Sizes: the configuration (shapes, limits) travels as a file from a ConfigMap, never as one
environment string (Linux refuses any single one over 128 KiB); the workload's command and
args are the tune container's own argv, verbatim. The CRD's bounds keep both, and the Job,
within what Kubernetes and exec(2) accept (tests/unit/test_size_limits.py).
"""

from __future__ import annotations

import json
from typing import Any

from tunefleet import GROUP, KIND, VERSION, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.builders.security import SMALL_RESOURCES, hardened, tunefleet_container
from tunefleet.config import Config

TOOLS_DIR = "/tunefleet/tools"
OUT_DIR = "/tunefleet/out"
CONFIG_DIR = "/tunefleet/config"
CONFIG_KEY = "config.json"
# The operator adds this key to the Job's ConfigMap once the tune step has ended: the kubelet's
# imageID of the tune container, which publish records in the manifest.
IMAGE_ID_KEY = "tune-image-id"
# Shared by sync (the sidecar), tune and publish: library, checkpoints, progress (see
# tuner_job/exchange.py). No '.' and no '0' in the path: mgpu_tune_gemm_in_file's quirks.
EXCHANGE_DIR = "/tunefleet/exchange"
EXCHANGE_WAIT_SECONDS = 300
# The user's image decides where python lives; prefer python3, accept python. The workload
# command arrives as this script's positional arguments ("$@"), passed on untouched.
TUNE_SCRIPT = (
    'py="$(command -v python3 || command -v python)" || '
    '{ echo "tunefleet: no python3 or python in this image" | tee /dev/termination-log; '
    "exit 127; }; "
    f'exec "$py" -m tuner_job run --config {CONFIG_DIR}/{CONFIG_KEY} --out {OUT_DIR} -- "$@"'
)


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def tuning_config(
    spec: TuningProfileSpec, namespace: str, profile: str, model: str, rev: str
) -> dict[str, Any]:
    """What the tuner reads from --config (tuner_job's contract). The workload command is not
    in it: it is the tune container's argv (see TUNE_SCRIPT)."""
    workload = spec.workload.model_dump(
        by_alias=True, exclude_none=True, exclude={"env", "command", "args"}
    )
    for shape in workload.get("shapes", []):
        shape["m"], shape["n"], shape["k"] = shape.pop("mnk")
    tuning = spec.tuning.model_dump(
        by_alias=True, exclude={"active_deadline_seconds", "backoff_limit", "checkpoint"}
    )
    return {
        "namespace": namespace,
        "profile": profile,
        "gpuModel": model,
        "revision": rev,
        "gpus": spec.gpu.count,
        "shards": spec.gpu.parallelism,
        "exchange": {"dir": EXCHANGE_DIR, "waitSeconds": EXCHANGE_WAIT_SECONDS},
        "workload": workload,
        "tuning": tuning,
    }


def storage_env(spec: TuningProfileSpec, config: Config) -> list[dict[str, Any]]:
    """S3 credentials by reference only: the Secret's keys, never their values."""
    env: list[dict[str, Any]] = []
    secret = (
        spec.storage.credentials_secret.name
        if spec.storage.credentials_secret
        else config.default_credentials_secret
    )
    if secret:
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    if spec.storage.region:
        env.append({"name": "AWS_REGION", "value": spec.storage.region})
    return env


def storage_args(spec: TuningProfileSpec, config: Config) -> list[str]:
    args: list[str] = []
    endpoint = spec.storage.endpoint or config.default_s3_endpoint
    if endpoint:
        args += ["--endpoint-url", endpoint]
    if spec.storage.region:
        args += ["--region", spec.storage.region]
    return args


def where_args(spec: TuningProfileSpec, namespace: str, profile: str, model: str) -> list[str]:
    """Where an artifact of (namespace, profile, model) lives: the arguments every S3 step of
    a tuning pod or the merge Job takes (sync, publish, merge)."""
    return [
        "--uri",
        spec.storage.uri,
        "--namespace",
        namespace,
        "--profile",
        profile,
        "--gpu-model",
        model,
    ]


def build_tuning_config_map(
    spec: TuningProfileSpec,
    *,
    namespace: str,
    profile: str,
    uid: str,
    model: str,
) -> dict[str, Any]:
    """The tune step's configuration, under the Job's own name (made before the Job)."""
    rev = naming.revision(spec)
    data = json.dumps(
        tuning_config(spec, namespace, profile, model, rev), separators=(",", ":"), sort_keys=True
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": naming.job_name(profile, model, rev, uid),
            "namespace": namespace,
            "labels": naming.job_labels(profile, uid, model, rev),
            "annotations": {naming.MODEL_ANNOTATION: model},
            "ownerReferences": [owner_reference(profile, uid)],
        },
        "data": {CONFIG_KEY: data},
    }


def _sync_container(
    spec: TuningProfileSpec, config: Config, *, namespace: str, profile: str, model: str, rev: str
) -> dict[str, Any]:
    """The tuning pod's native sidecar: library in, checkpoints out (tuner_job can't do S3)."""
    every = spec.tuning.checkpoint
    sync = tunefleet_container(
        "sync",
        [
            "tunefleet-sync",
            "--exchange",
            EXCHANGE_DIR,
            *where_args(spec, namespace, profile, model),
            "--revision",
            rev,
            "--shards",
            str(spec.gpu.parallelism),
            "--library-scope",
            config.library_scope,
            "--checkpoint-every-gemms",
            str(every.every_gemms),
            "--checkpoint-every-seconds",
            str(every.every_seconds),
            *storage_args(spec, config),
        ],
        image=config.image,
        pull_policy=config.image_pull_policy,
        mounts=[
            {"name": "exchange", "mountPath": EXCHANGE_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        env=storage_env(spec, config),
        # Merging a large library (bounded: 500 entries, 32 MiB) peaks near 130 MiB.
        resources={**SMALL_RESOURCES, "limits": {"memory": "384Mi"}},
    )
    # A native sidecar: starts before tune, runs beside it and publish, stopped after.
    sync["restartPolicy"] = "Always"
    del sync["terminationMessagePolicy"]  # its end is the kubelet stopping it, not a verdict
    return sync


def build_tuning_job(
    spec: TuningProfileSpec,
    *,
    namespace: str,
    profile: str,
    uid: str,
    model: str,
    config: Config,
) -> dict[str, Any]:
    """One Indexed Job per GPU model: spec.gpu.parallelism pods, each tuning its share."""
    rev = naming.revision(spec)
    name = naming.job_name(profile, model, rev, uid)
    labels = naming.job_labels(profile, uid, model, rev)
    resource = naming.resource_name(spec)
    gpus = str(spec.gpu.count)
    shards = spec.gpu.parallelism

    user_env = [e.model_dump(by_alias=True, exclude_none=True) for e in spec.workload.env or []]
    tune_env = [
        {"name": "PYTHONPATH", "value": TOOLS_DIR},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        *user_env,
    ]
    volumes = [
        {"name": "tools", "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": "out", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "exchange", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "tmp", "emptyDir": {}},
        # Every key, so that IMAGE_ID_KEY appears in publish's mount when the operator adds it.
        {"name": "config", "configMap": {"name": name}},
    ]
    bootstrap = tunefleet_container(
        "bootstrap",
        ["tunefleet-bootstrap", "--dest", TOOLS_DIR],
        mounts=[{"name": "tools", "mountPath": TOOLS_DIR}],
        image=config.image,
        pull_policy=config.image_pull_policy,
    )
    tune = {
        "name": "tune",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        # "tune" is $0 of the script; the workload's argv follows as "$@".
        "command": ["/bin/sh", "-c", TUNE_SCRIPT, "tune"],
        "args": [*(spec.workload.command or []), *(spec.workload.args or [])],
        "env": tune_env,
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
    publish = tunefleet_container(
        "publish",
        [
            "tunefleet-publish",
            "--dir",
            OUT_DIR,
            *where_args(spec, namespace, profile, model),
            "--image-reference",
            spec.image,
            "--image-id-file",
            f"{CONFIG_DIR}/{IMAGE_ID_KEY}",
            "--library-scope",
            config.library_scope,
            *(["--shards", str(shards)] if shards > 1 else []),
            *storage_args(spec, config),
        ],
        mounts=[
            {"name": "out", "mountPath": OUT_DIR, "readOnly": True},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        env=storage_env(spec, config),
        image=config.image,
        pull_policy=config.image_pull_policy,
    )
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "nodeSelector": {naming.label_key(spec): model},
        # GPU nodes are commonly tainted with their resource name; tolerate only that.
        "tolerations": [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": volumes,
        "initContainers": [
            bootstrap,
            _sync_container(
                spec, config, namespace=namespace, profile=profile, model=model, rev=rev
            ),
            tune,
        ],
        "containers": [publish],
    }
    if shards > 1:
        # One share per node: the point of parallelism is more nodes' GPUs at once.
        pod_spec["affinity"] = {
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
        pod_spec["imagePullSecrets"] = [{"name": s.name} for s in spec.image_pull_secrets]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {naming.MODEL_ANNOTATION: model},
            "ownerReferences": [owner_reference(profile, uid)],
        },
        "spec": {
            # Indexed: pod i tunes share i (JOB_COMPLETION_INDEX); a failed share is retried
            # alone, up to backoffLimit times.
            "completionMode": "Indexed",
            "completions": shards,
            "parallelism": shards,
            "backoffLimitPerIndex": spec.tuning.backoff_limit,
            "activeDeadlineSeconds": spec.tuning.active_deadline_seconds,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def build_merge_job(
    spec: TuningProfileSpec,
    *,
    namespace: str,
    profile: str,
    uid: str,
    model: str,
    config: Config,
) -> dict[str, Any]:
    """With parallelism > 1: publish one artifact from the shares (no GPU, our image)."""
    rev = naming.revision(spec)
    labels = naming.job_labels(profile, uid, model, rev, role="merge")
    merge = tunefleet_container(
        "merge",
        [
            "tunefleet-merge",
            *where_args(spec, namespace, profile, model),
            "--revision",
            rev,
            "--shards",
            str(spec.gpu.parallelism),
            "--library-scope",
            config.library_scope,
            "--image-reference",
            spec.image,
            *storage_args(spec, config),
        ],
        image=config.image,
        pull_policy=config.image_pull_policy,
        mounts=[{"name": "tmp", "mountPath": "/tmp"}],
        env=storage_env(spec, config),
    )
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [{"name": "tmp", "emptyDir": {}}],
        "containers": [merge],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": naming.job_name(profile, model, rev, uid, step="merge"),
            "namespace": namespace,
            "labels": labels,
            "annotations": {naming.MODEL_ANNOTATION: model},
            "ownerReferences": [owner_reference(profile, uid)],
        },
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": 1800,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
