"""Where captured misses are kept, and the frozen shape sets retunes tune: ConfigMaps in the
profile's namespace, owned by the profile (garbage-collected with it). This module owns their
format (written and read here only).

A *capture store*: one per (profile, GPU model, software identity), named by a hash of them.
Its ``rows`` key holds one line per distinct GEMM production missed, ``<first seen, unix
seconds> <OpSig>,<ParamSig>``, in the order they came; ``meta.json`` the last capture time,
how many rows were not kept (the store is full: rows are never evicted, so a retune never
meets a shape it dropped and sees it again as new) and which pods recorded without their
results loaded. Captures whose identity is not the artifact's (another image, an artifact the
profile does not know) go to a store of their own, marked apart: shown, never tuned.

Who writes: any operator replica that receives a capture (all serve the endpoint, one leads).
Every write is a compare-and-swap: a create that loses to another replica reads what won and
merges into it; an update carries the resourceVersion it merged into (409: read again and
merge again). Merging adds rows and never removes any, so no replica's rows are lost, whoever
writes first. That is why these writes do not pass the leader's fence (kube.write_timeout):
the fence keeps a deposed leader from acting on a stale picture, and a set union over the
version it read cannot be stale.

A *retune set*: the rows one retune froze, immutable, named by (profile uid, GPU model, base
revision, digest of the rows); the retune's tuning Job mounts it (``untuned.csv``, TunableOp's
untuned format, which tuner_job merges into what it records).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from tunefleet import kube, naming
from tunefleet.builders.job import owner_reference
from tunefleet.kube import Kube
from tunefleet.watched import views
from tuner_job import caches as cc

log = logging.getLogger(__name__)

ROWS_KEY = "rows"
META_KEY = "meta.json"
UNTUNED_KEY = "untuned.csv"
IDENTITY_ANNOTATION = "tunefleet.io/identity"
APART_ANNOTATION = "tunefleet.io/capture-apart"
BASE_ANNOTATION = "tunefleet.io/base-revision"
DIGEST_ANNOTATION = "tunefleet.io/capture-digest"
# A ConfigMap holds 1 MiB; this leaves room for its metadata and meta.json.
MAX_BYTES = 900 * 1024
MAX_NOT_LOADED_PODS = 20
# The latest pods whose served cache said which path it took (contracts/capture_upload.py's caches):
# enough to count a scale-up, bounded so the store's size does not grow with the fleet.
MAX_CACHE_PODS = 64
CACHE_LOAD_KEYS = ("kind", "path", "key", "reason", "args")
CAS_TRIES = 6


def cache_load_entry(load: dict[str, str]) -> dict[str, str]:
    """A pod's cache load as the store keeps it (every key, strings)."""
    return {k: str(load.get(k) or "") for k in CACHE_LOAD_KEYS}


def now_iso(at: float | None = None) -> str:
    moment = datetime.datetime.fromtimestamp(at if at is not None else time.time(), datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _hash(*parts: str, n: int = 16) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:n]


def _slug(text: str, n: int) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower())[:n].strip("-")


@dataclass(frozen=True)
class StoreKey:
    """What a capture is attributed to, from the pod as admitted (never from the upload)."""

    namespace: str
    profile: str
    profile_uid: str
    model: str
    identity: str  # the artifact's library key, or "sha256:<artifact>" when it has none
    apart: str = ""  # why these captures are kept apart ("" when they count)

    @property
    def name(self) -> str:
        digest = _hash(self.profile_uid, self.model, self.identity, self.apart)
        return f"tunefleet-capture-{_slug(self.profile, 24)}-{digest}".replace("--", "-")


@dataclass(frozen=True)
class StoreView:
    """A capture store as the operator reads it."""

    key: StoreKey
    rows: dict[str, int] = field(default_factory=dict)  # OpSig,ParamSig -> first seen (unix)
    last_capture: str = ""
    dropped: int = 0
    not_loaded: dict[str, int] = field(default_factory=dict)  # pod -> rows in its artifact
    # pod -> {kind, path, key, reason}: which path its served cache took (newest last)
    cache_loads: dict[str, dict[str, str]] = field(default_factory=dict)
    name: str = ""
    uid: str = ""
    resource_version: str = ""


def _encode_rows(rows: dict[str, int]) -> str:
    return "".join(f"{at} {row}\n" for row, at in rows.items())


def encoded_size(view: StoreView) -> int:
    loads = sum(80 + len(str(v)) for d in view.cache_loads.values() for v in d.values())
    return len(_encode_rows(view.rows)) + 512 + 80 * len(view.not_loaded) + loads


@dataclass(frozen=True)
class Batch:
    """What one pod's upload adds to a store: its untuned rows, the pod, how many results it
    could not load and how many rows it dropped, and what its served caches did at its start
    (contracts/capture_upload.py CacheLoad, as dicts; the pod's latest word wins)."""

    rows: tuple[str, ...] | list[str] = ()
    pod: str = ""
    not_loaded: int = 0
    dropped: int = 0
    cache_loads: tuple[dict[str, str], ...] = ()


def merge(view: StoreView, batch: Batch, now: float, max_shapes: int) -> tuple[StoreView, int]:
    """The view with the batch's rows added (first seen now), bounded; and how many were new.
    A row that does not fit (max_shapes rows, or MAX_BYTES) is counted as dropped, never
    kept."""
    rows, pod, not_loaded, dropped, cache_loads = (
        batch.rows, batch.pod, batch.not_loaded, batch.dropped, batch.cache_loads
    )  # fmt: skip
    have = dict(view.rows)
    size = encoded_size(view)
    added = 0
    lost = dropped
    stamp = int(now)
    for row in rows:
        if row in have:
            continue
        cost = len(row) + 12
        if len(have) >= max_shapes or size + cost > MAX_BYTES:
            lost += 1
            continue
        have[row] = stamp
        size += cost
        added += 1
    loaded = dict(view.not_loaded)
    if pod and not_loaded > loaded.get(pod, 0):
        loaded.pop(pod, None)
        loaded[pod] = not_loaded
        while len(loaded) > MAX_NOT_LOADED_PODS:
            del loaded[next(iter(loaded))]
    loads = dict(view.cache_loads)
    for load in cache_loads[:1] if pod else ():  # one served cache kind reports (vLLM's)
        entry = cache_load_entry(load)
        if loads.get(pod) != entry:
            loads.pop(pod, None)
            loads[pod] = entry
        while len(loads) > MAX_CACHE_PODS:
            del loads[next(iter(loads))]
    out = replace(
        view,
        rows=have,
        dropped=view.dropped + lost,
        not_loaded=loaded,
        cache_loads=loads,
        last_capture=now_iso(now) if added else view.last_capture,
    )
    return out, added


def changed(before: StoreView, after: StoreView) -> bool:
    return (before.rows, before.dropped, before.not_loaded, before.cache_loads) != (
        after.rows,
        after.dropped,
        after.not_loaded,
        after.cache_loads,
    )


def build_store_config_map(view: StoreView) -> dict[str, Any]:
    """The ConfigMap of a capture store (the pure half of a write)."""
    k = view.key
    meta: dict[str, Any] = {
        "version": 1,
        "lastCapture": view.last_capture,
        "dropped": view.dropped,
        "notLoaded": view.not_loaded,
    }
    if view.cache_loads:
        # A list, not an object: JSON objects are written sorted here, and the order (oldest
        # first) is what bounds the list.
        meta["cacheLoads"] = [{"pod": p, **d} for p, d in view.cache_loads.items()]
    annotations = {
        naming.MODEL_ANNOTATION: k.model,
        IDENTITY_ANNOTATION: k.identity,
    }
    if k.apart:
        annotations[APART_ANNOTATION] = k.apart
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": k.name,
            "namespace": k.namespace,
            "labels": {
                **naming.MANAGED_BY,
                naming.PROFILE_UID_LABEL: k.profile_uid,
                naming.TUNING_PROFILE_LABEL: k.profile,
                naming.ROLE_LABEL: naming.ROLE_CAPTURE,
            },
            "annotations": annotations,
            "ownerReferences": [owner_reference(k.profile, k.profile_uid)],
        },
        "data": {ROWS_KEY: _encode_rows(view.rows), META_KEY: json.dumps(meta, sort_keys=True)},
    }


def _owned_as(meta: dict[str, Any], role: str) -> str | None:
    """The uid of the profile that controls a ConfigMap of `role`, None when it is not one:
    labels alone are not identity (anyone may copy them)."""
    labels = meta.get("labels") or {}
    owner = views.owning_profile(meta)
    if owner is None or owner != labels.get(naming.PROFILE_UID_LABEL):
        return None
    return owner if labels.get(naming.ROLE_LABEL) == role else None


def _ours(there: dict[str, Any], key: StoreKey) -> StoreView:
    """The store found under the key's name, if it is the profile's own; NotOurs if not."""
    parsed = parse_store(there)
    if parsed is None or parsed.key.profile_uid != key.profile_uid:
        raise kube.NotOurs(
            f"ConfigMap {key.namespace}/{key.name} is not a capture store of "
            f"TuningProfile {key.profile}: captures for it are not kept; delete it "
            "so tunefleet can make its own"
        )
    return parsed


def parse_store(cm: dict[str, Any]) -> StoreView | None:
    """A capture store from its ConfigMap; None when it is not one the profile owns."""
    meta = cm.get("metadata") or {}
    labels = meta.get("labels") or {}
    anns = meta.get("annotations") or {}
    owner = _owned_as(meta, naming.ROLE_CAPTURE)
    if owner is None:
        return None
    data = cm.get("data") or {}
    rows: dict[str, int] = {}
    for line in str(data.get(ROWS_KEY) or "").splitlines():
        at, _, row = line.partition(" ")
        if row and at.isdigit():
            rows.setdefault(row, int(at))
    try:
        doc = json.loads(data.get(META_KEY) or "{}")
    except ValueError:
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    loaded = doc.get("notLoaded") if isinstance(doc.get("notLoaded"), dict) else {}
    key = StoreKey(
        namespace=str(meta.get("namespace") or ""),
        profile=str(labels.get(naming.TUNING_PROFILE_LABEL) or ""),
        profile_uid=owner,
        model=str(anns.get(naming.MODEL_ANNOTATION) or ""),
        identity=str(anns.get(IDENTITY_ANNOTATION) or ""),
        apart=str(anns.get(APART_ANNOTATION) or ""),
    )
    dropped = doc.get("dropped")
    cache_loads: dict[str, dict[str, str]] = {}
    for entry in doc.get("cacheLoads") or [] if isinstance(doc.get("cacheLoads"), list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("pod"), str):
            cache_loads[entry["pod"]] = cache_load_entry(entry)
    return StoreView(
        key=key,
        rows=rows,
        last_capture=str(doc.get("lastCapture") or ""),
        dropped=dropped if isinstance(dropped, int) and dropped >= 0 else 0,
        not_loaded={str(p): int(n) for p, n in (loaded or {}).items() if isinstance(n, int)},
        cache_loads=cache_loads,
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


# --- retune sets ------------------------------------------------------------------------------


def digest_of(rows: list[str] | tuple[str, ...], variants: tuple[str, ...] = ()) -> str:
    """The digest of a set of rows and cache variants (order does not matter): part of the
    retune's revision. Without variants it is what it always was, so no revision moves."""
    text = "\n".join(sorted(set(rows)))
    if variants:
        text += "\0variants\0" + "\n".join(sorted(set(variants)))
    return _hash(text)


@dataclass(frozen=True)
class RetuneSet:
    namespace: str
    profile: str
    profile_uid: str
    model: str
    base_revision: str
    rows: tuple[str, ...]  # sorted
    # Cache variants (tuner_job/caches.py): each a JSON list of "--flag=value", sorted.
    variants: tuple[str, ...] = ()
    name: str = ""
    uid: str = ""

    @property
    def digest(self) -> str:
        return digest_of(self.rows, self.variants)

    @property
    def config_map_name(self) -> str:
        digest = _hash(self.profile_uid, self.model, self.base_revision, self.digest)
        return f"tunefleet-retune-{_slug(self.profile, 24)}-{digest}".replace("--", "-")


def build_retune_config_map(r: RetuneSet) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": r.config_map_name,
            "namespace": r.namespace,
            "labels": {
                **naming.MANAGED_BY,
                naming.PROFILE_UID_LABEL: r.profile_uid,
                naming.TUNING_PROFILE_LABEL: r.profile,
                naming.ROLE_LABEL: naming.ROLE_RETUNE,
            },
            "annotations": {
                naming.MODEL_ANNOTATION: r.model,
                BASE_ANNOTATION: r.base_revision,
                DIGEST_ANNOTATION: r.digest,
            },
            "ownerReferences": [owner_reference(r.profile, r.profile_uid)],
        },
        # Immutable: what a retune tuned is fixed; a later retune is another set.
        "immutable": True,
        "data": {
            UNTUNED_KEY: "".join(f"{row}\n" for row in sorted(r.rows)),
            **(
                {cc.VARIANTS_KEY: cc.encode_variants(json.loads(v) for v in r.variants)}
                if r.variants
                else {}
            ),
        },
    }


def parse_retune(cm: dict[str, Any]) -> RetuneSet | None:
    meta = cm.get("metadata") or {}
    labels = meta.get("labels") or {}
    anns = meta.get("annotations") or {}
    owner = _owned_as(meta, naming.ROLE_RETUNE)
    if owner is None:
        return None
    data = cm.get("data") or {}
    rows = tuple(sorted(r for r in str(data.get(UNTUNED_KEY) or "").split()))
    try:
        variants = tuple(
            sorted(
                json.dumps(list(v), separators=(",", ":"))
                for v in cc.parse_variants(str(data.get(cc.VARIANTS_KEY) or ""))
            )
        )
    except cc.CacheError:
        return None  # not what we write: never tuned from
    found = RetuneSet(
        namespace=str(meta.get("namespace") or ""),
        profile=str(labels.get(naming.TUNING_PROFILE_LABEL) or ""),
        profile_uid=owner,
        model=str(anns.get(naming.MODEL_ANNOTATION) or ""),
        base_revision=str(anns.get(BASE_ANNOTATION) or ""),
        rows=rows,
        variants=variants,
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
    )
    # A set whose rows are not what its name says was changed by someone: not ours to use.
    if anns.get(DIGEST_ANNOTATION) != found.digest or found.name != found.config_map_name:
        return None
    return found


# --- the write, from any replica ----------------------------------------------------------------


class StoreUnavailable(Exception):
    """The capture could not be kept now (API errors, lost races); the sidecar retries."""


class Writer:
    """Adds rows to a capture store by compare-and-swap (see the module's docstring)."""

    def __init__(self, client: Kube, timeout_s: float = kube.REQUEST_TIMEOUT) -> None:
        self.client = client  # the process's one; its fence is not asked (module docstring)
        self.timeout_s = timeout_s

    def _core(self) -> Any:
        return self.client.core()

    def _read(self, key: StoreKey) -> dict[str, Any] | None:
        try:
            resp = self._core().read_namespaced_config_map(
                key.name, key.namespace, _preload_content=False, _request_timeout=self.timeout_s
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise StoreUnavailable(f"reading {key.name}: {e.status} {kube.api_message(e)}") from e
        except (OSError, urllib3.exceptions.HTTPError) as e:
            raise StoreUnavailable(f"reading ConfigMap {key.name}: {e}") from e
        found: dict[str, Any] = json.loads(resp.data)
        return found

    def _write(
        self, core: Any, key: StoreKey, merged: StoreView, resource_version: str | None
    ) -> None:
        """Create the store (None: there was none), or patch it over the version it was read
        at (409 when another replica wrote since: the caller merges again)."""
        body = build_store_config_map(merged)
        if resource_version is None:
            resp = core.create_namespaced_config_map(
                key.namespace, body, _preload_content=False, _request_timeout=self.timeout_s
            )
        else:
            resp = core.patch_namespaced_config_map(
                key.name, key.namespace,
                {"metadata": {"resourceVersion": resource_version}, "data": body["data"]},
                _preload_content=False, _request_timeout=self.timeout_s,
            )  # fmt: skip
        kube.release(resp)

    def add(
        self, key: StoreKey, batch: Batch, *, max_shapes: int, now: float | None = None
    ) -> tuple[int, int]:
        """(rows new to the store, rows it holds). Raises StoreUnavailable, kube.NotOurs."""
        core = self._core()
        for attempt in range(CAS_TRIES):
            at = time.time() if now is None else now
            there = self._read(key)
            view = StoreView(key) if there is None else _ours(there, key)
            merged, added = merge(view, batch, at, max_shapes)
            if there is not None and not changed(view, merged):
                return 0, len(view.rows)
            try:
                version = view.resource_version if there is not None else None
                self._write(core, key, merged, version)
                return added, len(merged.rows)
            except ApiException as e:
                if e.status == 409:  # another replica wrote first: merge into what it wrote
                    time.sleep(random.uniform(0, 0.05 * (attempt + 1)))
                    continue
                if e.status == 404 and "namespaces" in kube.api_message(e):
                    raise StoreUnavailable(f"namespace {key.namespace} is gone") from e
                raise StoreUnavailable(
                    f"writing ConfigMap {key.namespace}/{key.name}: {e.status} "
                    f"{kube.api_message(e)}"
                ) from e
            except (OSError, urllib3.exceptions.HTTPError) as e:
                raise StoreUnavailable(f"writing ConfigMap {key.name}: {e}") from e
        raise StoreUnavailable(f"ConfigMap {key.name} kept changing ({CAS_TRIES} tries)")
