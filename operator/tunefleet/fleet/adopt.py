"""Published entries: the first complete artifact of an identity, for every profile and cluster
sharing the store.

A profile's own artifact is published once it serves it (the gate passed it); an entry found
for a profile with no artifact of its identity is adopted only after the checks its own
artifact gets and more: it lies in the profile's own store location, its SHA-256s, manifest
and signature check out as the profile's storage.signing asks (download_verified: what fetch
and delivery check), it fits the profile's GPU model, and its manifest says it was tuned in
the image the profile pins, by digest. Whatever fails is reported and not adopted; the profile
then tunes its own.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from tunefleet import images
from tunefleet.api import StorageSpec, TuningProfileSpec
from tunefleet.artifacts import fit, ocibundle, signing
from tunefleet.artifacts.fetch import FetchError, Pinned, Signature, download_verified
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.contracts.fleet import MAX_BYTES, Holder, Published
from tunefleet.storage.oci import OciStore
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import (
    ConflictError,
    NotFoundError,
    Store,
    StoreError,
    TooLargeError,
)

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/json"


class NotAdoptable(Exception):
    """An entry that fails a check: the message says which, for status and Events."""


def read(store: Store, key: str, identity: str, gpu_model: str) -> Published | None:
    """The entry at `key`, or None when there is none. NotAdoptable when something is there
    that is not an entry for this identity and GPU model; StoreError when the store fails."""
    try:
        data = store.get(key, MAX_BYTES)
    except NotFoundError:
        return None
    except (ConflictError, TooLargeError) as e:
        # Something else under the key (a registry's tag moved onto another object, or an
        # object too large to be an entry): not obeyed, and replaced by the next publisher.
        raise NotAdoptable(f"{store.uri(key)}: {e}") from None
    entry = Published.from_bytes(data, identity, gpu_model)
    if entry is None:
        raise NotAdoptable(f"{store.uri(key)} is not a fleet entry for this identity")
    return entry


def verify(
    entry: Published,
    spec: TuningProfileSpec,
    stand_in_models: tuple[str, ...],
    store: Store,
) -> None:
    """NotAdoptable unless the entry's artifact is one this profile may serve as its own."""
    record, model, storage = entry.record, entry.gpu_model, spec.storage
    if not _inside(record.uri, storage.uri):
        raise NotAdoptable(
            f"its artifact {record.uri} is outside this profile's store {storage.uri}"
        )
    if not record.manifest_sha256:
        raise NotAdoptable(f"its artifact {record.uri} names no manifest SHA-256")
    if isinstance(store, OciStore):
        store = _signed_bundle(record, storage, store)
    try:
        verified = download_verified(
            Pinned(
                record.uri,
                record.sha256,
                record.manifest_sha256 or None,
                model,
                fit.Target(model, spec.gpu.vendor, fit.is_stand_in_model(model, stand_in_models)),
            ),
            store=store,
            signature=Signature.asked(storage.public_key, storage.signing_policy),
        )
    except (FetchError, ValueError) as e:
        raise NotAdoptable(f"its artifact {record.uri} does not check: {e}") from None
    ran = verified.parsed.image if verified.parsed is not None else None
    want = images.parse(spec.image).digest
    got = _digest(ran.reference) if ran is not None else None
    if want is None or got is None or got.lower() != want.lower():
        raise NotAdoptable(
            f"its artifact was tuned in {ran.reference if ran else 'an unnamed image'}, not in "
            f"this profile's image {spec.image}"
        )


def _inside(uri: str, root: str) -> bool:
    """Whether the artifact at `uri` lies in the store `root` names (its bucket or
    repository, under its prefix)."""
    try:
        where, store = parse_uri(uri), parse_uri(root)
    except ValueError:
        return False
    return (where.scheme, where.bucket) == (store.scheme, store.bucket) and (
        not store.prefix or where.prefix.startswith(store.prefix + "/")
    )


def _signed_bundle(record: ArtifactRecord, storage: StorageSpec, store: OciStore) -> Store:
    """An oci:// artifact is adopted as its bundle, by digest, and only once the bundle's
    signature verifies with the profile's key: whatever its policy, a bundle another cluster
    published is trusted for its signature, never for the entry's word."""
    if not record.bundle:
        raise NotAdoptable(f"its artifact {record.uri} names no bundle to verify")
    if not storage.public_key:
        raise NotAdoptable(
            "the profile gives no key to verify another cluster's bundle with: set "
            "spec.storage.signing.publicKey (the PEM of cosign.pub)"
        )
    try:
        key = signing.load_public_key(storage.public_key.encode())
        verdict = signing.verify(store, record.bundle, key)
        if not verdict.ok:
            raise NotAdoptable(f"its bundle does not verify: {verdict.reason}")
        return ocibundle.BundleView(store, record.bundle)
    except signing.SigningError as e:
        raise NotAdoptable(f"the profile's publicKey: {e}") from None
    except StoreError as e:
        raise NotAdoptable(f"its bundle {record.bundle}: {e}") from None


def adopted(entry: Published, revision: str, now: str) -> ArtifactRecord:
    """The entry's record as this profile's status serves it: its own model and revision, and
    where it came from."""
    h = entry.holder
    return replace(
        entry.record,
        gpu_model=entry.gpu_model,
        revision=revision,
        job="",
        source_cluster=h.cluster,
        source_profile=f"{h.namespace}/{h.profile}",
        adopted_at=now,
    )


def entry_for(record: ArtifactRecord, identity: str, holder: Holder, now: str) -> Published:
    """What to publish of a profile's own served artifact."""
    return Published(identity, record.gpu_model, record, holder, now)


def _digest(reference: str) -> str | None:
    try:
        return images.parse(reference).digest
    except ValueError:
        return None
