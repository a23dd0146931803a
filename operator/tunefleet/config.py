"""Operator settings, read once from the environment (the chart sets them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tunefleet import __version__
from tunefleet.api.policy import ProfilePolicy


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _registry_hosts(directory: str) -> tuple[str, ...]:
    """The hosts a docker config directory holds credentials for; () when it names none or
    cannot be read (the proxy's start then says why: signer/registry_route.Identity.load)."""
    if not directory:
        return ()
    from pathlib import Path

    from tunefleet.storage.oci import auth_headers

    try:
        return tuple(sorted(auth_headers(Path(directory))))
    except ValueError:
        return ()


@dataclass(frozen=True)
class Config:
    # The tunefleet image: runs bootstrap and publish in tuning Jobs, fetch in model pods.
    image: str = f"ghcr.io/tunefleet/tunefleet:{__version__}"
    image_pull_policy: str = "IfNotPresent"
    # Used when a profile names no credentials Secret; empty means the pod's cloud identity.
    default_credentials_secret: str = ""
    default_s3_endpoint: str = ""
    webhook_enabled: bool = True
    webhook_addr: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_host: str = ""  # how the API server reaches us, for self-registration and certs
    webhook_certfile: str = ""
    webhook_keyfile: str = ""
    # Set (to a configuration name) only where nothing else registers the webhook: `make run`.
    webhook_register: str = ""
    webhook_timeout_seconds: int = 5
    namespaces: tuple[str, ...] = field(default_factory=tuple)
    # Reconcile workers (threads making API calls) and the full resync interval. A reconcile
    # mostly waits on the API server (a burst's: a Job create, then a status write); under
    # a burst of 80 profiles a second those took ~100 ms, so 8 workers kept up with ~60 a
    # second and fell 42 s behind at 10,000; 16 kept up (bench/scale.md).
    workers: int = 16
    resync_seconds: float = 600.0
    # Prometheus metrics port (0: off).
    metrics_port: int = 8081
    # The per-profile gauges (what each profile's artifacts buy, docs/metrics.md): series per
    # profile x GPU model x figure, so off unless asked for (the chart's metrics.perProfile,
    # on with its dashboard, which reads them).
    profile_metrics: bool = False
    # Leader election: the Lease's namespace (the chart sets the release's); empty means no
    # election, this process always reconciles (one replica, `make run`).
    lease_namespace: str = ""
    lease_name: str = "tunefleet-operator"
    # Library scope for tuning Jobs: "namespace" (default) or "cluster".
    library_scope: str = "namespace"
    # Read-only store credentials for model pods' fetch (a Secret in the profile's namespace)
    # when a profile names none; never the tuning Jobs' publish Secret.
    default_serving_credentials_secret: str = ""
    # The operator's own read identity for delivering artifacts as ConfigMaps (delivery.py):
    # the name of the Secret the chart put in its environment, or its cloud identity.
    delivery_credentials_secret: str = ""
    # Fetch init containers request the ephemeral storage their bundle needs (the chart's
    # delivery.storageRequests): off for nodes that account no local storage, where any
    # ephemeral-storage request leaves a pod Pending.
    fetch_storage_requests: bool = True
    delivery_cloud_identity: bool = False
    delivery_timeout_s: float = 30.0
    # oci:// stores: the operator's registry read identity (a mounted dockerconfigjson Secret's
    # directory; "" none) and whether model pods may mount image volumes: auto, true, false.
    oci_config: str = ""
    image_volumes: str = "auto"
    # What a profile's spec.template may ask for (policy.py; the chart's profilePolicy).
    profile_policy: ProfilePolicy = field(default_factory=ProfilePolicy)
    # The capture endpoint (capture/endpoint.py): its port on every replica (0, the default
    # outside the chart: off), and how model pods reach it: an explicit URL, else the Service
    # (name.namespace) and its port. Its address and CA are learnt at startup, not configured.
    capture_port: int = 0
    capture_url: str = ""
    capture_service: str = ""
    capture_service_port: int = 8443
    capture_address: str = ""
    capture_ca: str = ""
    # GPU models that name no real GPU (a test fleet: kwok nodes, the local cluster's real
    # node), whose artifacts may be the stand-in torch's output (artifacts/fit.py); "*": every
    # model. Models named STANDIN... are stand-ins without being listed.
    stand_in_models: tuple[str, ...] = ()
    # Fleet mode (fleet/, docs/fleet.md): profiles adopt artifacts that another profile or
    # cluster sharing their store tuned for the same identity, and claim an identity in the
    # store before tuning it (the operator then needs write access under <prefix>/_fleet/).
    # A claim lasts fleet_claim_seconds unless renewed; fleet_cluster is this cluster's
    # kube-system namespace uid, learnt at start.
    fleet: bool = False
    # The GPU gate (placement/gate.py): tuning Jobs wait suspended while tunefleet's own Jobs
    # hold every GPU of their model, instead of as pods the scheduler cannot place.
    gpu_gate: bool = True
    fleet_claim_seconds: float = 600.0
    fleet_cluster: str = ""
    # Signing by the operator (signer/, the chart's signing.secret): the directory of its
    # cosign key pair, mounted from a Secret in its own namespace ("": tuning Jobs sign with
    # the profile's signing Secret, as before). Its endpoint is capture's server.
    signing_key_dir: str = ""
    # The store broker (signer/store_route.py, the chart's signing.storeCredentialsSecret): the
    # operator holds a publish identity for s3:// stores, and tuning pods of the profiles it
    # signs for reach the store through it, holding no credential of the store.
    store_broker: bool = False
    # The registry proxy (signer/registry_route.py, the chart's signing.registryCredentialsSecret):
    # the directory of a docker config that may push to the oci:// stores, and the registry
    # hosts it names; tuning pods of the oci:// profiles the operator signs for, on those
    # hosts, reach their registry through it and hold no credential of it.
    registry_broker_config: str = ""
    registry_broker_hosts: tuple[str, ...] = ()
    # oci:// stores in fleet mode: how long a bid stands before it holds (fleet/bids.py; long
    # against a push's time plus clock skew), and the registry identity that may push the
    # claims and entries (a mounted dockerconfigjson Secret; "": oci_config's).
    fleet_settle_seconds: float = 5.0
    fleet_oci_config: str = ""

    @classmethod
    def from_env(cls) -> Config:
        env = os.environ.get
        return cls(
            image=env("TUNEFLEET_IMAGE", cls.image),
            image_pull_policy=env("TUNEFLEET_IMAGE_PULL_POLICY", cls.image_pull_policy),
            default_credentials_secret=env("TUNEFLEET_DEFAULT_CREDENTIALS_SECRET", ""),
            default_s3_endpoint=env("TUNEFLEET_DEFAULT_S3_ENDPOINT", ""),
            webhook_enabled=_env_bool("TUNEFLEET_WEBHOOK_ENABLED", True),
            webhook_addr=env("TUNEFLEET_WEBHOOK_ADDR", cls.webhook_addr),
            webhook_port=int(env("TUNEFLEET_WEBHOOK_PORT", str(cls.webhook_port))),
            webhook_host=env("TUNEFLEET_WEBHOOK_HOST", ""),
            webhook_certfile=env("TUNEFLEET_WEBHOOK_CERT", ""),
            webhook_keyfile=env("TUNEFLEET_WEBHOOK_KEY", ""),
            webhook_register=env("TUNEFLEET_WEBHOOK_REGISTER", ""),
            webhook_timeout_seconds=int(env("TUNEFLEET_WEBHOOK_TIMEOUT_SECONDS", "5")),
            namespaces=tuple(n for n in env("TUNEFLEET_NAMESPACES", "").split(",") if n),
            workers=max(1, int(env("TUNEFLEET_WORKERS", "16"))),
            resync_seconds=max(10.0, float(env("TUNEFLEET_RESYNC_SECONDS", "600"))),
            metrics_port=int(env("TUNEFLEET_METRICS_PORT", "8081")),
            profile_metrics=_env_bool("TUNEFLEET_PROFILE_METRICS", False),
            lease_namespace=env("TUNEFLEET_LEASE_NAMESPACE", ""),
            lease_name=env("TUNEFLEET_LEASE_NAME", "tunefleet-operator"),
            library_scope=env("TUNEFLEET_LIBRARY_SCOPE", "namespace"),
            default_serving_credentials_secret=env(
                "TUNEFLEET_DEFAULT_SERVING_CREDENTIALS_SECRET", ""
            ),
            delivery_credentials_secret=env("TUNEFLEET_DELIVERY_CREDENTIALS_SECRET", ""),
            fetch_storage_requests=_env_bool("TUNEFLEET_FETCH_STORAGE_REQUESTS", True),
            delivery_cloud_identity=_env_bool("TUNEFLEET_DELIVERY_CLOUD_IDENTITY", False),
            delivery_timeout_s=float(env("TUNEFLEET_DELIVERY_TIMEOUT_SECONDS", "30")),
            oci_config=env("TUNEFLEET_OCI_CONFIG", ""),
            image_volumes=env("TUNEFLEET_IMAGE_VOLUMES", "auto").strip().lower() or "auto",
            profile_policy=ProfilePolicy.from_json(env("TUNEFLEET_PROFILE_POLICY", "")),
            capture_port=int(env("TUNEFLEET_CAPTURE_PORT", str(cls.capture_port))),
            capture_url=env("TUNEFLEET_CAPTURE_URL", ""),
            capture_service=env("TUNEFLEET_CAPTURE_SERVICE", ""),
            capture_service_port=int(env("TUNEFLEET_CAPTURE_SERVICE_PORT", "8443")),
            capture_address=env("TUNEFLEET_CAPTURE_ADDRESS", ""),
            stand_in_models=tuple(
                m.strip() for m in env("TUNEFLEET_STAND_IN_MODELS", "").split(",") if m.strip()
            ),
            fleet=_env_bool("TUNEFLEET_FLEET", False),
            gpu_gate=_env_bool("TUNEFLEET_GPU_GATE", True),
            fleet_claim_seconds=min(
                86400.0, max(60.0, float(env("TUNEFLEET_FLEET_CLAIM_SECONDS", "600")))
            ),
            fleet_settle_seconds=min(
                60.0, max(1.0, float(env("TUNEFLEET_FLEET_SETTLE_SECONDS", "5")))
            ),
            fleet_oci_config=env("TUNEFLEET_FLEET_OCI_CONFIG", ""),
            signing_key_dir=env("TUNEFLEET_SIGNING_KEY_DIR", ""),
            store_broker=_env_bool("TUNEFLEET_STORE_BROKER", False),
            registry_broker_config=env("TUNEFLEET_REGISTRY_BROKER_CONFIG", ""),
            registry_broker_hosts=_registry_hosts(env("TUNEFLEET_REGISTRY_BROKER_CONFIG", "")),
        )
