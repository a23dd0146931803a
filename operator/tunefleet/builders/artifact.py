"""The immutable ConfigMap an artifact is delivered in (pure): model pods mount it, so a pod's
start needs no init container, no storage credentials and no store request, and the kubelet of
each node caches it for every pod there.

An artifact too big for a ConfigMap's 1 MiB (what etcd takes) is gzipped into binaryData (the
fetch init container then unpacks it, locally); one that does not fit even so is served from
the store (None here).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
from dataclasses import dataclass
from typing import Any

from tunefleet import naming
from tunefleet.artifacts import kinds
from tunefleet.builders.job import owner_reference
from tunefleet.contracts.admission_record import ARTIFACT_SHA_ANNOTATION
from tuner_job.output import MANIFEST_NAME

# A ConfigMap's data and binaryData together: 1 MiB, less room for its metadata.
CONFIG_MAP_BYTES = 1024 * 1024 - 16 * 1024
# The gzipped payload's key, for readers that know no kinds yet (capture/keys.py).
PACKED_NAME = kinds.kind().PAYLOAD + ".gz"


def payload_keys() -> tuple[str, str]:
    """The payload's key in an artifact ConfigMap, plain (data) and gzipped (binaryData): the
    default kind's (artifacts/kinds/), asked when used."""
    payload = kinds.kind().PAYLOAD
    return payload, payload + ".gz"


def artifact_config_map_name(sha256: str, profile_uid: str) -> str:
    """Named by the artifact's SHA-256, and the profile's: two profiles that tuned identical
    results own a ConfigMap each."""
    owner = hashlib.sha256(profile_uid.encode()).hexdigest()[:8]
    return f"tunefleet-artifact-{sha256}-{owner}"


@dataclass(frozen=True)
class Payload:
    """One verified artifact as the operator read it: the GPU model it is for, its SHA-256s,
    its payload's bytes and its manifest's."""

    gpu_model: str
    sha256: str
    manifest_sha256: str
    results: bytes
    manifest: bytes


def build_artifact_config_map(
    *, namespace: str, profile: str, uid: str, payload: Payload
) -> dict[str, Any] | None:
    """The ConfigMap of one verified artifact, or None when it cannot fit one."""
    gpu_model, sha256, manifest_sha256 = payload.gpu_model, payload.sha256, payload.manifest_sha256
    results, manifest = payload.results, payload.manifest
    plain, gzipped = payload_keys()
    data: dict[str, str] = {MANIFEST_NAME: manifest.decode("utf-8")}
    binary: dict[str, str] = {}
    if len(results) + len(manifest) <= CONFIG_MAP_BYTES:
        data[plain] = results.decode("utf-8")
        packed = False
    else:
        # mtime 0: the same results always pack to the same bytes.
        blob = base64.b64encode(gzip.compress(results, mtime=0)).decode("ascii")
        if len(blob) + len(manifest) > CONFIG_MAP_BYTES:
            return None
        binary[gzipped] = blob
        packed = True
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": artifact_config_map_name(sha256, uid),
            "namespace": namespace,
            "labels": naming.artifact_config_map_labels(uid),
            "annotations": {
                naming.MODEL_ANNOTATION: gpu_model,
                ARTIFACT_SHA_ANNOTATION: sha256,
                naming.MANIFEST_SHA_ANNOTATION: manifest_sha256,
                naming.PACKED_ANNOTATION: "gzip" if packed else "none",
            },
            "ownerReferences": [owner_reference(profile, uid)],
        },
        # Immutable: the kubelet stops watching it, and only a delete and a new object (with
        # another uid, which admission checks) could change what pods mount.
        "immutable": True,
        "data": data,
    }
    if binary:
        cm["binaryData"] = binary
    return cm


def is_packed(config_map: dict[str, Any]) -> bool:
    return payload_keys()[1] in (config_map.get("binaryData") or {})
