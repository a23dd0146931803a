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

from dataclasses import replace

from tunefleet import images
from tunefleet.api import TuningProfileSpec
from tunefleet.artifacts import fit
from tunefleet.artifacts.fetch import FetchError, Pinned, Signature, download_verified
from tunefleet.contracts.artifact import ArtifactRecord
from tunefleet.contracts.fleet import MAX_BYTES, Holder, Published
from tunefleet.storage.store import NotFoundError, Store, SwappableStore

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
    root = storage.uri.rstrip("/") + "/"
    if not record.uri.startswith(root):
        raise NotAdoptable(f"its artifact {record.uri} is outside this profile's store {root}")
    if not record.manifest_sha256:
        raise NotAdoptable(f"its artifact {record.uri} names no manifest SHA-256")
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


def publish(
    store: SwappableStore,
    key: str,
    entry: Published,
    spec: TuningProfileSpec,
    stand_in: tuple[str, ...],
) -> bool:
    """Publish an artifact for its identity: True if this is now the entry. An entry there
    first stays, unless it is not adoptable (forged, or its artifact tampered with or gone):
    then it is replaced, on the version read, so that one bad object cannot make every
    cluster tune the identity again forever."""
    if store.create(key, entry.to_bytes(), CONTENT_TYPE):
        return True
    try:
        there = store.read_tagged(key, MAX_BYTES)
    except NotFoundError:
        return store.create(key, entry.to_bytes(), CONTENT_TYPE)
    found = Published.from_bytes(there.data, entry.identity, entry.gpu_model)
    try:
        if found is None:
            raise NotAdoptable("not an entry")
        verify(found, spec, stand_in, store)
    except NotAdoptable:
        return store.replace_if(key, entry.to_bytes(), CONTENT_TYPE, there.tag)
    return False


def entry_for(record: ArtifactRecord, identity: str, holder: Holder, now: str) -> Published:
    """What to publish of a profile's own served artifact."""
    return Published(identity, record.gpu_model, record, holder, now)


def _digest(reference: str) -> str | None:
    try:
        return images.parse(reference).digest
    except ValueError:
        return None
