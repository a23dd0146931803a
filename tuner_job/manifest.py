"""manifest.json: what a results file is, where and how it was tuned (stdlib only).

Written by the tuner next to results.csv, uploaded by publish and checked by fetch, so the one
definition here is shared by both images. Runs on Python 3.10 (the user's image may have it).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .caches import CacheError, Packed, Skipped, manifest_entries
from .gain import Gain
from .library import Settings
from .results import Outcomes

SCHEMA = "tunefleet.io/manifest/v1"
# What the artifact holds (the operator's artifacts/kinds/ says what each kind is). Every
# manifest before the field was a TunableOp results file, so that kind is the default, read
# when the field is absent and never written: those manifests keep their bytes and SHA-256s.
DEFAULT_KIND = "tunableop"
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_RFC3339_UTC_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")


class ManifestError(ValueError):
    """A manifest that is not a tunefleet.io/manifest/v1 document."""


@dataclass(frozen=True)
class ImageRef:
    """The image the tune step ran in: the reference asked for, and the kubelet's imageID
    (``repo@sha256:...`` when the image has a registry digest, else ``sha256:...``; empty when
    it could not be learnt before publishing)."""

    reference: str
    id: str = ""

    @property
    def digest(self) -> str | None:
        """The sha256:... digest the imageID names, if any."""
        tail = self.id.rsplit("@", 1)[-1]
        return tail if tail.startswith("sha256:") else None

    def to_dict(self) -> dict[str, str]:
        return {"reference": self.reference, "id": self.id}


@dataclass(frozen=True)
class LibraryInfo:
    """What the GEMM library gave a run: entries merged, and entries skipped as unusable
    (the first MAX_SKIPPED listed, all counted)."""

    entries: int = 0
    skipped: tuple[tuple[str, str], ...] = ()  # (object, reason)
    skipped_count: int = 0
    error: str | None = None  # the library could not be used at all

    MAX_SKIPPED = 10

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "entries": self.entries,
            "skipped": [{"object": o, "reason": r} for o, r in self.skipped],
            "skippedCount": self.skipped_count,
        }
        if self.error is not None:
            doc["error"] = self.error
        return doc


@dataclass(frozen=True)
class ResumeInfo:
    """Whether a run resumed from its checkpoint: status resumed | none | ignored, and why."""

    status: str
    reason: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"status": self.status, "reason": self.reason}


@dataclass(frozen=True)
class ManifestExtra:
    """Fleet-wide reuse, sharding and resume (all optional: absent from older manifests).

    For one pod, recorded == reused + resumed + newlyTuned + (recorded - gemms): every recorded
    GEMM came from the library, from the checkpoint, from this run's tuning, or was left
    untuned (the budget ran out, or torch's offline tuner skipped it). A shard's manifest counts
    its share: reused + resumed + newlyTuned == gemms. tuningSeconds is GPU time in the tuning
    process (a merge: the sum over shards); wallSeconds the whole run (a merge: the longest
    shard).
    """

    reused: int | None = None
    resumed: int | None = None
    newly_tuned: int | None = None
    library_key: str | None = None
    shards: int | None = None
    shard: int | None = None  # set in a shard's own manifest only
    library: LibraryInfo | None = None
    resume: ResumeInfo | None = None
    wall_seconds: float | None = None
    # What the rows were tuned with (library.Settings.to_dict()): the library reuses an entry
    # only for runs that want the same or weaker settings.
    settings: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        for name, value in (
            ("reused", self.reused),
            ("resumed", self.resumed),
            ("newlyTuned", self.newly_tuned),
            ("libraryKey", self.library_key),
            ("shards", self.shards),
            ("shard", self.shard),
            ("wallSeconds", self.wall_seconds),
        ):
            if value is not None:
                doc[name] = value
        if self.library is not None:
            doc["library"] = self.library.to_dict()
        if self.resume is not None:
            doc["resume"] = self.resume.to_dict()
        if self.settings is not None:
            doc["settings"] = dict(self.settings)
        return doc


@dataclass(frozen=True)
class ArtifactId:
    """Whose artifact: the four names that travel together from the tuning configuration to
    the manifest, the store's keys and the profile's status."""

    namespace: str
    profile: str
    revision: str
    gpu_model: str


@dataclass(frozen=True)
class Manifest:
    namespace: str
    profile: str
    revision: str
    gpu_model: str
    results_sha256: str
    gemms: int
    recorded: int
    validators: dict[str, str]
    identity: dict[str, str]
    tuning_seconds: float
    tuned_at: str
    tool_version: str
    # How the GEMMs came out (tuned: a non-Default solution won; default: Default won or was the
    # only candidate); tuned + default == gemms. None for manifests written before the field.
    outcomes: Outcomes | None = None
    # Added by publish (the tune step cannot see its own image digest); None before that.
    image: ImageRef | None = None
    extra: ManifestExtra = ManifestExtra()
    kind: str = DEFAULT_KIND
    # Cache bundles packed beside the payload (tuner_job/caches.py), and those that came out
    # empty or failed, with why; both absent from manifests without caches.
    caches: tuple[Packed, ...] = ()
    caches_skipped: tuple[Skipped, ...] = ()
    # What the artifact buys, measured after tuning (tuner_job/gain.py); None when not measured.
    gain: Gain | None = None
    # What it was tuned for, as the operator's naming.identity_document says (written by
    # publish or merge from the tuning ConfigMap): in the manifest, so the artifact's signature
    # covers it and fleet adoption compares it with the adopter's own. Opaque here; None in
    # manifests from before it, of retunes, and of images by tag (they serve their own profile
    # as always; no fleet adopts them).
    fleet_identity: dict[str, Any] | None = None

    @property
    def artifact_id(self) -> ArtifactId:
        return ArtifactId(self.namespace, self.profile, self.revision, self.gpu_model)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schema": SCHEMA}
        if self.kind != DEFAULT_KIND:
            doc["kind"] = self.kind
        doc |= {
            "namespace": self.namespace,
            "profile": self.profile,
            "revision": self.revision,
            "gpuModel": self.gpu_model,
            "resultsSha256": self.results_sha256,
            "gemms": self.gemms,
            "recorded": self.recorded,
            "validators": dict(sorted(self.validators.items())),
            "identity": dict(sorted(self.identity.items())),
            "tuningSeconds": self.tuning_seconds,
            "tunedAt": self.tuned_at,
            "toolVersion": self.tool_version,
        }
        if self.outcomes is not None:
            doc["outcomes"] = self.outcomes.to_dict()
        if self.image is not None:
            doc["image"] = self.image.to_dict()
        doc.update(self.extra.to_dict())
        if self.caches:
            doc["caches"] = [c.to_dict() for c in self.caches]
        if self.caches_skipped:
            doc["cachesSkipped"] = [c.to_dict() for c in self.caches_skipped]
        if self.gain is not None:
            doc["gain"] = self.gain.to_dict()
        if self.fleet_identity is not None:
            doc["fleetIdentity"] = self.fleet_identity
        return doc

    def to_json(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=2) + "\n").encode("utf-8")


def rfc3339_utc(when: datetime | None = None) -> str:
    moment = (when or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _str(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or value == "":
        raise ManifestError(f"manifest field {key!r} must be a non-empty string, got {value!r}")
    return value


def _int(doc: dict[str, Any], key: str, where: str = "") -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ManifestError(
            f"manifest field {where + key!r} must be a non-negative integer, got {value!r}"
        )
    return value


def _str_map(doc: dict[str, Any], key: str) -> dict[str, str]:
    value = doc.get(key)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ManifestError(f"manifest field {key!r} must map strings to strings")
    return dict(value)


def _outcomes(doc: dict[str, Any], gemms: int) -> Outcomes | None:
    value = doc.get("outcomes")
    if value is None and "outcomes" not in doc:
        return None  # a manifest from before the field
    if not isinstance(value, dict) or set(value) != {"tuned", "default"}:
        raise ManifestError(
            f'manifest field \'outcomes\' must be {{"tuned": N, "default": N}}, got {value!r}'
        )
    outcomes = Outcomes(
        tuned=_int(value, "tuned", "outcomes."), default=_int(value, "default", "outcomes.")
    )
    if outcomes.gemms != gemms:
        raise ManifestError(
            f"manifest outcomes add up to {outcomes.gemms} GEMMs "
            f"(tuned {outcomes.tuned} + default {outcomes.default}), but gemms is {gemms}"
        )
    return outcomes


def _image(doc: dict[str, Any]) -> ImageRef | None:
    value = doc.get("image")
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("reference"), str)
        or not isinstance(value.get("id", ""), str)
    ):
        raise ManifestError(
            f'manifest field \'image\' must be {{"reference": "...", "id": "..."}}, got {value!r}'
        )
    return ImageRef(reference=value["reference"], id=value.get("id", ""))


def _opt_int(doc: dict[str, Any], key: str, minimum: int = 0) -> int | None:
    if key not in doc:
        return None
    value = doc[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ManifestError(
            f"manifest field {key!r} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def _library(doc: dict[str, Any]) -> LibraryInfo | None:
    value = doc.get("library")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ManifestError(f"manifest field 'library' must be an object, got {value!r}")
    entries = _opt_int(value, "entries") or 0
    skipped_doc = value.get("skipped", [])
    if not isinstance(skipped_doc, list) or not all(
        isinstance(s, dict)
        and isinstance(s.get("object"), str)
        and isinstance(s.get("reason"), str)
        for s in skipped_doc
    ):
        raise ManifestError('manifest field \'library.skipped\' must be [{"object", "reason"}]')
    skipped = tuple((s["object"], s["reason"]) for s in skipped_doc)
    count = _opt_int(value, "skippedCount")
    error = value.get("error")
    if error is not None and not isinstance(error, str):
        raise ManifestError(f"manifest field 'library.error' must be a string, got {error!r}")
    return LibraryInfo(entries, skipped, len(skipped) if count is None else count, error)


def _resume(doc: dict[str, Any]) -> ResumeInfo | None:
    value = doc.get("resume")
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or value.get("status") not in ("resumed", "none", "ignored")
        or not isinstance(value.get("reason", ""), str)
    ):
        raise ManifestError(
            'manifest field \'resume\' must be {"status": "resumed"|"none"|"ignored", '
            f'"reason": "..."}}, got {value!r}'
        )
    return ResumeInfo(value["status"], value.get("reason", ""))


def _extra(doc: dict[str, Any]) -> ManifestExtra:
    key = doc.get("libraryKey")
    if key is not None and not (isinstance(key, str) and _SHA_RE.match(key)):
        raise ManifestError(f"manifest libraryKey {key!r} is not 64 lowercase hex digits")
    wall = doc.get("wallSeconds")
    if wall is not None and (
        not isinstance(wall, int | float)
        or isinstance(wall, bool)
        or not math.isfinite(wall)
        or wall < 0
    ):
        raise ManifestError(f"manifest wallSeconds must be a non-negative number, got {wall!r}")
    settings = doc.get("settings")
    if settings is not None:
        try:
            settings = Settings.from_dict(settings).to_dict()
        except ValueError as exc:
            raise ManifestError(f"manifest {exc}") from None
    return ManifestExtra(
        settings=settings,
        reused=_opt_int(doc, "reused"),
        resumed=_opt_int(doc, "resumed"),
        newly_tuned=_opt_int(doc, "newlyTuned"),
        library_key=key,
        shards=_opt_int(doc, "shards", 1),
        shard=_opt_int(doc, "shard"),
        library=_library(doc),
        resume=_resume(doc),
        wall_seconds=float(wall) if wall is not None else None,
    )


def from_dict(doc: Any) -> Manifest:
    if not isinstance(doc, dict):
        raise ManifestError("manifest is not a JSON object")
    if doc.get("schema") != SCHEMA:
        raise ManifestError(f"manifest schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    sha = _str(doc, "resultsSha256")
    if not _SHA_RE.match(sha):
        raise ManifestError(f"manifest resultsSha256 {sha!r} is not 64 lowercase hex digits")
    seconds = doc.get("tuningSeconds")
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise ManifestError(
            f"manifest tuningSeconds must be a non-negative number, got {seconds!r}"
        )
    tuned_at = _str(doc, "tunedAt")
    if not _RFC3339_UTC_RE.match(tuned_at):
        raise ManifestError(f"manifest tunedAt {tuned_at!r} is not RFC 3339 UTC (…Z)")
    gemms = _int(doc, "gemms")
    recorded = _int(doc, "recorded")
    validators = _str_map(doc, "validators")
    kind = _str(doc, "kind") if "kind" in doc else DEFAULT_KIND
    # TunableOp loads no file without PT_VERSION; a caches-only artifact has no validators.
    if kind == DEFAULT_KIND and "PT_VERSION" not in validators:
        raise ManifestError("manifest validators lack PT_VERSION")
    try:
        caches, skipped = manifest_entries(doc)
    except CacheError as exc:
        raise ManifestError(str(exc)) from None
    return Manifest(
        namespace=_str(doc, "namespace"),
        profile=_str(doc, "profile"),
        revision=_str(doc, "revision"),
        gpu_model=_str(doc, "gpuModel"),
        results_sha256=sha,
        gemms=gemms,
        recorded=recorded,
        validators=validators,
        identity=_str_map(doc, "identity"),
        tuning_seconds=float(seconds),
        tuned_at=tuned_at,
        tool_version=_str(doc, "toolVersion"),
        outcomes=_outcomes(doc, gemms),
        image=_image(doc),
        extra=_extra(doc),
        kind=kind,
        caches=tuple(caches),
        caches_skipped=tuple(skipped),
        gain=Gain.from_dict(doc.get("gain")),
        fleet_identity=_fleet_identity(doc),
    )


def _fleet_identity(doc: dict[str, Any]) -> dict[str, Any] | None:
    value = doc.get("fleetIdentity")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ManifestError(f"manifest field 'fleetIdentity' must be an object, got {value!r:.80}")
    return value


def loads(data: bytes | str) -> Manifest:
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"manifest is not JSON: {exc}") from None
    return from_dict(doc)
