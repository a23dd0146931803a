"""Artifacts delivered by the API server: the operator reads each current artifact once from
the store (with its own read-only identity), verifies it exactly as the fetch init container
would, and keeps it in an immutable ConfigMap that model pods mount (builders/artifact.py).
A pod's start then makes no store request and needs no credentials; a scale-up of N pods
costs the store nothing, and an outage of the store does not reach them.

What cannot be delivered so (an artifact too big even gzipped, a pvc:// store the operator
does not mount, no read identity configured, the store failing) is served from the store by
the fetch init container, with `delivery` in status saying why; a failed delivery is tried
again after DELIVERY_RETRY_S.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tunefleet import naming
from tunefleet.artifacts import fit, gz
from tunefleet.artifacts.fetch import (
    MAX_RESULTS_BYTES,
    FetchError,
    Pinned,
    Signature,
    Verified,
    download_verified,
)
from tunefleet.builders.artifact import Payload, build_artifact_config_map, payload_keys
from tunefleet.config import Config
from tunefleet.contracts.admission_record import ARTIFACT_SHA_ANNOTATION, Admission
from tunefleet.contracts.artifact_record import IMAGE_VOLUME, ArtifactRecord
from tunefleet.kube import Kube
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import StoreOptions
from tunefleet.watched import views
from tunefleet.watched.views import ProfileRef
from tuner_job.output import MANIFEST_NAME

log = logging.getLogger(__name__)

DELIVERY_RETRY_S = 300.0
# How often a profile's artifact ConfigMaps are checked for ones nothing uses any more.
RETIRE_EVERY_S = 600.0
CONFIG_MAP = "ConfigMap"  # status.artifacts[].delivery of a delivered artifact


@dataclass(frozen=True)
class Foreign:
    """An object found under a name the operator makes an artifact's ConfigMap under, that is
    not that artifact: never mounted, reported, and stepped around."""

    name: str
    uid: str
    why: str


@dataclass(frozen=True)
class Delivered:
    name: str
    uid: str
    packed: bool  # gzipped into binaryData: pods unpack it with a local init container
    foreign: tuple[Foreign, ...] = ()  # found on the way, under the names tried before

    @property
    def note(self) -> str:
        return f"{CONFIG_MAP} gzip" if self.packed else CONFIG_MAP


class DeliveryError(Exception):
    """No ConfigMap could be had for the artifact; `foreign` says what stood in the way."""

    def __init__(self, message: str, foreign: tuple[Foreign, ...] = ()) -> None:
        super().__init__(message)
        self.foreign = foreign


# Names tried for one artifact's ConfigMap: the deterministic one, then one derived from each
# foreign object found in the way (so a squatter cannot block delivery, and a second
# reconcile finds the same name again).
NAMES_TRIED = 3


def deliverable(config: Config) -> str:
    """ "" when the operator may read artifacts to deliver them, else why not."""
    if not (config.delivery_credentials_secret or config.delivery_cloud_identity):
        return (
            "the operator has no read identity for the store (the chart's "
            "delivery.credentialsSecret or delivery.cloudIdentity)"
        )
    return ""


# --- image volumes (oci:// stores) ---------------------------------------------------------

# Image volumes: on by default in the API server from 1.35 (KEP-4639); the runtimes that mount
# them, from these versions.
IMAGE_VOLUME_MINOR = 35
RUNTIMES = {"containerd": (2, 1), "cri-o": (1, 31)}


def runtime_problem(runtimes: dict[str, str]) -> str:
    """Why these nodes cannot all mount image volumes ("" when they can)."""
    if not runtimes:
        return "no node of the GPU model is there to say whether its runtime mounts image volumes"
    for node, version in sorted(runtimes.items()):
        name, _, rest = version.partition("://")
        want = RUNTIMES.get(name)
        got = tuple(int(p) for p in rest.split("+")[0].split("-")[0].split(".")[:2] if p.isdigit())
        if want is None or len(got) < 2 or got < want:
            return (
                f"node {node} runs {version or 'an unknown runtime'}, which mounts no image volumes"
            )
    return ""


def image_volume_problem(mode: str, server_minor: int, runtimes: dict[str, str]) -> str:
    """Why model pods may not mount image volumes here ("" when they may): the chart's word
    (delivery.oci.imageVolumes), else what the API server and the nodes are."""
    if mode == "false":
        return "image volumes are off (the chart's delivery.oci.imageVolumes)"
    if mode == "true":
        return ""
    if server_minor < IMAGE_VOLUME_MINOR:
        return f"the API server (1.{server_minor}) does not serve image volumes by default"
    return runtime_problem(runtimes)


def deliver_image_volume(
    record: ArtifactRecord, spec_public_key: str, required: bool, config: Config, problem: str
) -> str:
    """IMAGE_VOLUME once the artifact's volume image verifies (artifacts/volumes.py: its
    signature by the profile's public key, its content against the artifact's pins); FetchError
    says why not (pods then fetch, and verify, from the registry). The verdict is kept for
    admission, which mounts nothing on the status's word."""
    from tunefleet.artifacts import volumes

    if problem:
        raise FetchError(problem)
    verdict = volumes.check(record, spec_public_key, required, config)
    volumes.VERDICTS.remember(record.volume, spec_public_key, required, verdict)
    if not verdict.mountable:
        raise FetchError(verdict.reason)
    log.info(f"{record.uri}: volume image {record.volume[:19]} verified; pods mount it")
    return IMAGE_VOLUME


def next_name(base: str, foreign_uid: str) -> str:
    """The name to try after a foreign object of this uid was found under the last one."""
    return f"{base}-{hashlib.sha256(foreign_uid.encode()).hexdigest()[:8]}"


def content_problem(
    config_map: dict[str, Any], sha256: str, manifest_sha256: str, profile_uid: str
) -> str:
    """Why this ConfigMap is not the artifact (sha256, manifest_sha256) delivered for the
    profile, judged by what it holds, never by its labels; "" when it is."""
    meta = config_map.get("metadata") or {}
    if views.owning_profile(meta) != profile_uid:
        return "it is not controlled by the TuningProfile"
    if config_map.get("immutable") is not True:
        return "it is not immutable (its content could change under running pods)"
    data = config_map.get("data") or {}
    binary = config_map.get("binaryData") or {}
    plain, gzipped = payload_keys()
    try:
        if gzipped in binary:
            results = gz.gunzip(base64.b64decode(binary[gzipped]), MAX_RESULTS_BYTES, gzipped)
        else:
            results = str(data.get(plain, "")).encode("utf-8")
    except (ValueError, OSError, EOFError) as e:
        return f"its packed results do not unpack ({e})"
    got = hashlib.sha256(results).hexdigest()
    if got != sha256:
        return f"its results have SHA-256 {got[:12]}, the artifact {sha256[:12]}"
    if manifest_sha256:
        manifest = str(data.get(MANIFEST_NAME, "")).encode("utf-8")
        held = hashlib.sha256(manifest).hexdigest()
        if held != manifest_sha256:
            return f"its manifest has SHA-256 {held[:12]}, the artifact's {manifest_sha256[:12]}"
    return ""


def artifact_config_map(
    record: ArtifactRecord,
    owner: ProfileRef,
    *,
    store: StoreOptions,
    config: Config,
    vendor: str = "",
    signature: Signature | None = None,
) -> dict[str, Any]:
    """The artifact's ConfigMap as it is to be made: the artifact read with the operator's
    read identity and verified (reconciler/apply.py makes it, or takes the one there if it
    holds exactly the artifact). Raises FetchError or StoreError with why it cannot be."""
    scheme = parse_uri(record.uri).scheme
    if scheme == "oci":
        raise FetchError(
            "an oci:// artifact is pulled by digest, its signature checked, by the fetch init "
            "container"
        )
    if scheme != "s3":
        raise FetchError("a pvc:// artifact is read from the claim by the fetch init container")
    got = _download(record, store, config, vendor, signature)
    cm = build_artifact_config_map(
        namespace=owner.namespace,
        profile=owner.name,
        uid=owner.uid,
        payload=Payload(
            gpu_model=record.gpu_model,
            sha256=record.sha256,
            manifest_sha256=record.manifest_sha256,
            results=got.results,
            manifest=got.manifest,
        ),
    )
    if cm is None:
        raise FetchError(f"{len(got.results)} bytes do not fit a ConfigMap, even gzipped")
    return cm


def store_options(endpoint: str, region: str, config: Config) -> StoreOptions:
    """How delivery reads the store: the profile's endpoint and region, the operator's
    delivery timeout."""
    return StoreOptions(
        endpoint_url=endpoint or None, region=region or None, timeout_s=config.delivery_timeout_s
    )


def _download(
    record: ArtifactRecord,
    options: StoreOptions,
    config: Config,
    vendor: str,
    signature: Signature | None,
) -> Verified:
    """The artifact read with the operator's read identity and verified as fetch does (its
    SHA-256s, its manifest and its signature, its fit to the GPU model)."""
    return download_verified(
        Pinned(
            record.uri,
            record.sha256,
            record.manifest_sha256 or None,
            record.gpu_model or None,
            fit.Target(
                record.gpu_model,
                vendor,
                fit.is_stand_in_model(record.gpu_model, config.stand_in_models),
            ),
        ),
        options=options,
        signature=signature,
    )


def referenced_names(status: dict[str, Any]) -> set[str]:
    """The artifact ConfigMaps status still serves or keeps for the record (history)."""
    names = set()
    for where in ("artifacts", "history"):
        for entry in status.get(where) or []:
            cm = entry.get("configMap") if isinstance(entry, dict) else None
            if isinstance(cm, dict) and cm.get("name"):
                names.add(str(cm["name"]))
    return names


def retirable(
    config_maps: Iterable[dict[str, Any]],
    profile_uid: str,
    serves: set[str],
    pods: Iterable[dict[str, Any]],
) -> list[tuple[str, str]]:
    """(name, uid) of the profile's artifact ConfigMaps that neither its status (`serves`:
    the names it serves or keeps in history) nor any model pod not yet ended names: a pod
    mounts its ConfigMap by name for its whole life (a restarted container, an init container
    run again), so one stays while a pod was pinned to it, however old. Only ConfigMaps the
    profile controls count (labels are not identity)."""
    keep = set(serves)
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase")
        admitted = Admission.read(pod)
        if phase not in ("Succeeded", "Failed") and admitted is not None and admitted.config_map:
            keep.add(admitted.config_map)
    out = []
    for cm in config_maps:
        meta = cm.get("metadata") or {}
        ours = views.owning_profile(meta) == profile_uid
        artifact = (meta.get("labels") or {}).get(naming.ROLE_LABEL) == "artifact"
        if ours and artifact and not meta.get("deletionTimestamp") and meta["name"] not in keep:
            if not holds_what_it_claims(cm, profile_uid):
                # A forgery that copied our labels and ownerReference: reported when it was
                # found in the way, never used, and never deleted by us either.
                continue
            out.append((str(meta["name"]), str(meta.get("uid") or "")))
    return sorted(out)


def holds_what_it_claims(config_map: dict[str, Any], profile_uid: str) -> bool:
    """Whether a ConfigMap holds the artifact its own annotations name (one the operator made
    does; content_problem says why another does not)."""
    anns = (config_map.get("metadata") or {}).get("annotations") or {}
    sha = str(anns.get(ARTIFACT_SHA_ANNOTATION) or "")
    manifest = str(anns.get(naming.MANIFEST_SHA_ANNOTATION) or "")
    return bool(sha) and not content_problem(config_map, sha, manifest, profile_uid)


def to_retire(
    client: Kube, owner: ProfileRef, serves: set[str]
) -> tuple[list[tuple[str, str]], list[str]]:
    """(name, uid) of the profile's artifact ConfigMaps nothing uses any more (see
    retirable), for reconciler/apply.py to delete; and the names of those still mounted by a
    pod (to check again later). Reads only: pods are listed only when there is a candidate."""
    namespace, profile, profile_uid = owner
    selector = f"{naming.PROFILE_UID_LABEL}={profile_uid},{naming.ROLE_LABEL}=artifact"
    config_maps = list(client.list_all("configmaps", selector, namespace))
    candidates = retirable(config_maps, profile_uid, serves, ())
    if not candidates:
        return [], []
    pods = client.list_all("pods", f"{naming.PROFILE_LABEL}={profile}", namespace)
    unused = retirable(config_maps, profile_uid, serves, pods)
    return unused, sorted({name for name, _ in candidates} - {name for name, _ in unused})
