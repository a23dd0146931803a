"""The manifests of admission: the webhook's registration, and what it adds to a model pod
(the fetch init container, the results volume, TunableOp's environment). webhook/admission.py
decides whether and what to inject; this module only builds.
"""

from __future__ import annotations

from typing import Any

from tunefleet import naming
from tunefleet.builders.security import tunefleet_container
from tunefleet.builders.storage import with_storage
from tunefleet.config import Config
from tunefleet.contracts.fetch import CONTAINER as FETCH_CONTAINER
from tunefleet.storage.store import PodStorage

HANDLER_ID = "pod-inject"
VOLUME = "tunefleet-results"
RESULTS_DIR = "/tunefleet/results"
FILENAME = f"{RESULTS_DIR}/tunableop_results%d.csv"
# What the containers that load results get; a value the user set on a container wins.
TUNABLE_ENV = {
    "PYTORCH_TUNABLEOP_ENABLED": "1",
    "PYTORCH_TUNABLEOP_TUNING": "0",
    "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
    "PYTORCH_TUNABLEOP_FILENAME": FILENAME,
}


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


def build_fetch_container(
    *,
    uri: str,
    sha256: str,
    manifest_sha256: str,
    devices: int,
    gpu_model: str,
    fail_closed: bool,
    storage: PodStorage,
    config: Config,
) -> dict[str, Any]:
    """The init container that downloads, verifies and writes one file per GPU ordinal."""
    command = [
        "tunefleet-fetch", "--uri", uri, "--sha256", sha256, "--dest", RESULTS_DIR,
        "--devices", str(devices), "--gpu-model", gpu_model,
        *(["--manifest-sha256", manifest_sha256] if manifest_sha256 else []),
        *(["--fail-closed"] if fail_closed else []),
    ]  # fmt: skip
    fetch = tunefleet_container(
        FETCH_CONTAINER,
        command,
        image=config.image,
        pull_policy=config.image_pull_policy,
        mounts=[{"name": VOLUME, "mountPath": RESULTS_DIR}],
    )
    return with_storage(fetch, storage)


def results_volume() -> dict[str, Any]:
    return {"name": VOLUME, "emptyDir": {"sizeLimit": "256Mi"}}


def results_mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": RESULTS_DIR, "readOnly": True}


def tunable_env(have: set[str]) -> list[dict[str, str]]:
    """TunableOp's settings for a container that loads results, but those it sets itself."""
    return [{"name": k, "value": v} for k, v in TUNABLE_ENV.items() if k not in have]
