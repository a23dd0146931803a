"""The production loop, as pure functions: from captured misses to status.capture, to the
decision to retune, and to the revision each GPU model tunes under.

Per GPU model, against its current artifact (status.artifacts[]):

- *seen*: distinct GEMMs pods of the artifact's software identity recorded as misses (a GEMM
  the artifact has is a hit, which TunableOp never writes down, so only misses are seen);
  *tuned*: those the current artifact now has; *coverage*: tuned / seen. Captures of another
  identity (another image, an artifact the profile does not know) are counted apart.
- *a retune*: a frozen set of captured shapes (capture/retune_sets.py's RetuneSet) tuned with the
  profile's workload by the usual tuning Job, under the revision
  ``naming.retune_revision(spec revision, digest of the set)``; the GEMM library makes what is
  tuned already free. The set, its digest and the revision are kept in status.capture[].retune,
  so every reconcile (and a restarted operator) computes the same revision.
- *when*: only while the model is settled (its artifact is of its current revision: nothing
  tunes), and then when `spec.capture.retune` says so (``misses``: at least that many *new*
  untuned shapes; ``coverage``: new ones and coverage below that percent), at most once per
  ``minIntervalSeconds``; or when asked (contracts/retune.py), whatever the thresholds.
  *New* means not in the set the last retune of this revision tuned: a shape torch rejects (or
  that the budget left untuned) is tuned again only with a new one, so no shape retunes forever.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tunefleet import naming
from tunefleet.api import CaptureSpec, RetuneSpec
from tunefleet.capture.retune_sets import MAX_BYTES, RetuneSet, StoreView, now_iso
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.contracts.capture_upload import EMPTY, LOADED, MISSED, RECOMPILED
from tunefleet.contracts.retune import Retunes
from tuner_job import caches as cc

THRESHOLD, MANUAL = "Threshold", "Manual"
PUBLISHED, TUNING, SUPERSEDED = "Published", "Tuning", "Superseded"


def identity_of(record: ArtifactRecord) -> str:
    """The software identity captures are kept by: the artifact's library key (GPU model,
    validators and the identity torch does not check), or its own SHA-256 without one."""
    return record.library_key or f"sha256:{record.sha256}"


@dataclass(frozen=True)
class Retune:
    """status.capture[].retune: the last retune frozen for a GPU model."""

    base_revision: str
    digest: str
    shapes: int
    reason: str
    requested_at: str
    config_map: str
    nonce: str = ""

    @property
    def revision(self) -> str:
        return naming.retune_revision(self.base_revision, self.digest)

    def to_status(self, state: str) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "baseRevision": self.base_revision,
            "digest": self.digest,
            "revision": self.revision,
            "shapes": self.shapes,
            "reason": self.reason,
            "requestedAt": self.requested_at,
            "configMap": self.config_map,
            "state": state,
        }
        if self.nonce:
            doc["nonce"] = self.nonce
        return doc

    @classmethod
    def from_status(cls, doc: Any) -> Retune | None:
        if not isinstance(doc, dict):
            return None
        base, digest = doc.get("baseRevision"), doc.get("digest")
        if not (isinstance(base, str) and base and isinstance(digest, str) and digest):
            return None
        shapes = doc.get("shapes")
        return cls(
            base_revision=base,
            digest=digest,
            shapes=shapes if isinstance(shapes, int) and not isinstance(shapes, bool) else 0,
            reason=str(doc.get("reason") or THRESHOLD),
            requested_at=str(doc.get("requestedAt") or ""),
            config_map=str(doc.get("configMap") or ""),
            nonce=str(doc.get("nonce") or ""),
        )


def previous_entries(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        str(e.get("gpuModel")): e
        for e in status.get("capture") or []
        if isinstance(e, dict) and e.get("gpuModel")
    }


def model_revision(base: str, entry: dict[str, Any] | None) -> str:
    """The revision a GPU model tunes under: its last retune's, when that retune is of the
    spec's current revision; else the spec's."""
    retune = Retune.from_status((entry or {}).get("retune"))
    if retune is not None and retune.base_revision == base:
        return retune.revision
    return base


def revisions(base: str, status: dict[str, Any], models: Sequence[str]) -> dict[str, str]:
    previous = previous_entries(status)
    return {m: model_revision(base, previous.get(m)) for m in models}


def _ts(text: str) -> float | None:
    try:
        return (
            datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
            .replace(tzinfo=datetime.UTC)
            .timestamp()
        )
    except ValueError:
        return None


@dataclass(frozen=True)
class ModelInput:
    model: str
    artifact: ArtifactRecord | None  # the model's current artifact (status.artifacts[])
    artifact_keys: frozenset[str] | None  # its GEMMs as OpSig,ParamSig; None: not readable
    stores: Sequence[StoreView]  # every capture store of the model
    retunes: Sequence[RetuneSet]  # every retune set of the model
    previous: dict[str, Any]  # its status.capture[] entry before
    revision: str  # the revision it tunes under now (model_revision)


@dataclass
class ModelPlan:
    entry: dict[str, Any] | None  # its status.capture[] entry (None: nothing to show)
    revision: str
    freeze: RetuneSet | None = None
    # Events to post: (type, reason, message).
    events: list[tuple[str, str, str]] = field(default_factory=list)


def _bounded(rows: Sequence[str], limit: int) -> list[str]:
    out: list[str] = []
    size = 0
    for row in rows:
        if len(out) >= limit or size + len(row) + 1 > MAX_BYTES:
            break
        out.append(row)
        size += len(row) + 1
    return out


_Event = tuple[str, str, str]  # (type, reason, message)


@dataclass(frozen=True)
class _Captured:
    """A GPU model's captured GEMMs, judged against its current artifact."""

    identity: str  # the artifact's (identity_of); "" without an artifact
    current: list[StoreView]  # the stores of that identity: the only ones counted
    apart: list[StoreView]
    rows: dict[str, int]  # OpSig,ParamSig -> first seen (unix), over the current stores
    tuned: list[str]
    untuned: list[str]  # oldest capture first, so a bounded freeze keeps the oldest misses
    new: list[str]  # untuned and not in the set the last retune of this revision tuned
    # Cache variants (tuner_job/caches.py) of pods whose key the artifact lacks, sorted; and
    # those the last retune of this revision did not run.
    variants: list[str] = field(default_factory=list)
    new_variants: list[str] = field(default_factory=list)
    covered: frozenset[str] = frozenset()  # the cache keys the artifact holds


@dataclass(frozen=True)
class _Decision:
    """Whether a retune is due: what to freeze (nothing: no retune) and what status says."""

    handled: str  # the last retune request's nonce acted on (status handledNonce)
    message: str
    freeze: tuple[str, ...] = ()
    reason: str = ""
    variants: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Started:
    """A retune that starts: the set to create, the status it is kept under, its Event."""

    frozen: RetuneSet
    retune: Retune
    message: str
    event: _Event


def _captured(inp: ModelInput, retune: Retune | None, base: str) -> _Captured:
    art = inp.artifact
    identity = identity_of(art) if art is not None else ""
    current = [s for s in inp.stores if not s.key.apart and identity and s.key.identity == identity]
    apart = [s for s in inp.stores if s not in current]
    rows: dict[str, int] = {}
    for store in current:
        for row, at in store.rows.items():
            rows[row] = min(at, rows.get(row, at))
    last_set: frozenset[str] = frozenset()
    last_variants: frozenset[str] = frozenset()
    if retune is not None and retune.base_revision == base:
        found = next((r for r in inp.retunes if r.config_map_name == retune.config_map), None)
        last_set = frozenset(found.rows) if found is not None else frozenset()
        last_variants = frozenset(found.variants) if found is not None else frozenset()
    keys = inp.artifact_keys
    if keys is None and art is not None and retune is not None and art.revision == retune.revision:
        keys = last_set  # no read path to the artifact: what its retune froze counts as tuned
    keys = keys or frozenset()
    tuned = [r for r in rows if r in keys]
    untuned = sorted((r for r in rows if r not in keys), key=lambda r: (rows[r], r))
    new = [r for r in untuned if r not in last_set]
    covered = cache_keys(art)
    variants = sorted(
        {
            load["args"]
            for store in current
            for load in store.cache_loads.values()
            if load.get("path") == MISSED and load.get("args") and load.get("key") not in covered
        }
    )[: cc.MAX_VARIANTS]
    new_variants = [v for v in variants if v not in last_variants]
    return _Captured(
        identity, current, apart, rows, tuned, untuned, new, variants, new_variants, covered
    )


def cache_keys(art: ArtifactRecord | None) -> frozenset[str]:
    """The stack cache keys the artifact's caches hold (vLLM's hash directories)."""
    return frozenset(k for c in (art.caches if art is not None else ()) for k in c.keys)


def _figures(
    model: str, captured: _Captured, previous: dict[str, Any]
) -> tuple[dict[str, Any], list[_Event]]:
    """status.capture[]'s figures for the model, and the Event a new unloaded pod is worth."""
    rows, current, apart = captured.rows, captured.current, captured.apart
    entry: dict[str, Any] = {
        "gpuModel": model,
        "seen": len(rows),
        "tuned": len(captured.tuned),
        "untuned": len(captured.untuned),
    }
    if captured.identity:
        entry["identity"] = captured.identity.removeprefix("sha256:")[:16]
    if rows:
        entry["coverage"] = round(100 * len(captured.tuned) / len(rows))
    last = max((s.last_capture for s in current if s.last_capture), default="")
    if last:
        entry["lastCapture"] = last
    dropped = sum(s.dropped for s in current)
    if dropped:
        entry["dropped"] = dropped
    events: list[_Event] = []
    not_loaded = {p for s in current for p in s.not_loaded}
    if not_loaded:
        entry["notLoadedPods"] = len(not_loaded)
        # Warn only when more pods are affected than last time, so a reconcile loop of the
        # same pods does not repeat the Event.
        if len(not_loaded) > int(previous.get("notLoadedPods") or 0):
            events.append(
                (
                    "Warning",
                    "CaptureResultsNotLoaded",
                    f"{model}: {len(not_loaded)} pod(s) recorded GEMMs their artifact has: "
                    "their process did not load the TunableOp results while recording, so it "
                    "serves untuned (e.g. " + ", ".join(sorted(not_loaded)[:3]) + "). See "
                    "docs/capture.md, 'Results not loaded'.",
                )
            )
    loads, load_events = _cache_loads(model, current, previous, captured.covered)
    if loads:
        entry["caches"] = loads
    events.extend(load_events)
    if apart:
        entry["apart"] = {
            "stores": len(apart),
            "seen": len({r for s in apart for r in s.rows}),
        }
    return entry, events


MAX_POD_LOADS = 16
# A pod's reason as status keeps it: room for vLLM's words, the factor and the flag that differ.
MAX_POD_REASON = 400


def _cache_loads(
    model: str, current: list[StoreView], previous: dict[str, Any], covered: frozenset[str]
) -> tuple[list[dict[str, Any]], list[_Event]]:
    """status.capture[].caches: per served cache kind, how many pods loaded it, compiled again
    after a failed load (vLLM's reason), or missed (nothing for their key: compiled from zero),
    from what their sidecars reported; and the Events a new failure is worth."""
    by_kind: dict[str, dict[str, dict[str, str]]] = {}
    for store in current:
        for pod, load in store.cache_loads.items():
            by_kind.setdefault(load.get("kind") or "", {})[pod] = load
    before = {str(e.get("kind")): e for e in previous.get("caches") or [] if isinstance(e, dict)}
    out: list[dict[str, Any]] = []
    events: list[_Event] = []
    for kind, pods in sorted(by_kind.items()):
        counts = {path: sorted(p for p, d in pods.items() if d.get("path") == path) for path in (
            LOADED, RECOMPILED, MISSED, EMPTY)}  # fmt: skip
        entry: dict[str, Any] = {
            "kind": kind,
            **{p: len(v) for p, v in counts.items() if v or p != EMPTY},
        }
        missed_keys = sorted({pods[p].get("key") or "" for p in counts[MISSED]} - {""} - covered)
        if missed_keys:
            entry["missedKeys"] = missed_keys[:8]
        reasons = [
            pods[p].get("reason") or "" for p in counts[RECOMPILED] + counts[MISSED] + counts[EMPTY]
        ]
        if reasons and reasons[-1]:
            entry["message"] = reasons[-1][:500]
        # The newest pods, each with its path (kubectl tunefleet why <pod> shows its own).
        entry["pods"] = [
            {"name": p, "path": d.get("path") or "", "key": (d.get("key") or "")[:16]}
            | ({"reason": (d.get("reason") or "")[:MAX_POD_REASON]} if d.get("reason") else {})
            for p, d in list(pods.items())[-MAX_POD_LOADS:]
        ]
        out.append(entry)
        was = before.get(kind) or {}
        for path, reason, what in (
            (MISSED, "CacheMissed", "found nothing for their key in the bundle and compiled "
             "from zero (another max-model-len, model or ISA than the tuning run's?)"),
            (RECOMPILED, "CacheNotLoaded", "found the bundle's entry for their key, could not "
             "load it and compiled again"),
            (EMPTY, "CacheLoadedEmpty", "loaded the bundle's entry for their key, which held no "
             "compiled code: they run eager"),
        ):  # fmt: skip
            if len(counts[path]) > int(was.get(path) or 0):
                keys = f" (keys {', '.join(k[:12] for k in missed_keys[:3])})" if (
                    path == MISSED and missed_keys) else ""  # fmt: skip
                events.append(
                    (
                        "Warning",
                        reason,
                        f"{model}: {len(counts[path])} pod(s) served the {kind} cache {what}"
                        f"{keys}, e.g. {', '.join(counts[path][:3])}"
                        + (f": {entry['message']}" if entry.get("message") else ""),
                    )
                )
    return out, events


@dataclass(frozen=True)
class Subject:
    """Whose capture loop it is: the profile (namespace, name, uid) and the revision of its
    spec, on which a retune's revision builds."""

    namespace: str
    profile: str
    profile_uid: str
    base: str


@dataclass(frozen=True)
class Moment:
    """When the loop looks and what it may do then: the time, the retune a user asked for (if
    any), and whether to decide a retune at all (False: the figures only, as after a status
    took a new artifact)."""

    now: float
    request: Retunes | None = None
    decide: bool = True


@dataclass(frozen=True)
class Seen:
    """What the loop reads besides status: the capture stores and retune sets the cache holds
    for the profile, and which keys an artifact's caches have (None: not known)."""

    stores: Sequence[StoreView]
    retunes: Sequence[RetuneSet]
    keys_of: Callable[[ArtifactRecord], frozenset[str] | None]


def _decide(
    capture: CaptureSpec,
    inp: ModelInput,
    captured: _Captured,
    retune: Retune | None,
    moment: Moment,
) -> _Decision:
    request, now, decide = moment.request, moment.now, moment.decide
    previous = inp.previous or {}
    handled = str(previous.get("handledNonce") or "")
    nonce = request.nonce_for(inp.model) if request is not None else ""
    asked = bool(nonce) and nonce != handled
    settled = inp.artifact is not None and inp.artifact.revision == inp.revision
    if not decide:
        return _Decision(handled, str(previous.get("message") or "") if settled else "")
    if not settled:
        if asked:  # not handled yet: the request stays pending until the model settles
            return _Decision(handled, f"retune asked ({nonce}): waits for the current tuning")
        return _Decision(
            handled, "tuning in progress: a retune waits until the model's artifact is current"
        )
    if asked:
        if captured.untuned or captured.variants:
            return _Decision(nonce, "", tuple(captured.untuned), MANUAL, tuple(captured.variants))
        return _Decision(nonce, f"retune asked ({nonce}): every captured shape is in the artifact")
    if capture.retune is not None and (captured.new or captured.new_variants):
        return _threshold(capture.retune, captured, retune, handled, now)
    return _Decision(handled, "")


def _threshold(
    cfg: RetuneSpec, captured: _Captured, retune: Retune | None, handled: str, now: float
) -> _Decision:
    rows, new = captured.rows, [*captured.new, *captured.new_variants]
    coverage = 100 * len(captured.tuned) / len(rows) if rows else 100.0
    due = (cfg.misses is not None and len(new) >= cfg.misses) or (
        cfg.coverage is not None and coverage < cfg.coverage
    )
    if not due:
        return _Decision(handled, f"{len(new)} new untuned shape(s), below the retune threshold")
    interval_left = 0.0
    since = _ts(retune.requested_at) if retune is not None else None
    if since is not None:
        interval_left = since + cfg.min_interval_seconds - now
    if interval_left > 0:
        return _Decision(
            handled,
            f"{len(new)} new untuned shape(s); the next retune may start at "
            f"{now_iso(now + interval_left)} (minIntervalSeconds)",
        )
    return _Decision(handled, "", tuple(captured.untuned), THRESHOLD, tuple(captured.variants))


def _start_retune(
    capture: CaptureSpec,
    decision: _Decision,
    subject: Subject,
    inp: ModelInput,
    captured: _Captured,
    now: float,
) -> _Started | None:
    """None: the set is the one the last retune of this revision froze; its revision would be
    the same, so starting it again would tune nothing and retune forever."""
    model, base, s = inp.model, subject.base, subject
    last = Retune.from_status((inp.previous or {}).get("retune"))
    new = len(captured.new) + len(captured.new_variants)
    chosen = tuple(sorted(_bounded(decision.freeze, capture.limits.max_shapes)))
    variants = tuple(sorted(decision.variants))
    frozen = RetuneSet(s.namespace, s.profile, s.profile_uid, model, base, chosen, variants)
    if last is not None and last.base_revision == base and frozen.digest == last.digest:
        return None
    manual = decision.reason == MANUAL
    retune = Retune(
        base_revision=base,
        digest=frozen.digest,
        shapes=len(chosen),
        reason=decision.reason,
        requested_at=now_iso(now),
        config_map=frozen.config_map_name,
        nonce=decision.handled if manual else "",
    )
    why = "asked for" if manual else "threshold reached"
    what = f"{len(chosen)} captured shape(s)" + (
        f" and {len(variants)} missed cache key variant(s) ({', '.join(variants)})"
        if variants
        else ""
    )
    return _Started(
        frozen,
        retune,
        f"retuning {what} under revision {retune.revision}",
        (
            "Normal",
            "RetuneStarted",
            f"{model}: retuning {what} ({why}; {new} new) under revision {retune.revision}",
        ),
    )


def _retune_fields(
    *, handled: str, retune: Retune | None, message: str, base: str, art: ArtifactRecord | None
) -> dict[str, Any]:
    """status.capture[]'s retune state: the request handled, the last retune, the message."""
    out: dict[str, Any] = {}
    if handled:
        out["handledNonce"] = handled
    if retune is not None:
        if retune.base_revision != base:
            state = SUPERSEDED
        elif art is not None and art.revision == retune.revision:
            state = PUBLISHED
        else:
            state = TUNING
        out["retune"] = retune.to_status(state)
    if message:
        out["message"] = message
    return out


def plan_model(
    capture: CaptureSpec, subject: Subject, inp: ModelInput, moment: Moment
) -> ModelPlan:
    """moment.decide False: the figures only (a status that just took a new artifact), no
    retune."""
    base = subject.base
    previous = inp.previous or {}
    retune = Retune.from_status(previous.get("retune"))
    plan = ModelPlan(entry=None, revision=inp.revision)
    if not inp.stores and retune is None and not capture.enabled:
        return plan  # nothing captured, nothing asked: no entry
    captured = _captured(inp, retune, base)
    entry, plan.events = _figures(inp.model, captured, previous)
    decision = _decide(capture, inp, captured, retune, moment)
    message = decision.message
    if decision.freeze or decision.variants:
        started = _start_retune(capture, decision, subject, inp, captured, moment.now)
        if started is None:
            message = "the captured untuned shapes are those the last retune tuned"
        else:
            plan.freeze, retune, message = started.frozen, started.retune, started.message
            plan.revision = retune.revision
            plan.events.append(started.event)
    fields = _retune_fields(
        handled=decision.handled, retune=retune, message=message, base=base, art=inp.artifact
    )
    plan.entry = entry | fields
    return plan


@dataclass
class Plan:
    entries: list[dict[str, Any]]
    revisions: dict[str, str]
    freezes: list[RetuneSet]
    events: list[tuple[str, str, str]]
    coverage: str  # the printer column

    def revert(self, model: str, previous: dict[str, Any] | None, base: str, why: str) -> None:
        """A freeze whose set could not be made: the model keeps what it had."""
        self.freezes = [f for f in self.freezes if f.model != model]
        self.revisions[model] = model_revision(base, previous)
        for i, e in enumerate(self.entries):
            if e.get("gpuModel") == model:
                kept = dict(previous or {"gpuModel": model})
                kept["message"] = f"retune not started: {why}"[:1000]
                self.entries[i] = kept
        self.events = [e for e in self.events if not e[2].startswith(f"{model}: retuning")]
        self.events.append(("Warning", "RetuneNotStarted", f"{model}: retune not started: {why}"))


def coverage_column(entries: Sequence[dict[str, Any]]) -> str:
    shown = [e for e in entries if e.get("seen")]
    if not shown:
        return ""
    if len(shown) == 1:
        e = shown[0]
        return f"{e['tuned']}/{e['seen']} {e['coverage']}%"
    return ", ".join(f"{e['gpuModel']} {e['tuned']}/{e['seen']} {e['coverage']}%" for e in shown)


def plan(
    capture: CaptureSpec,
    subject: Subject,
    models: Sequence[str],
    status: dict[str, Any],
    seen: Seen,
    moment: Moment,
) -> Plan:
    previous = previous_entries(status)
    base, stores, retunes, keys_of = subject.base, seen.stores, seen.retunes, seen.keys_of
    artifacts = {}
    for doc in status.get("artifacts") or []:
        record = ArtifactRecord.from_status(doc)
        if record is not None:
            artifacts[record.gpu_model] = record
    out = Plan([], {}, [], [], "")
    for model in models:
        art = artifacts.get(model)
        inp = ModelInput(
            model=model,
            artifact=art,
            artifact_keys=keys_of(art) if art is not None else None,
            stores=[s for s in stores if s.key.model == model],
            retunes=[r for r in retunes if r.model == model],
            previous=previous.get(model) or {},
            revision=model_revision(base, previous.get(model)),
        )
        got = plan_model(capture, subject, inp, moment)
        out.revisions[model] = got.revision
        if got.entry is not None:
            out.entries.append(got.entry)
        if got.freeze is not None:
            out.freezes.append(got.freeze)
        out.events += got.events
    out.coverage = coverage_column(out.entries)
    return out
