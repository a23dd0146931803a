"""The capture step of a profile's reconcile (leader only): loop.plan on what the cache holds,
then the retune sets it froze made (immutable ConfigMaps, before the status that names them,
so a revision never points at a set that does not exist). A set that cannot be made leaves
the model as it was, with why in status.capture and an Event.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.capture import loop
from tunefleet.capture.keys import ArtifactKeys
from tunefleet.capture.retune_sets import RetuneSet
from tunefleet.capture.retune_sets_cache import CaptureCache
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.contracts.retune import Retunes

log = logging.getLogger(__name__)


@dataclass
class CaptureSource:
    """What the reconciler reads captures from (every replica keeps it current)."""

    cache: CaptureCache
    keys: ArtifactKeys


@dataclass
class Outcome:
    """What the reconcile takes from the capture step."""

    revisions: dict[str, str] = field(default_factory=dict)
    captured: dict[str, str] = field(default_factory=dict)  # model -> its retune set's name
    entries: list[dict[str, Any]] | None = None
    coverage: str = ""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    retunes: list[str] = field(default_factory=list)  # reasons of the retunes frozen now


def revisions_only(spec: TuningProfileSpec, base: str, status: dict[str, Any]) -> Outcome:
    """Without a capture source (or for a profile not acted on): the revisions status holds."""
    out = Outcome(revisions=loop.revisions(base, status, spec.gpu.models))
    for entry in status.get("capture") or []:
        retune = loop.Retune.from_status(entry.get("retune"))
        model = str(entry.get("gpuModel") or "")
        if retune is not None and out.revisions.get(model) == retune.revision:
            out.captured[model] = retune.config_map
    return out


@dataclass
class Planned:
    """What the capture step decided, before the retune sets it froze are made
    (reconciler/apply.py makes them, and takes back one that cannot be: `revert`)."""

    plan: loop.Plan
    previous: dict[str, dict[str, Any]]  # status.capture's entries, by model
    base: str  # the spec's revision
    where: str  # namespace/name, for the log
    uid: str  # the profile's

    def revert(self, model: str, why: str) -> None:
        self.plan.revert(model, self.previous.get(model), self.base, why)


def planned(
    source: CaptureSource,
    spec: TuningProfileSpec,
    profile: dict[str, Any],
    *,
    default_endpoint: str = "",
    now: float | None = None,
    decide: bool = True,
) -> Planned:
    """The capture loop's plan (loop.plan): what the stores say, against the GEMMs each served
    artifact has (read once per artifact, source.keys). Writes nothing. decide=False:
    status.capture's figures only (after a new artifact), no retune frozen. default_endpoint:
    the S3 endpoint of a spec.storage that names none (the operator's)."""
    meta, status = profile["metadata"], profile.get("status") or {}
    base = naming.revision(spec)
    endpoint = spec.storage.endpoint or default_endpoint
    region = spec.storage.region or ""
    ns, uid = meta["namespace"], meta["uid"]

    def keys_of(record: ArtifactRecord) -> frozenset[str] | None:
        return source.keys.get(record, ns, endpoint, region)

    plan = loop.plan(
        spec.capture,
        loop.Subject(ns, meta["name"], uid, base),
        spec.gpu.models,
        status,
        loop.Seen(source.cache.stores(uid), source.cache.retunes(uid), keys_of),
        loop.Moment(time.time() if now is None else now, Retunes.read(profile), decide),
    )
    return Planned(plan, loop.previous_entries(status), base, f"{ns}/{meta['name']}", uid)


def outcome(p: Planned, made: list[RetuneSet]) -> Outcome:
    """What the reconcile takes from the plan once the retune sets `made` are made."""
    plan = p.plan
    out = Outcome(
        revisions=plan.revisions,
        entries=plan.entries,
        coverage=plan.coverage,
        events=plan.events,
    )
    for entry in plan.entries:
        retune = loop.Retune.from_status(entry.get("retune"))
        model = str(entry.get("gpuModel") or "")
        if retune is not None and plan.revisions.get(model) == retune.revision:
            out.captured[model] = retune.config_map
    out.retunes = [
        str((e.get("retune") or {}).get("reason") or "")
        for e in plan.entries
        if any(f.model == e.get("gpuModel") for f in made)
    ]
    return out


def stale_sets(source: CaptureSource, p: Planned) -> list[RetuneSet]:
    """Retune sets no status entry names: their Jobs were superseded (a later set, a spec
    change), so nothing mounts them (reconciler/apply.py removes them)."""
    kept = {str((e.get("retune") or {}).get("configMap") or "") for e in p.plan.entries}
    return [old for old in source.cache.retunes(p.uid) if old.name not in kept and old.uid]
