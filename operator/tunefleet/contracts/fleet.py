"""The fleet's objects in a profile's store, shared by every cluster that points at it: who
tunes an identity now (the claim), and what was tuned for it (the published entry). Written
and read here only; fleet/ decides what to do with them.

Keys, beside the profiles' own (``<prefix>`` is the storage URI's prefix; the identity is
naming.fleet_identity, 64 hex):

* ``<prefix>/_fleet/<gpu-model>/<identity>/claim.json``: replaced in place, only with
  If-Match on the version read (or If-None-Match when there is none), so two writers never
  both win;
* ``<prefix>/_fleet/<gpu-model>/<identity>/artifact.json``: written once (If-None-Match),
  the first complete artifact of the identity, replaced (If-Match) only when it is not an
  adoptable entry;
* ``<prefix>/_fleet/.probe/<random>``: the probe of the store's conditional writes
  (fleet/probe.py), written and deleted within one reconcile;
* ``<prefix>/_fleet/refs/<cluster>/<namespace>/<profile>.json``: what one profile of one
  cluster references (`Refs`), replaced plainly by that cluster's operator (one writer per
  key) and renewed before it expires; every cluster's tunefleet-gc keeps what an unexpired
  one names, and deletes it once expired.

The first two are small JSON documents. Anything under their keys that does not parse as what
it should be (over MAX_BYTES, not JSON, another schema or identity) is not trusted: a claim
that is not one counts as expired (it is taken over, never obeyed), an entry that is not one is
not adopted and is replaced by the next publisher; either with the same conditional write as a
valid one gets, and a log line saying what was there (`odd`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.storage.store import Location

FLEET_DIR = "_fleet"
CLAIM = "claim.json"
PUBLISHED = "artifact.json"
PROBE_DIR = ".probe"
REFS_DIR = "refs"
REFS_SUFFIX = ".json"
MAX_BYTES = 16 << 10  # what either object may be: a claim is ~300 bytes, an entry ~5 KB
# The longest a claim may run ahead (the chart's fleet.claimSeconds is at most this): one that
# expires later is no cluster's, and is taken over (a swap) or not obeyed (a bid).
MAX_CLAIM_SECONDS = 86400.0
# A bid's settle window (fleet/bids.py), at most what the chart's fleet.settleSeconds allows; a
# bid of a release before bids carried it (no "settle") stood for the default window. A
# claim.json (an atomic swap, no window) carries none.
DEFAULT_SETTLE_SECONDS = 5.0
MAX_SETTLE_SECONDS = 60.0
# A holder posts its bid again at least this often (and at half its claim's life, when that is
# sooner), stamped with when (`renewed`): a reader obeys a bid only while it was renewed within
# fleet/bids.py's liveness bound, so a note pushed once, before anyone looked, with a day's
# expiry (a ghost no cluster renews) stops being obeyed within minutes, not at its expiry.
RENEW_EVERY_SECONDS = 300.0
# Unchanged by the optional "settle" field: a reader of the release before ignores it.
VERSION = 1
_IDENTITY_RE = re.compile(r"^[0-9a-f]{64}$")
_UID_RE = re.compile(r"^[0-9a-zA-Z-]{1,64}$")
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
# A refs doc's life unless renewed: its owner renews it when under half is left (at least every
# 36 h, each profile being reconciled every 10 minutes at the latest), so a cluster whose
# operator is gone for longer than that stops keeping other clusters' gc from its artifacts.
REFS_TTL_SECONDS = 3 * 86400.0
# A profile references its served artifacts (one per GPU model, at most 16) and its history
# (at most 20): twice that in both readings is far more than one needs; a doc that names more,
# or is larger, is no profile's and is not trusted.
MAX_REFS = 128
MAX_REF_URI = 1024
MAX_REFS_BYTES = 160 << 10

# (namespace, profile, GPU model, sha256) of an artifact's folder in a store.
ArtifactId = tuple[str, str, str, str]


def check_identity(identity: str) -> str:
    if not _IDENTITY_RE.match(identity):
        raise ValueError(f"{identity!r} is not a fleet identity (64 hex characters)")
    return identity


def renew_every(ttl: float) -> float:
    """How often a holder writes its claim or bid again: at half its life, and at least every
    RENEW_EVERY_SECONDS (a bid's readers count on that to tell a live holder)."""
    return min(ttl / 2, RENEW_EVERY_SECONDS)


def claim_key(location: Location, gpu_model: str, identity: str) -> str:
    return location.key(FLEET_DIR, gpu_model, check_identity(identity), CLAIM)


def published_key(location: Location, gpu_model: str, identity: str) -> str:
    return location.key(FLEET_DIR, gpu_model, check_identity(identity), PUBLISHED)


def probe_key(location: Location, token: str) -> str:
    """The probe object's key (fleet/probe.py); `token` is random, 32 hex."""
    if not re.fullmatch(r"[0-9a-f]{32}", token):
        raise ValueError(f"{token!r} is not a probe token (32 hex characters)")
    return location.key(FLEET_DIR, PROBE_DIR, token)


def refs_dir(location: Location) -> str:
    """Where every cluster's refs docs are (what tunefleet-gc lists)."""
    return location.key(FLEET_DIR, REFS_DIR)


def refs_key(location: Location, cluster: str, namespace: str, profile: str) -> str:
    """One profile's refs doc: under its cluster, so each key has one writer."""
    if not (_UID_RE.match(cluster) and _NAME_RE.match(namespace) and _NAME_RE.match(profile)):
        raise ValueError(f"no refs doc for {cluster}/{namespace}/{profile}: not valid names")
    return location.key(FLEET_DIR, REFS_DIR, cluster, namespace, profile + REFS_SUFFIX)


def artifact_id(uri: str) -> ArtifactId | None:
    """The artifact a URI names, by its last four segments (`<ns>/<profile>/<model>/<sha256>`),
    wherever the store's prefix ends; None when it names none."""
    tail = uri.rstrip("/").split("/")[-4:]
    if len(tail) == 4 and _SHA_RE.match(tail[3]):
        return (tail[0], tail[1], tail[2], tail[3])
    return None


def status_records(status: Any) -> list[ArtifactRecord]:
    """The artifacts a profile's status names: served (status.artifacts) and kept
    (status.history), what a pin may roll back to; entries that do not parse are skipped."""
    out: list[ArtifactRecord] = []
    if not isinstance(status, dict):
        return out
    for where in ("artifacts", "history"):
        for entry in status.get(where) or []:
            record = ArtifactRecord.from_status(entry) if isinstance(entry, dict) else None
            if record is not None:
                out.append(record)
    return out


def referenced(records: Iterable[ArtifactRecord], namespace: str, name: str) -> set[ArtifactId]:
    """What a profile's status entries reference, in both readings of each: its URI's last
    four segments, and the profile's own names with the entry's model and SHA-256. Either one
    keeps the artifact: tunefleet-gc keeps exactly these for a profile of its own cluster, and
    a refs doc names exactly these for other clusters' gc."""
    ids: set[ArtifactId] = set()
    for record in records:
        found = artifact_id(record.uri)
        if found is not None:
            ids.add(found)
        if record.gpu_model and _SHA_RE.match(record.sha256):
            ids.add((namespace, name, record.gpu_model, record.sha256))
    return ids


@dataclass(frozen=True)
class Holder:
    """Who tunes: the cluster (its kube-system namespace's uid, which no two clusters share and
    which outlives the operator) and the profile (a profile made again under its name is
    another holder: its uid)."""

    cluster: str
    namespace: str
    profile: str
    uid: str

    def describe(self) -> str:
        return f"TuningProfile {self.namespace}/{self.profile} in cluster {self.cluster}"

    def to_dict(self) -> dict[str, str]:
        return {
            "cluster": self.cluster,
            "namespace": self.namespace,
            "profile": self.profile,
            "uid": self.uid,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> Holder | None:
        if not isinstance(doc, dict):
            return None
        cluster, uid = doc.get("cluster"), doc.get("uid")
        namespace, profile = doc.get("namespace"), doc.get("profile")
        texts = (cluster, namespace, profile, uid)
        if not all(isinstance(v, str) for v in texts):
            return None
        assert isinstance(cluster, str) and isinstance(uid, str)
        assert isinstance(namespace, str) and isinstance(profile, str)
        if not (_UID_RE.match(cluster) and _UID_RE.match(uid)):
            return None
        if not (_NAME_RE.match(namespace) and _NAME_RE.match(profile)):
            return None
        return cls(cluster, namespace, profile, uid)


@dataclass(frozen=True)
class Claim:
    """The right to tune an identity until `expires` (seconds since the epoch, the holder's
    clock): renewed while its Job runs, released (expired at once) when the Job ends. A bid on
    a board also carries the settle window its cluster stands it for (`settle`; None: a claim
    swapped in place, which has none), and when it was last posted (`renewed`, the holder's
    clock; None: a claim.json, or a bid of an earlier release)."""

    identity: str
    holder: Holder
    taken: float
    expires: float
    settle: float | None = None
    renewed: float | None = None

    @property
    def window(self) -> float:
        """The settle window the bid stood for (a bid of an earlier release: the default)."""
        return DEFAULT_SETTLE_SECONDS if self.settle is None else self.settle

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "version": VERSION,
            "identity": self.identity,
            "holder": self.holder.to_dict(),
            "taken": round(self.taken, 3),
            "expires": round(self.expires, 3),
        }
        if self.settle is not None:
            doc["settle"] = round(self.settle, 3)
        if self.renewed is not None:
            doc["renewed"] = round(self.renewed, 3)
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, identity: str) -> Claim | None:
        """The claim, or None when the bytes are not a claim on `identity`."""
        doc = _json(data)
        if doc is None or doc.get("identity") != identity or doc.get("version") != VERSION:
            return None
        holder = Holder.from_dict(doc.get("holder"))
        taken, expires = _seconds(doc.get("taken")), _seconds(doc.get("expires"))
        if holder is None or taken is None or expires is None:
            return None
        settle, renewed = doc.get("settle"), doc.get("renewed")
        when = None if renewed is None else _seconds(renewed)
        # Posted again no earlier than it was taken and no later than it expires: anything
        # else is no bid a holder wrote.
        if renewed is not None and (when is None or not taken <= when <= expires):
            return None
        if settle is None:
            return cls(identity, holder, taken, expires, None, when)
        # A window no cluster may set is not a bid: one of 0 would hold at once, ahead of
        # bids still in flight.
        within = _seconds(settle)
        if within is None or not 0 < within <= MAX_SETTLE_SECONDS:
            return None
        return cls(identity, holder, taken, expires, within, when)


@dataclass(frozen=True)
class Published:
    """The first complete artifact of an identity: the record its tuning cluster served (its
    URI, SHA-256s, counts and measured gain), who tuned it, and when it was published."""

    identity: str
    gpu_model: str
    record: ArtifactRecord
    holder: Holder
    published_at: str

    def to_bytes(self) -> bytes:
        doc = {
            "version": VERSION,
            "identity": self.identity,
            "gpuModel": self.gpu_model,
            "record": json.loads(self.record.to_message()),
            "holder": self.holder.to_dict(),
            "publishedAt": self.published_at,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, identity: str, gpu_model: str) -> Published | None:
        """The entry, or None when the bytes are not one for `identity` on `gpu_model`."""
        doc = _json(data)
        if doc is None or doc.get("version") != VERSION:
            return None
        if doc.get("identity") != identity or doc.get("gpuModel") != gpu_model:
            return None
        raw = doc.get("record")
        record = ArtifactRecord.from_status(raw) if isinstance(raw, dict) else None
        holder = Holder.from_dict(doc.get("holder"))
        at = doc.get("publishedAt")
        if record is None or holder is None or not isinstance(at, str) or len(at) > 40:
            return None
        # Only what the tuning pod reported travels: nothing its cluster's status added.
        bare = ArtifactRecord.from_message(record.to_message())
        if bare is None:
            return None
        return cls(identity, gpu_model, bare, holder, at)


@dataclass(frozen=True)
class Refs:
    """What one profile of one cluster references (`referenced`), as artifact URIs of the
    store, until `expires` (seconds since the epoch, its cluster's clock): tunefleet-gc, in any
    cluster on the store, deletes none of them before then."""

    cluster: str
    namespace: str
    profile: str
    uid: str
    artifacts: tuple[str, ...]  # sorted
    expires: float

    def key(self, location: Location) -> str:
        return refs_key(location, self.cluster, self.namespace, self.profile)

    def ids(self) -> set[ArtifactId]:
        return {i for i in map(artifact_id, self.artifacts) if i is not None}

    def to_bytes(self) -> bytes:
        doc = {
            "version": VERSION,
            "cluster": self.cluster,
            "namespace": self.namespace,
            "profile": self.profile,
            "uid": self.uid,
            "artifacts": list(self.artifacts),
            "expires": round(self.expires, 3),
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Refs | None:
        """The doc, or None when the bytes are not one (too large, not JSON, another schema or
        version, names that are not valid, more artifacts than a profile has)."""
        if len(data) > MAX_REFS_BYTES:
            return None
        doc = _json(data)
        if doc is None or doc.get("version") != VERSION:
            return None
        holder = Holder.from_dict(doc)
        expires = _seconds(doc.get("expires"))
        uris = doc.get("artifacts")
        if holder is None or expires is None or not isinstance(uris, list):
            return None
        if len(uris) > MAX_REFS or not all(
            isinstance(u, str) and 0 < len(u) <= MAX_REF_URI for u in uris
        ):
            return None
        return cls(
            holder.cluster, holder.namespace, holder.profile, holder.uid,
            tuple(sorted(set(uris))), expires,
        )  # fmt: skip


def odd(data: bytes, oversize: int, what: str) -> str:
    """In words, for a log line, what sits at a key where `what` (a claim, an entry) should
    be and does not parse as one; `oversize` is its size when it was too large to download."""
    if oversize:
        return f"an object of {oversize} bytes, more than the {MAX_BYTES} that {what} may be"
    if _json(data) is None:
        return f"{len(data)} bytes that are not JSON (not {what})"
    return f"a JSON object of {len(data)} bytes that is not {what}"


def _json(data: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _seconds(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e11:
        return float(value)
    return None
