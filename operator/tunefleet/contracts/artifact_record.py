"""The artifact record: what a tuning pod's publish (or the merge Job) tells the operator, and
what the operator keeps of it in `status.artifacts[]`. Written and read here only.

The publish and merge steps end with the record as their termination message: one JSON line of
at most 4096 bytes (what the kubelet keeps), camelCase keys as in the CRD. The operator reads it
from the pod's status, adds what only the Job knows (its GPU model, revision and name, and the
tune step's imageID when publish could not wait for it), and writes `status.artifacts[]` with
`to_status`; the webhook and the plugin read that back with `from_status`. A field the CRD
declares for `status.artifacts[]` is a field of this record: tests/unit/test_contracts.py
round-trips every one.

A sharded Job's pods end with a ShardRecord instead: a share's counts for the merge Job.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from tuner_job import caches as cc
from tuner_job.gain import Gain
from tuner_job.manifest import DEFAULT_KIND, Manifest

MESSAGE_LIMIT = 4096  # bytes the kubelet keeps of a termination message
REASON_LIMIT = 200  # characters of the first skipped library entry's reason

# The counts of reuse, sharding and resume, by their status names.
_COUNTS = ("recorded", "reused", "resumed", "newlyTuned", "shards")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# status.artifacts[].delivery of an oci:// artifact whose volume image the operator verified:
# the webhook mounts it as an image volume (delivery.py decides, admission.py mounts).
IMAGE_VOLUME = "ImageVolume"
# status.artifacts[].promotion.verdict, the gate's word (promotion.py decides it): measured and
# passed, passed unmeasured, rejected (kept in history, never served), served by a pin.
PASSED = "Passed"
UNMEASURED = "Unmeasured"
REJECTED = "Rejected"
PINNED = "Pinned"
SERVABLE = frozenset({PASSED, UNMEASURED, PINNED})


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _text(value: Any, limit: int | None = None) -> str:
    text = value if isinstance(value, str) else ""
    return text[:limit] if limit is not None else text


def _torch_version(text: str) -> tuple[int, int] | None:
    m = re.match(r"^(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True)
class ArtifactRecord:
    uri: str
    sha256: str
    gemms: int | None = None
    tuned_at: str = ""
    tuning_seconds: float | None = None
    revision: str = ""
    manifest_sha256: str = ""
    identity: dict[str, str] = field(default_factory=dict)
    # (tuned, default): a kernel other than Default won, or Default did (or was alone).
    outcomes: tuple[int, int] | None = None
    image_reference: str = ""
    image_id: str = ""
    # recorded, reused, resumed, newlyTuned, shards: None for records from before them.
    counts: dict[str, int] = field(default_factory=dict)
    library_key: str = ""
    library_skipped: int = 0
    library_skipped_reason: str = ""
    # Known to the operator, not to the pod: set by `for_job`.
    gpu_model: str = ""
    job: str = ""
    # How model pods get it: the immutable ConfigMap the operator made of it (name and uid:
    # a same-named replacement has another uid), or "" and why not (`delivery`).
    config_map: str = ""
    config_map_uid: str = ""
    delivery: str = ""
    # What it carries beside (or, kind "caches", instead of) TunableOp results: each cache
    # packed (tuner_job/caches.py), and those the run produced nothing to serve for, with why.
    kind: str = DEFAULT_KIND
    caches: tuple[cc.Packed, ...] = ()
    caches_skipped: tuple[cc.Skipped, ...] = ()
    # oci:// stores: the bundle's manifest digest (sha256:...) and whether publish signed it.
    bundle: str = ""
    signed: bool = False
    volume: str = ""  # the volume image's digest (what an image volume mounts)
    # What it buys, measured in its tuning Job (tuner_job/gain.py); None: not measured.
    gain: Gain | None = None
    # Known to the operator: the gate's verdict (status.py, promotion.py) and why, and the pin
    # it is served under (contracts/pin.py), "" when none.
    verdict: str = ""
    verdict_message: str = ""
    pinned_reason: str = ""
    pinned_at: str = ""
    # Adopted (fleet/): tuned by another profile or cluster sharing the store, not by a Job of
    # this profile: that cluster's kube-system uid, the profile as "namespace/name", and when
    # this profile adopted it. "" for an artifact of its own.
    source_cluster: str = ""
    source_profile: str = ""
    adopted_at: str = ""
    # The status entry it was read from (from_status): written back as it was while the
    # record is the one read (a copy made with `replace` has none), so an entry an earlier
    # version wrote is not rewritten for nothing on every reconcile.
    read_from: dict[str, Any] | None = field(default=None, init=False, compare=False, repr=False)

    # --- the pod's side -------------------------------------------------------------------

    @classmethod
    def from_manifest(
        cls,
        m: Manifest,
        *,
        uri: str,
        manifest_sha256: str,
        bundle: str = "",
        signed: bool = False,
        volume: str = "",
    ) -> ArtifactRecord:
        """What publish and merge report of the artifact they stored. Counts default for a
        manifest from before them: nothing reused, everything tuned by one pod."""
        x = m.extra
        library = x.library
        reason = ""
        if library is not None:
            reason = library.skipped[0][1] if library.skipped else (library.error or "")
        if len(reason) > REASON_LIMIT:
            reason = reason[: REASON_LIMIT - 3] + "..."
        return cls(
            uri=uri,
            sha256=m.results_sha256,
            gemms=m.gemms,
            tuned_at=m.tuned_at,
            tuning_seconds=m.tuning_seconds,
            revision=m.revision,
            manifest_sha256=manifest_sha256,
            identity=dict(m.identity),
            outcomes=(m.outcomes.tuned, m.outcomes.default) if m.outcomes is not None else None,
            image_reference=m.image.reference if m.image is not None else "",
            image_id=m.image.id if m.image is not None else "",
            counts={
                "recorded": m.recorded,
                "reused": x.reused or 0,
                "resumed": x.resumed or 0,
                "newlyTuned": x.newly_tuned if x.newly_tuned is not None else m.gemms,
                "shards": x.shards or 1,
            },
            library_key=x.library_key or "",
            library_skipped=library.skipped_count if library is not None else 0,
            library_skipped_reason=reason,
            kind=m.kind,
            caches=m.caches,
            caches_skipped=tuple(
                cc.Skipped(s.kind, s.name, s.reason[:REASON_LIMIT]) for s in m.caches_skipped
            ),
            bundle=bundle,
            signed=signed and bool(bundle),
            volume=volume if bundle else "",
            gain=m.gain,
        )

    def to_message(self, limit: int = MESSAGE_LIMIT) -> str:
        """One JSON line of at most `limit` bytes; identity is trimmed (longest values first),
        then the skipped-entry reason."""
        doc = self._doc(with_job=False)
        doc.setdefault("librarySkipped", self.library_skipped)
        doc.setdefault("librarySkippedReason", self.library_skipped_reason)

        def encoded() -> bytes:
            return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")

        identity: dict[str, str] = doc["identity"]
        while len(encoded()) > limit and identity:
            del identity[max(identity, key=lambda k: (len(identity[k]), k))]
        if len(encoded()) > limit:
            doc["librarySkippedReason"] = doc["librarySkippedReason"][:40]
        if len(encoded()) > limit:
            raise ValueError(f"the artifact record is over {limit} bytes even without identity")
        return encoded().decode("utf-8")

    # --- the operator's side --------------------------------------------------------------

    @classmethod
    def from_message(cls, message: str | None) -> ArtifactRecord | None:
        """The record in a termination message (its last line), or None when it isn't one."""
        if not message:
            return None
        try:
            doc = json.loads(message.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None
        if not isinstance(doc, dict) or "shard" in doc:
            return None
        record = cls.from_status(doc)
        return replace(record) if record is not None else None  # not a status entry

    def for_job(self, *, gpu_model: str, revision: str, job: str, image_id: str) -> ArtifactRecord:
        """What the operator knows beside the pod: the Job's model, revision and name, and the
        tune step's imageID from the pod's status when publish could not wait for it."""
        return replace(
            self,
            gpu_model=gpu_model,
            revision=revision,
            job=job,
            image_id=self.image_id or image_id,
        )

    def to_status(self) -> dict[str, Any]:
        """The `status.artifacts[]` (and `history[]`) entry: the one it was read from while
        it is the record read, else as this version writes it."""
        if self.read_from is not None:
            return copy.deepcopy(self.read_from)
        return self._doc(with_job=True)

    @classmethod
    def from_status(cls, doc: dict[str, Any]) -> ArtifactRecord | None:
        """An entry of `status.artifacts[]`/`history[]` (or a message's JSON); None without its
        uri and sha256. Values of the wrong type are dropped, never trusted."""
        if not isinstance(doc.get("uri"), str) or not isinstance(doc.get("sha256"), str):
            return None
        outcomes = doc.get("outcomes")
        tuned = _int(outcomes.get("tuned")) if isinstance(outcomes, dict) else None
        default = _int(outcomes.get("default")) if isinstance(outcomes, dict) else None
        image = doc.get("image") if isinstance(doc.get("image"), dict) else {}
        identity = doc.get("identity") if isinstance(doc.get("identity"), dict) else {}
        skipped = _int(doc.get("librarySkipped")) or 0
        cm: dict[str, Any] = doc["configMap"] if isinstance(doc.get("configMap"), dict) else {}
        record = cls(
            uri=str(doc["uri"]),
            sha256=str(doc["sha256"]),
            gemms=_int(doc.get("gemms")),
            tuned_at=_text(doc.get("tunedAt")),
            tuning_seconds=_number(doc.get("tuningSeconds")),
            revision=_text(doc.get("revision")),
            manifest_sha256=_text(doc.get("manifestSha256")),
            identity={str(k): str(v) for k, v in (identity or {}).items()},
            outcomes=(tuned, default) if tuned is not None and default is not None else None,
            image_reference=_text((image or {}).get("reference")),
            image_id=_text((image or {}).get("id")),
            counts={k: v for k in _COUNTS if (v := _int(doc.get(k))) is not None},
            library_key=_text(doc.get("libraryKey")),
            library_skipped=max(skipped, 0),
            library_skipped_reason=_text(doc.get("librarySkippedReason"), 300) if skipped else "",
            gpu_model=_text(doc.get("gpuModel")),
            job=_text(doc.get("job")),
            config_map=_text(cm.get("name")),
            config_map_uid=_text(cm.get("uid")),
            delivery=_text(doc.get("delivery"), 300),
            kind=_text(doc.get("kind")) or DEFAULT_KIND,
            caches=_caches(doc),
            caches_skipped=_skipped(doc),
            **_bundle(doc),
            **_promotion(doc),
            **_source(doc),
        )
        object.__setattr__(record, "read_from", doc)
        return record

    def _doc(self, *, with_job: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {"uri": self.uri, "sha256": self.sha256}
        if with_job:
            doc["gpuModel"] = self.gpu_model
            doc["job"] = self.job
            if self.config_map:
                doc["configMap"] = {"name": self.config_map, "uid": self.config_map_uid}
            if self.delivery:
                doc["delivery"] = self.delivery
        doc["revision"] = self.revision
        optional: dict[str, Any] = {
            "gemms": self.gemms,
            "tunedAt": self.tuned_at or None,
            "tuningSeconds": self.tuning_seconds,
            "manifestSha256": self.manifest_sha256 or None,
            "identity": dict(self.identity),
            "libraryKey": self.library_key or None,
        }
        doc.update({k: v for k, v in optional.items() if v is not None})
        doc.update(self.counts)
        if self.library_skipped > 0:
            doc["librarySkipped"] = self.library_skipped
            doc["librarySkippedReason"] = self.library_skipped_reason
        if self.outcomes is not None:
            doc["outcomes"] = {"tuned": self.outcomes[0], "default": self.outcomes[1]}
        if self.image_reference or self.image_id:
            doc["image"] = {"reference": self.image_reference, "id": self.image_id}
        if self.kind != DEFAULT_KIND:
            doc["kind"] = self.kind
        if self.caches:
            doc["caches"] = [
                {k: v for k, v in c.to_dict().items() if k != "payload"} for c in self.caches
            ]
        if self.caches_skipped:
            doc["cachesSkipped"] = [c.to_dict() for c in self.caches_skipped]
        if self.bundle:
            doc["bundle"] = {"digest": self.bundle, "signed": self.signed}
            if self.volume:
                doc["bundle"]["volume"] = self.volume
        if self.gain is not None:
            doc["gain"] = self.gain.to_dict()
        if with_job and self.verdict:
            doc["promotion"] = {"verdict": self.verdict, "message": self.verdict_message}
        if with_job and self.pinned_reason:
            doc["pinned"] = {"reason": self.pinned_reason, "at": self.pinned_at}
        if with_job and self.source_cluster:
            doc["source"] = {
                "cluster": self.source_cluster,
                "profile": self.source_profile,
                "adoptedAt": self.adopted_at,
            }
        return doc

    @property
    def adopted(self) -> bool:
        return bool(self.source_cluster)

    @property
    def results_only(self) -> bool:
        """TunableOp results and nothing else: what an artifact ConfigMap can be mounted as.
        Caches are unpacked by fetch into a pod-local, writable copy, from the store."""
        return self.kind == DEFAULT_KIND and not self.caches

    @property
    def kinds(self) -> list[str]:
        """What it carries, for status and kubectl: tunableop (unless caches alone), then each
        cache by name."""
        head = [DEFAULT_KIND] if self.kind == DEFAULT_KIND else []
        return head + [c.name for c in self.caches]

    # --- what serving and status derive from it -------------------------------------------

    @property
    def default_only(self) -> bool:
        """No GEMM where a kernel other than Default won (unknown without counts: False)."""
        return self.outcomes is not None and self.outcomes[0] == 0 and self.outcomes[1] > 0

    def no_gain_reason(self) -> str:
        """Why a Default-only artifact came out so, in one clause."""
        torch = self.identity.get("torch", "")
        version = _torch_version(torch)
        cuda = self.identity.get("cuda") and not self.identity.get("hip")
        if cuda and version is not None and version < (2, 14):
            return (
                f"torch {torch} on CUDA offers only Default; TunableOp chooses cuBLASLt kernels "
                "from torch 2.14"
            )
        return (
            "no kernel beat Default within the tuning limits (raise spec.tuning.maxDurationMs "
            "or maxIterations, or Default is simply the fastest here)"
        )


def _caches(doc: dict[str, Any]) -> tuple[cc.Packed, ...]:
    """status.artifacts[].caches, each entry checked as a manifest's is; none at all when one
    is malformed (a forged or hand-edited status never points fetch at a made-up archive)."""
    raw = doc.get("caches")
    if not isinstance(raw, list):
        return ()
    items = [
        {**c, "payload": f"{cc.PAYLOAD_PREFIX}{c.get('name')}{cc.PAYLOAD_SUFFIX}"}
        for c in raw
        if isinstance(c, dict)
    ]
    try:
        packed, _ = cc.manifest_entries({"caches": items})
    except cc.CacheError:
        return ()
    return tuple(packed)


def _bundle(doc: dict[str, Any]) -> dict[str, Any]:
    """status.artifacts[].bundle; a digest that is not sha256:<64 hex> is dropped (a forged
    status never points a pod at a reference of its choosing)."""
    raw = doc.get("bundle")
    if not isinstance(raw, dict):
        return {}
    digest = raw.get("digest")
    if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
        return {}
    volume = raw.get("volume")
    ok = isinstance(volume, str) and bool(_DIGEST_RE.match(volume))
    return {"bundle": digest, "signed": raw.get("signed") is True, "volume": volume if ok else ""}


def _promotion(doc: dict[str, Any]) -> dict[str, Any]:
    """gain, promotion and pinned as status has them; what is malformed is dropped. The verdict
    is shown, never trusted: status.py judges the figures again each time."""
    promotion = doc.get("promotion") if isinstance(doc.get("promotion"), dict) else {}
    pinned = doc.get("pinned") if isinstance(doc.get("pinned"), dict) else {}
    return {
        "gain": Gain.from_dict(doc.get("gain")),
        "verdict": verdict_of(doc),
        "verdict_message": _text((promotion or {}).get("message"), 1000),
        "pinned_reason": _text((pinned or {}).get("reason"), 300),
        "pinned_at": _text((pinned or {}).get("at"), 40),
    }


def _source(doc: dict[str, Any]) -> dict[str, Any]:
    """status.artifacts[].source: where an adopted artifact was tuned (shown, and kept so the
    next reconcile knows it adopted it); malformed: dropped."""
    raw = doc.get("source")
    if not isinstance(raw, dict) or not isinstance(raw.get("cluster"), str) or not raw["cluster"]:
        return {}
    return {
        "source_cluster": _text(raw.get("cluster"), 64),
        "source_profile": _text(raw.get("profile"), 320),
        "adopted_at": _text(raw.get("adoptedAt"), 40),
    }


def verdict_of(entry: Any) -> str:
    """The verdict a status.artifacts[]/history[] entry shows; "" for none, or for anything
    that is not one (a hand-edited or forged entry never breaks a reader)."""
    promotion = entry.get("promotion") if isinstance(entry, dict) else None
    verdict = promotion.get("verdict") if isinstance(promotion, dict) else None
    return verdict[:40] if isinstance(verdict, str) else ""


def _skipped(doc: dict[str, Any]) -> tuple[cc.Skipped, ...]:
    raw = doc.get("cachesSkipped")
    if not isinstance(raw, list):
        return ()
    return tuple(
        cc.Skipped(_text(s.get("kind")), _text(s.get("name")), _text(s.get("reason"), 300))
        for s in raw
        if isinstance(s, dict)
    )


def status_fields() -> set[str]:
    """The status names this record writes (for the CRD round-trip test)."""
    names = {
        "uri", "sha256", "gpuModel", "job", "revision", "gemms", "tunedAt", "tuningSeconds",
        "manifestSha256", "identity", "libraryKey", "librarySkipped", "librarySkippedReason",
        "outcomes", "image", "configMap", "delivery", "kind", "caches", "cachesSkipped",
        "bundle", "gain", "promotion", "pinned", "source", *_COUNTS,
    }  # fmt: skip
    assert len(fields(ArtifactRecord)) == 35  # a new field must be named above too
    return names


@dataclass(frozen=True)
class ShardRecord:
    """A share's termination message (parallelism > 1): where its output is, and its counts."""

    shard: int
    shards: int
    uri: str
    sha256: str
    gemms: int
    recorded: int
    reused: int = 0
    resumed: int = 0
    newly_tuned: int = 0

    def to_message(self) -> str:
        doc = {
            "shard": self.shard,
            "shards": self.shards,
            "gemms": self.gemms,
            "newlyTuned": self.newly_tuned,
            "reused": self.reused,
            "resumed": self.resumed,
            "recorded": self.recorded,
            "sha256": self.sha256,
            "uri": self.uri,
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_message(cls, message: str | None) -> ShardRecord | None:
        try:
            doc = json.loads((message or "").strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None
        if not isinstance(doc, dict):
            return None
        ints = {k: _int(doc.get(k)) for k in ("shard", "shards", "gemms", "recorded")}
        if any(v is None for v in ints.values()) or not isinstance(doc.get("uri"), str):
            return None
        return cls(
            shard=ints["shard"] or 0,
            shards=ints["shards"] or 0,
            uri=doc["uri"],
            sha256=_text(doc.get("sha256")),
            gemms=ints["gemms"] or 0,
            recorded=ints["recorded"] or 0,
            reused=_int(doc.get("reused")) or 0,
            resumed=_int(doc.get("resumed")) or 0,
            newly_tuned=_int(doc.get("newlyTuned")) or 0,
        )
