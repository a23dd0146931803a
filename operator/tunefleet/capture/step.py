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

from tunefleet import kube, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.capture import loop
from tunefleet.capture.cache import CaptureCache
from tunefleet.capture.keys import ArtifactKeys
from tunefleet.capture.store import RetuneSet, build_retune_config_map
from tunefleet.contracts.artifact import ArtifactRecord
from tunefleet.contracts.retune import RetuneRequest
from tunefleet.kube import Kube

log = logging.getLogger(__name__)


@dataclass
class CaptureSource:
    """What the reconciler reads captures from (every replica keeps it current)."""

    cache: CaptureCache
    keys: ArtifactKeys
    client: Kube  # the process's client: retune sets are made and removed through it


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


def run(
    source: CaptureSource | None,
    spec: TuningProfileSpec,
    profile: dict[str, Any],
    *,
    default_endpoint: str = "",
    now: float | None = None,
    decide: bool = True,
) -> Outcome:
    """decide=False: status.capture's figures only (after a new artifact), no retune made.
    default_endpoint: the S3 endpoint of a spec.storage that names none (the operator's)."""
    meta, status = profile["metadata"], profile.get("status") or {}
    base = naming.revision(spec)
    endpoint = spec.storage.endpoint or default_endpoint
    region = spec.storage.region or ""
    if source is None:
        return revisions_only(spec, base, status)
    ns, uid = meta["namespace"], meta["uid"]

    def keys_of(record: ArtifactRecord) -> frozenset[str] | None:
        return source.keys.get(record, ns, endpoint, region)

    plan = loop.plan(
        spec.capture,
        loop.Subject(ns, meta["name"], uid, base),
        spec.gpu.models,
        status,
        loop.Seen(source.cache.stores(uid), source.cache.retunes(uid), keys_of),
        loop.Moment(time.time() if now is None else now, RetuneRequest.read(profile), decide),
    )
    where = f"{ns}/{meta['name']}"
    made = _freeze(source.client, plan, loop.previous_entries(status), base, where)
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
    if decide:
        _remove_old_sets(source, ns, uid, plan.entries)
    return out


def _freeze(
    client: Kube, plan: loop.Plan, previous: dict[str, dict[str, Any]], base: str, where: str
) -> list[RetuneSet]:
    """Make the retune sets the plan froze (each a ConfigMap of its own); one that cannot be
    made is taken back from the plan, with why, and retried at the next reconcile."""
    made = []
    for frozen in list(plan.freezes):
        try:
            client.create_owned(build_retune_config_map(frozen))
            made.append(frozen)
        except (kube.NotOurs, kube.Temporary, kube.Permanent) as e:
            log.info(f"TuningProfile {where}: retune of {frozen.model}: {e}")
            plan.revert(frozen.model, previous.get(frozen.model), base, str(e))
    return made


def _remove_old_sets(
    source: CaptureSource, namespace: str, uid: str, entries: list[dict[str, Any]]
) -> None:
    """Retune sets no status entry names: their Jobs were superseded (a later set, a spec
    change), so nothing mounts them. Each is up to 900 KiB: they do not pile up in etcd."""
    kept = {str((e.get("retune") or {}).get("configMap") or "") for e in entries}
    for old in source.cache.retunes(uid):
        if old.name in kept or not old.uid:
            continue
        try:
            source.client.delete_owned("ConfigMap", namespace, old.name, old.uid)
        except (kube.Temporary, kube.Permanent) as e:
            log.info(f"retune set {namespace}/{old.name} not removed now: {e}")
