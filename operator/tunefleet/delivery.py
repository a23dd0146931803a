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

import logging
from dataclasses import dataclass

from tunefleet import kube
from tunefleet.artifacts.fetch import FetchError, download_verified
from tunefleet.builders.artifact import build_artifact_config_map, is_packed
from tunefleet.config import Config
from tunefleet.contracts.artifact import ArtifactRecord
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import StoreError, StoreOptions

log = logging.getLogger(__name__)

DELIVERY_RETRY_S = 300.0
CONFIG_MAP = "ConfigMap"  # status.artifacts[].delivery of a delivered artifact


@dataclass(frozen=True)
class Delivered:
    name: str
    uid: str
    packed: bool  # gzipped into binaryData: pods unpack it with a local init container

    @property
    def note(self) -> str:
        return f"{CONFIG_MAP} gzip" if self.packed else CONFIG_MAP


def deliverable(config: Config) -> str:
    """ "" when the operator may read artifacts to deliver them, else why not."""
    if not (config.delivery_credentials_secret or config.delivery_cloud_identity):
        return (
            "the operator has no read identity for the store (the chart's "
            "delivery.credentialsSecret or delivery.cloudIdentity)"
        )
    return ""


def deliver(
    record: ArtifactRecord,
    *,
    namespace: str,
    profile: str,
    uid: str,
    endpoint: str,
    region: str,
    config: Config,
) -> Delivered:
    """The artifact's ConfigMap, made (or found, ours) now. Raises FetchError, StoreError or
    kube errors with why it could not be."""
    if parse_uri(record.uri).scheme != "s3":
        raise FetchError("a pvc:// artifact is read from the claim by the fetch init container")
    options = StoreOptions(
        endpoint_url=endpoint or None, region=region or None, timeout_s=config.delivery_timeout_s
    )
    got = download_verified(
        record.uri,
        record.sha256,
        gpu_model=record.gpu_model or None,
        options=options,
        manifest_sha256=record.manifest_sha256 or None,
    )
    cm = build_artifact_config_map(
        namespace=namespace,
        profile=profile,
        uid=uid,
        gpu_model=record.gpu_model,
        sha256=record.sha256,
        manifest_sha256=record.manifest_sha256,
        results=got.results,
        manifest=got.manifest,
    )
    if cm is None:
        raise FetchError(f"{len(got.results)} bytes do not fit a ConfigMap, even gzipped")
    name = cm["metadata"]["name"]
    made = kube.create_owned(cm) or kube.read("ConfigMap", namespace, name)
    if made is None:
        raise StoreError(f"ConfigMap {namespace}/{name} vanished as it was made")
    log.info(f"delivered {record.uri} as ConfigMap {namespace}/{name}")
    return Delivered(name, str(made["metadata"].get("uid") or ""), is_packed(cm))
