"""Published entries: the first complete artifact of an identity, for every profile and cluster
sharing the store.

A profile's own artifact is published once it serves it (the gate passed it); an entry found
for a profile with no artifact of its identity is adopted only after the checks its own
artifact gets and more: it lies in the profile's own store location; its SHA-256s and manifest
check out and its signature verifies with the profile's own spec.storage.signing.publicKey,
whatever the signing policy (download_verified: what fetch and delivery check; no key, no
adoption); it fits the profile's GPU model; its signed manifest says it was tuned in the image
the profile pins, by digest, for exactly the identity document the profile's spec makes
(naming.identity_document: what shapes tuning, promotion, parallelism); and, where the
profile's promotion asks for a gain, it was measured. Whatever fails is reported and not
adopted; the profile then tunes its own."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from tunefleet import images, naming
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
from tuner_job.gain import Gain
from tuner_job.manifest import Manifest

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
) -> Published:
    """The entry as this profile may serve it, its record's gain the signed manifest's; else
    NotAdoptable, saying which check failed. Another cluster's word is trusted for nothing:
    the artifact must be signed by this profile's key (whatever its signing policy: a
    `_fleet/` writer could publish an unsigned artifact of its own, or delete a .sig), and its
    signed manifest must say it was tuned for exactly what this profile would tune
    (naming.identity_document: a `_fleet/` writer could point the entry at another spec's
    signed artifact)."""
    record, model, storage = entry.record, entry.gpu_model, spec.storage
    if not _inside(record.uri, storage.uri):
        raise NotAdoptable(
            f"its artifact {record.uri} is outside this profile's store {storage.uri}"
        )
    if not record.manifest_sha256:
        raise NotAdoptable(f"its artifact {record.uri} names no manifest SHA-256")
    if not storage.public_key:
        raise NotAdoptable(NO_KEY)
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
            # Required, whatever spec.storage.signing's policy: Optional lets this profile's
            # own unsigned artifacts serve it, never another's.
            signature=Signature(required=True, key_pem=storage.public_key.encode()),
        )
    except (FetchError, ValueError) as e:
        raise NotAdoptable(f"its artifact {record.uri} does not check: {e}") from None
    if verified.parsed is None:
        raise NotAdoptable(f"its artifact {record.uri} has no manifest to read")
    gain = _bound(verified.parsed, spec, model)
    # The gate judges the signed manifest's figures, never the entry's copy of them.
    return replace(entry, record=replace(record, gain=gain))


def _bound(manifest: Manifest, spec: TuningProfileSpec, model: str) -> Gain | None:
    """What the verified (signed) manifest binds, against this profile: the image by digest,
    the identity document, and a measured gain where the profile's promotion asks for one.
    Its gain, once every check passed."""
    ran = manifest.image
    want = images.parse(spec.image).digest
    got = _digest(ran.reference) if ran is not None else None
    if want is None or got is None or got.lower() != want.lower():
        raise NotAdoptable(
            f"its artifact was tuned in {ran.reference if ran else 'an unnamed image'}, not in "
            f"this profile's image {spec.image}"
        )
    _same_identity(manifest.fleet_identity, naming.identity_document(spec, model))
    gain = manifest.gain
    if spec.promotion.min_gain > 0 and (gain is None or not gain.figures):
        why = f" ({gain.note})" if gain is not None and gain.note else ""
        raise NotAdoptable(
            f"its artifact was not measured{why}, and this profile's spec.promotion.minGain "
            f"{spec.promotion.min_gain:g} asks for a measured gain: an unmeasured artifact is "
            "never adopted where a gain is asked for"
        )
    return gain


NO_KEY = (
    "this profile gives no key to verify another cluster's artifact with, and fleet adoption "
    "requires a signature by it: set spec.storage.signing.publicKey (the PEM of cosign.pub)"
)


def _same_identity(theirs: dict[str, Any] | None, ours: dict[str, Any] | None) -> None:
    """NotAdoptable unless the artifact's signed identity document is this profile's, naming
    the first field that differs and both values."""
    if theirs is None:
        raise NotAdoptable(
            "its manifest names no identity (published by a tunefleet before identities were "
            "signed, a retune, or by hand), so what it was tuned for is unknown"
        )
    if ours is None:  # an image by tag has no identity: gather never reads an entry for it
        raise NotAdoptable("this profile's image is not pinned by digest")
    found = naming.identity_difference(ours, theirs)
    if found is not None:
        path, here, there = found
        raise NotAdoptable(
            f"its identity differs at {path}: {naming.shown(here)} here, "
            f"{naming.shown(there)} in the artifact"
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
