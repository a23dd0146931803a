"""What capture adds to a model pod (pure manifests; webhook/admission.py decides when):

- the volumes: the untuned files (an emptyDir the serving containers write and the sidecar
  reads), the hook (an emptyDir the hook init container fills), and the sidecar's token (a
  projected ServiceAccount token for the capture audience only, mounted in the sidecar alone);
- ``tunefleet-capture-hook``, an init container of tunefleet's image that installs the hook;
- ``tunefleet-capture``, the capture sidecar: a native sidecar (an init container with
  restartPolicy Always: it starts before the serving containers, runs beside them, and is
  stopped after them, so its last flush sees everything they recorded);
- the serving containers' environment: record-untuned on, the untuned file in the capture
  directory, the hook first on PYTHONPATH (prepended to a PYTHONPATH the container sets);
  with a vLLM cache served, the file the hook writes vLLM's compile-path records to (the
  sidecar reports which path each pod took).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from tunefleet.api import CaptureSpec
from tunefleet.builders.security import tunefleet_container
from tunefleet.config import Config
from tunefleet.contracts.capture_upload import AUDIENCE, CACHE_LOG_ENV, CACHE_LOG_NAME

SIDECAR = "tunefleet-capture"
HOOK_INIT = "tunefleet-capture-hook"
VOLUME = "tunefleet-capture"
HOOK_VOLUME = "tunefleet-capture-hook"
TOKEN_VOLUME = "tunefleet-capture-token"
CAPTURE_DIR = "/tunefleet/capture/misses"
HOOK_DIR = "/tunefleet/capture/hook"
TOKEN_DIR = "/var/run/secrets/tunefleet.io/capture"
TOKEN_PATH = f"{TOKEN_DIR}/token"
UNTUNED_FILENAME = f"{CAPTURE_DIR}/tunableop_untuned.csv"
CACHE_LOG = f"{CAPTURE_DIR}/{CACHE_LOG_NAME}"
TOKEN_SECONDS = 3600
CA_ENV = "TUNEFLEET_CAPTURE_CA"
RECORD_ENV = "PYTORCH_TUNABLEOP_RECORD_UNTUNED"
UNTUNED_ENV = "PYTORCH_TUNABLEOP_UNTUNED_FILENAME"
# The sidecar's measured footprint (bench/bench_capture.py) with room to spare.
SIDECAR_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "10m", "memory": "32Mi"},
    "limits": {"cpu": "200m", "memory": "96Mi"},
}


@dataclass(frozen=True)
class Endpoint:
    """How a model pod reaches the operator's capture endpoint."""

    url: str  # https://<service>.<namespace>.svc:<port>, checked against the certificate
    address: str = ""  # the Service's cluster IP, where the name does not resolve (no DNS)
    ca: str = ""  # the CA bundle (PEM) the endpoint's certificate is checked with


def endpoint_of(config: Config) -> Endpoint | None:
    if not config.capture_url:
        return None
    return Endpoint(config.capture_url, config.capture_address, config.capture_ca)


def volumes() -> list[dict[str, Any]]:
    return [
        {"name": VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": HOOK_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}},
        {
            "name": TOKEN_VOLUME,
            "projected": {
                # Mounted in the sidecar alone, which runs as its own user (not the pod's).
                "defaultMode": 0o444,
                "sources": [
                    {
                        "serviceAccountToken": {
                            "audience": AUDIENCE,
                            "expirationSeconds": TOKEN_SECONDS,
                            "path": "token",
                        }
                    }
                ],
            },
        },
    ]


def build_hook_container(config: Config) -> dict[str, Any]:
    return tunefleet_container(
        HOOK_INIT,
        ["tunefleet-capture", "install-hook", "--dest", HOOK_DIR],
        config,
        mounts=[{"name": HOOK_VOLUME, "mountPath": HOOK_DIR}],
        resources=copy.deepcopy(SIDECAR_RESOURCES),
    )


def build_sidecar(
    config: Config, capture: CaptureSpec, endpoint: Endpoint, results_volume: str, results_dir: str
) -> dict[str, Any]:
    limits = capture.limits
    command = [
        "tunefleet-capture", "run", "--dir", CAPTURE_DIR, "--results", results_dir,
        "--url", endpoint.url, "--token", TOKEN_PATH,
        "--interval", str(limits.upload_interval_seconds),
        "--max-rows", str(limits.max_rows_per_upload),
        *(["--address", endpoint.address] if endpoint.address else []),
    ]  # fmt: skip
    mounts = [
        {"name": VOLUME, "mountPath": CAPTURE_DIR, "readOnly": True},
        {"name": results_volume, "mountPath": results_dir, "readOnly": True},
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
    ]
    env = [{"name": CA_ENV, "value": endpoint.ca}] if endpoint.ca else []
    sidecar = tunefleet_container(
        SIDECAR,
        command,
        config,
        mounts=mounts,
        env=env,
        resources=copy.deepcopy(SIDECAR_RESOURCES),
    )
    # A native sidecar: stopped after the serving containers, so it flushes what they left.
    sidecar["restartPolicy"] = "Always"
    del sidecar["terminationMessagePolicy"]
    return sidecar


def serving_env(env: list[dict[str, Any]], cache_log: bool = False) -> list[dict[str, Any]]:
    """A serving container's env with capture's settings, those it sets itself kept. Its own
    PYTHONPATH gets the hook's directory in front; one from valueFrom cannot, and is kept.
    `cache_log`: a vLLM cache is served, and the hook writes down which path it took."""
    have = {e.get("name") for e in env}
    out = []
    for e in env:
        if e.get("name") == "PYTHONPATH" and "value" in e and e.get("valueFrom") is None:
            value = str(e.get("value") or "")
            if value.split(":")[0] != HOOK_DIR:
                e = {**e, "value": f"{HOOK_DIR}:{value}" if value else HOOK_DIR}
        out.append(e)
    wanted = [(UNTUNED_ENV, UNTUNED_FILENAME), ("PYTHONPATH", HOOK_DIR)]
    if cache_log:
        wanted.append((CACHE_LOG_ENV, CACHE_LOG))
    for name, value in wanted:
        if name not in have:
            out.append({"name": name, "value": value})
    return out


def serving_mounts() -> list[dict[str, Any]]:
    return [
        {"name": VOLUME, "mountPath": CAPTURE_DIR},
        {"name": HOOK_VOLUME, "mountPath": HOOK_DIR, "readOnly": True},
    ]
