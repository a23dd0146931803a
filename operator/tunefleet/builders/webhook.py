"""The manifests of admission: the webhook's registration, and what it adds to a model pod
(the fetch init container, the results volume, TunableOp's environment). webhook/admission.py
decides whether and what to inject; this module only builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tunefleet import naming
from tunefleet.artifacts import bundle, kinds
from tunefleet.builders.security import tunefleet_container
from tunefleet.builders.storage import with_storage
from tunefleet.config import Config
from tunefleet.contracts.fetch_outcome import CONTAINER as FETCH_CONTAINER
from tunefleet.storage.store import PodStorage
from tuner_job import caches as cc

HANDLER_ID = "pod-inject"
# Set by the API server on every namespace (since 1.21): a namespace selector by name.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
VOLUME = "tunefleet-results"
PACKED_VOLUME = "tunefleet-packed"
# The default kind's (artifacts/kinds/), under the names admission, placement and the plugin
# know them by: what the containers that load results get (a value the user set on a
# container wins), where, and the file of GPU ordinal i.
TUNABLE_ENV = kinds.kind().pod_env(capture=False)
RESULTS_DIR = kinds.kind().MOUNT_DIR
FILENAME = TUNABLE_ENV["PYTORCH_TUNABLEOP_FILENAME"]
FILE_PATTERN = kinds.kind().FILES.replace("%d", "{}")


def namespace_selector(namespaces: Sequence[str]) -> dict[str, Any] | None:
    """The namespaces a release's webhook is called for: those it watches (None: all). Several
    releases, each watching its own namespaces, then never admit each other's pods."""
    if not namespaces:
        return None
    return {
        "matchExpressions": [
            {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": sorted(set(namespaces))}
        ]
    }


def build_webhook_configuration(
    name: str,
    client_config: dict[str, Any],
    timeout_seconds: int = 5,
    failure_policy: str = "Ignore",
    namespaces: Sequence[str] = (),
) -> dict[str, Any]:
    """Only labelled pods ever reach us, and only in the namespaces we watch; Ignore keeps pod
    creation working when we're down."""
    hook: dict[str, Any] = {
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
    selector = namespace_selector(namespaces)
    if selector is not None:
        hook["namespaceSelector"] = selector
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "tunefleet"}},
        "webhooks": [hook],
    }


@dataclass(frozen=True)
class FetchOrder:
    """Which artifact a fetch init container reads: its URI and SHA-256s and the GPU model it
    is for; `bundle`: an oci:// store's bundle digest, the only reference fetch then reads the
    artifact by; `from_volume`: the artifact is the pod's image volume (mounted read-only):
    fetch checks it and copies its caches, and downloads nothing; `volume_links`: the serving
    containers mount that volume where fetch does, so the caches' big files are linked there
    rather than copied (volume_links)."""

    uri: str
    sha256: str
    manifest_sha256: str
    gpu_model: str
    bundle: str = ""
    from_volume: bool = False
    volume_links: bool = False


@dataclass(frozen=True)
class Serve:
    """How a pod takes its artifact, whichever init container fetches it: one results file
    per GPU ordinal, whether it refuses to start untuned, whether caches are unpacked, and
    (with caches) the bytes the bundle needs in the pod while fetch unpacks it and the most
    the pod may hold (0: no bound of the pod's own)."""

    devices: int
    fail_closed: bool
    caches: bool = False
    caches_needs: int = 0
    caches_room: int = 0
    request_storage: bool = True  # Config.fetch_storage_requests

    def fits(self) -> bool:
        return not self.caches_room or self.caches_needs <= self.caches_room


def serve_caches(
    devices: int, fail_closed: bool, entries: Sequence[cc.Packed], budget: int, config: Config
) -> Serve:
    """Serve for an artifact whose caches the pod unpacks: what they need, and the most the
    pod may hold (pod_budget)."""
    return Serve(
        devices,
        fail_closed,
        caches=bool(entries),
        caches_needs=bundle.needs(entries),
        caches_room=budget,
        request_storage=config.fetch_storage_requests,
    )


def pod_budget(pod: dict[str, Any]) -> int:
    """The disk this pod's caches may take (0: no bound of its own, the node's disk is the
    only one), the smaller of what it says:

    - the sum of its containers' ephemeral-storage limits, where any is set: the kubelet's
      pod-level limit, past which it evicts the pod (again and again under a Deployment);
    - its tunefleet.io/caches-limit annotation (a quantity), for nodes that account no local
      storage, where no ephemeral-storage limit can be set (the pod would stay Pending).

    A bundle that needs more is not unpacked: fetch says so and the stack starts cold."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        limit = ((c.get("resources") or {}).get("limits") or {}).get("ephemeral-storage")
        if limit is not None:
            total += _quantity(limit)
    said = ((pod.get("metadata") or {}).get("annotations") or {}).get(
        naming.CACHES_LIMIT_ANNOTATION
    )
    bounds = [b for b in (total, _quantity(said) if said is not None else 0) if b > 0]
    return min(bounds) if bounds else 0


_SUFFIXES = {
    "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip


def _quantity(value: Any) -> int:
    """A Kubernetes quantity in bytes (the suffixes a storage quantity takes); 0 for one that
    does not parse (the API server has already refused those)."""
    text = str(value).strip()
    for suffix, factor in sorted(_SUFFIXES.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(suffix):
            number, scale = text[: -len(suffix)], factor
            break
    else:
        number, scale = text, 1
    try:
        return int(float(number) * scale)
    except ValueError:
        return 0


# The fetch init container's memory, from what it uses: the interpreter and boto3's S3 client
# (~42 MiB of anonymous memory) and a few MiB of buffers and page cache, whatever the
# bundle's size (its cgroup's peak for a 1 GiB bundle: tests/e2e/test_bundles_large.py,
# bench/results.json bundles_large). The limit leaves twice that for oras (oci://), a
# signature's cryptography and an allocator's slack.
FETCH_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "100m", "memory": "64Mi"},
    "limits": {"memory": "128Mi"},
}
FETCH_TIMEOUT_S = 60  # the store's and fetch's own bound for a bundle-less artifact
# Slowest throughput a bundle is given time for (download and unpack together): a bundle's
# fetch is bounded at its size over this, on top of the base, never at a fixed minute.
FETCH_FLOOR_BYTES_PER_S = 16 << 20


def fetch_resources(serve: Serve) -> dict[str, Any]:
    """FETCH_RESOURCES, and with caches that fit, an ephemeral-storage request of what the
    bundle needs: the scheduler places the pod where the node's disk has room for it."""
    if not (serve.caches and serve.caches_needs and serve.request_storage and serve.fits()):
        return FETCH_RESOURCES
    requests = {**FETCH_RESOURCES["requests"], "ephemeral-storage": str(serve.caches_needs)}
    return {**FETCH_RESOURCES, "requests": requests}


def caches_args(serve: Serve) -> list[str]:
    """fetch's flags for a pod that unpacks caches: where, the room, and a time limit that
    grows with the bundle."""
    if not serve.caches:
        return []
    seconds = FETCH_TIMEOUT_S + serve.caches_needs // FETCH_FLOOR_BYTES_PER_S
    room = ["--caches-room", str(serve.caches_room)] if serve.caches_room else []
    return ["--caches-dest", CACHES_DIR, *room, "--timeout-seconds", str(seconds)]


def build_fetch_container(
    order: FetchOrder, serve: Serve, storage: PodStorage, config: Config
) -> dict[str, Any]:
    """The init container that downloads, verifies and writes one file per GPU ordinal (and,
    with caches, unpacks each cache into the pod's caches volume)."""
    o = order
    command = [
        "tunefleet-fetch", "--uri", o.uri, "--sha256", o.sha256, "--dest", RESULTS_DIR,
        "--devices", str(serve.devices), "--gpu-model", o.gpu_model,
        *(["--manifest-sha256", o.manifest_sha256] if o.manifest_sha256 else []),
        *(["--bundle", o.bundle] if o.bundle else []),
        *(["--from-volume", IMAGE_VOLUME_DIR] if o.from_volume else []),
        *(["--volume-served-at", IMAGE_VOLUME_DIR] if o.from_volume and o.volume_links else []),
        *(["--fail-closed"] if serve.fail_closed else []),
        *caches_args(serve),
    ]  # fmt: skip
    mounts: list[dict[str, Any]] = [{"name": VOLUME, "mountPath": RESULTS_DIR}]
    if o.from_volume:
        mounts = [image_volume_mount()]
    if serve.caches:
        mounts.append({"name": CACHES_VOLUME, "mountPath": CACHES_DIR})
    fetch = tunefleet_container(
        FETCH_CONTAINER, command, config, mounts=mounts, resources=fetch_resources(serve)
    )
    return with_storage(fetch, storage)


# Where fetch finds the pod's image volume (oci:// stores, delivery ImageVolume), and where
# the serving containers find it too when its caches are served as links into it.
IMAGE_VOLUME_DIR = "/tunefleet/volume"


def image_volume_mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": IMAGE_VOLUME_DIR, "readOnly": True}


def volume_links(pod: dict[str, Any]) -> bool:
    """Whether the caches of this pod's image volume may be served as links into the volume
    (ocibundle.copy_caches): the volume then is mounted at IMAGE_VOLUME_DIR in its serving
    containers as in fetch, so a link resolves in both. Not where its author asked for copies
    (tunefleet.io/caches-copy: "true") or a container of its own mounts something there."""
    said = ((pod.get("metadata") or {}).get("annotations") or {}).get(
        naming.CACHES_COPY_ANNOTATION, ""
    )
    if str(said).strip().lower() == "true":
        return False
    spec = pod.get("spec") or {}
    return not any(
        m.get("mountPath", "").rstrip("/") == IMAGE_VOLUME_DIR
        for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
        for m in c.get("volumeMounts") or []
    )


# Each cache unpacked into its own directory here (artifacts/bundle.py): pod-local and
# writable, since stacks add to their caches as they run; never a shared copy.
CACHES_VOLUME = "tunefleet-caches"
CACHES_DIR = kinds.kind("caches").MOUNT_DIR


def caches_volume(entries: Sequence[cc.Packed]) -> dict[str, Any]:
    """Room for every cache unpacked with its largest archive beside it while fetch works,
    and as much again as they unpack to for what the stack adds (artifacts/bundle.py)."""
    return {"name": CACHES_VOLUME, "emptyDir": {"sizeLimit": str(bundle.volume_bytes(entries))}}


def caches_mount() -> dict[str, Any]:
    return {"name": CACHES_VOLUME, "mountPath": CACHES_DIR}


def caches_env(
    specs: Sequence[cc.CacheSpec],
    carried: Sequence[str],
    have: set[str],
    settings: Sequence[tuple[str, str]] = (),
) -> list[dict[str, str]]:
    """The variables of each cache the artifact carries, pointing into the caches volume (the
    profile's spec names them, never the manifest), and the settings its caches were made with
    (the manifest's, each one cc.SETTINGS allows); a value the user set on a container wins."""
    wanted = dict(settings)
    wanted.update(cc.environment([s for s in specs if s.name in carried], CACHES_DIR))
    return [{"name": k, "value": v} for k, v in sorted(wanted.items()) if k not in have]


PACKED_DIR = "/tunefleet/packed"  # a gzipped artifact's ConfigMap, unpacked by fetch


def results_config_map_volume(name: str, devices: int, optional: bool) -> dict[str, Any]:
    """The artifact's ConfigMap as the results directory: one file per GPU ordinal, read-only.
    `optional`: a ConfigMap gone after admission lets the pod start (untuned); else it waits."""
    items = [{"key": k, "path": path} for k, path in kinds.kind().device_files(devices)]
    return {
        "name": VOLUME,
        "projected": {
            "defaultMode": 0o444,
            "sources": [{"configMap": {"name": name, "items": items, "optional": optional}}],
        },
    }


def packed_volume(name: str) -> dict[str, Any]:
    return {"name": PACKED_VOLUME, "configMap": {"name": name, "defaultMode": 0o444}}


def build_unpack_container(
    order: FetchOrder, serve: Serve, where: tuple[str, str], config: Config
) -> dict[str, Any]:
    """fetch, reading the mounted ConfigMap (no network, no credentials) into the results.
    `where`: (namespace, profile): mounted under the artifact's own key layout (with its GPU
    model), so fetch checks the manifest against it as it does in the store. The order's URI
    is the store's; fetch reads the mounted copy instead."""
    o = order
    packed = "/".join((PACKED_DIR, *where, o.gpu_model, o.sha256))
    command = [
        "tunefleet-fetch", "--uri", f"file://{packed}", "--sha256", o.sha256,
        "--dest", RESULTS_DIR, "--devices", str(serve.devices), "--gpu-model", o.gpu_model,
        *(["--manifest-sha256", o.manifest_sha256] if o.manifest_sha256 else []),
        *(["--fail-closed"] if serve.fail_closed else []),
    ]  # fmt: skip
    mounts: list[dict[str, Any]] = [
        {"name": VOLUME, "mountPath": RESULTS_DIR},
        {"name": PACKED_VOLUME, "mountPath": packed, "readOnly": True},
    ]
    return tunefleet_container(
        FETCH_CONTAINER,
        command,
        config,
        mounts=mounts,
    )


def results_volume() -> dict[str, Any]:
    return {"name": VOLUME, "emptyDir": {"sizeLimit": "256Mi"}}


def results_mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": RESULTS_DIR, "readOnly": True}


def tunable_env(have: set[str], capture: bool = False) -> list[dict[str, str]]:
    """TunableOp's settings for a container that loads results, but those it sets itself.
    With capture, it records what it finds no result for (builders/capture.py adds where)."""
    wanted = kinds.kind().pod_env(capture=capture)
    return [{"name": k, "value": v} for k, v in wanted.items() if k not in have]
