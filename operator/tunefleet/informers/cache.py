"""What the operator keeps of the watched objects: small views (views.py), by owner.

Filled by the reflectors (runtime/reflector.py): their lists (at startup, and again after a watch
expired) and their watch events, through the event handlers (handlers/). Readers are the
reconcile workers (threads) and the webhook (the event loop), so every access holds a lock, and
every reader gets its own copy.

Each view is kept as compact JSON bytes (orjson's, read back in ~2-5 microseconds),
not as dicts: a profile's view as dicts took ~10 KB, as bytes ~2 KB, and bytes this size live
outside Python's small-object arenas, so what a deletion frees goes back to the system
(heap.release_memory) instead of pinning half-empty arenas (bench/scale.md).

Ownership is identity: a Job belongs to a profile only through its controller ownerReference
(to a TuningProfile, in the Job's own namespace), a pod to a Job only through its own. Jobs and
pods that carry tunefleet's labels without that ownership are kept apart as untrusted, by the
profile they claim, so the reconcile of that profile can report them; they are never read as
its children.

Every entry leaves with what it describes: on its DELETED event, or when a reflector's list no
longer returns it (`known` and `stub` let the reflector find and hand those back as DELETED).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import orjson

from tunefleet import metrics, naming
from tunefleet.api.conditions import Phase
from tunefleet.informers import views
from tunefleet.runtime.heap import compacted

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
Owner = tuple[str, str]  # (namespace, owner uid)


def _pack(view: dict[str, Any]) -> bytes:
    # Compact, as bytes (views hold only what JSON held); ~13x faster than json.dumps here.
    # Copied to its length: orjson hands back its whole output buffer (4 KiB for a 1 KB view,
    # 8 KiB for a profile's), which the cache would keep for the object's life: at 3,000
    # profiles 47 of the 58 MiB they took were those buffers' slack (bench/scale.md).
    return bytes(memoryview(orjson.dumps(view)))


def _unpack(blob: bytes) -> dict[str, Any]:
    view: dict[str, Any] = orjson.loads(blob)
    return view


@dataclass(frozen=True, slots=True)
class Untrusted:
    """A Job or pod that claims a profile by its labels without being owned by it."""

    kind: str
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Summary:
    """What the metrics read of a profile's status, kept beside its view (no parse a scrape)."""

    phase: str
    job_states: tuple[str, ...]
    unadmitted: int

    @classmethod
    def of(cls, status: dict[str, Any]) -> Summary:
        return cls(
            str(status.get("phase") or Phase.PENDING),
            tuple(str(j.get("state") or "Pending") for j in status.get("jobs") or []),
            int(status.get("unadmittedPods") or 0),
        )


def spec_seen(obj: dict[str, Any]) -> tuple[str, int, bool]:
    """(uid, generation, being deleted) of a profile: what tells a change of its spec (or a
    new object under its name, or its deletion) from a status write."""
    meta = obj.get("metadata") or {}
    return (
        str(meta.get("uid") or ""),
        int(meta.get("generation") or 0),
        bool(meta.get("deletionTimestamp")),
    )


@dataclass(slots=True)
class _Profile:
    uid: str
    blob: bytes
    summary: Summary
    seen: tuple[str, int, bool] = ("", 0, False)  # spec_seen()


@dataclass(frozen=True, slots=True)
class _Placed:
    """Where a Job's or pod's view is kept: under its owner, or as untrusted (claimed uid)."""

    kind: str
    namespace: str
    owner: str  # the owner's uid ("" when untrusted)
    claimed: str  # the profile uid its label claims


class Cache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._profiles: dict[Key, _Profile] = {}
        self._uids: dict[str, Key] = {}  # profile uid -> key
        # (namespace, owner uid) -> object uid -> view: Jobs by profile, pods by Job.
        self._jobs: dict[Owner, dict[str, bytes]] = {}
        self._pods: dict[Owner, dict[str, bytes]] = {}
        # claimed profile uid -> object uid -> what it is
        self._untrusted: dict[str, dict[str, Untrusted]] = {}
        # object uid -> where it is kept
        self._at: dict[str, _Placed] = {}

    # --- profiles ---------------------------------------------------------------------------

    def put_profile(self, body: dict[str, Any]) -> dict[str, Any]:
        view = views.profile_view(body)
        meta = view["metadata"]
        key = (meta.get("namespace", ""), meta.get("name", ""))
        uid = meta.get("uid", "")
        entry = _Profile(uid, _pack(view), Summary.of(view.get("status") or {}), spec_seen(view))
        with self._lock:
            old = self._profiles.get(key)
            if old is not None and old.uid != uid:
                self._uids.pop(old.uid, None)
            self._profiles[key] = entry
            self._uids[uid] = key
        return view

    def written(self, key: Key, resource_version: str, status: dict[str, Any]) -> None:
        """What the API server answered to our status write: fresher than the watch, until
        the watch brings the same (or newer) back."""
        with self._lock:
            entry = self._profiles.get(key)
            if entry is None:
                return
            view = _unpack(entry.blob)
            view["metadata"]["resourceVersion"] = resource_version
            view["status"] = status
            self._profiles[key] = _Profile(entry.uid, _pack(view), Summary.of(status), entry.seen)

    def spec_seen(self, key: Key) -> tuple[str, int, bool] | None:
        """spec_seen() of the profile held under `key`, without unpacking its view."""
        with self._lock:
            entry = self._profiles.get(key)
        return entry.seen if entry is not None else None

    def drop_profile(self, key: Key) -> None:
        with self._lock:
            entry = self._profiles.pop(key, None)
            if entry is not None:
                self._uids.pop(entry.uid, None)
                self._untrusted.pop(entry.uid, None)

    def profile(self, key: Key) -> dict[str, Any] | None:
        with self._lock:
            entry = self._profiles.get(key)
        return _unpack(entry.blob) if entry is not None else None

    def profiles(self) -> list[Key]:
        with self._lock:
            return list(self._profiles)

    def has_profile_uid(self, uid: str) -> bool:
        with self._lock:
            return uid in self._uids

    def statuses(self) -> list[dict[str, Any]]:
        """The part of each profile's status the metrics count (metrics.IndexCollector)."""
        with self._lock:
            summaries = [e.summary for e in self._profiles.values()]
        return [
            {
                "phase": s.phase,
                "jobs": [{"state": state} for state in s.job_states],
                "unadmittedPods": s.unadmitted,
            }
            for s in summaries
        ]

    # --- tuning Jobs and pods, by owner -----------------------------------------------------

    def follow(self, kind: str, event: str | None, body: dict[str, Any]) -> None:
        """A tuning Job's or pod's watch event: keep its view under its owner (or as
        untrusted, under the profile it claims), or drop it when deleted."""
        meta_in = body.get("metadata") or {}
        uid, ns = meta_in.get("uid", ""), meta_in.get("namespace", "")
        if event == "DELETED":
            with self._lock:
                self._unplace(uid)
            return
        view = views.job_view(body) if kind == "jobs" else views.pod_view(body)
        meta = view["metadata"]
        owner = meta.get("owner") or ""
        claimed = (meta.get("labels") or {}).get(naming.PROFILE_UID_LABEL, "")
        blob = _pack(view) if owner else b""
        with self._lock:
            # Wherever it was kept before: its owner reference may have changed since.
            self._unplace(uid)
            if owner:
                # Chosen under the lock: compact() may have swapped the tables in between.
                table = self._jobs if kind == "jobs" else self._pods
                table.setdefault((ns, owner), {})[uid] = blob
                self._at[uid] = _Placed(kind, ns, owner, claimed)
            elif claimed:
                name = meta.get("name", "")
                self._remember_untrusted(kind, claimed, Untrusted(kind, ns, name, uid))
                self._at[uid] = _Placed(kind, ns, "", claimed)

    def _unplace(self, uid: str) -> None:
        placed = self._at.pop(uid, None)
        if placed is None:
            return
        if placed.owner:
            table = self._jobs if placed.kind == "jobs" else self._pods
            key = (placed.namespace, placed.owner)
            children = table.get(key)
            if children is not None:
                children.pop(uid, None)
                if not children:
                    del table[key]
        else:
            self._forget_untrusted(placed.claimed, uid)

    def _remember_untrusted(self, kind: str, claimed: str, obj: Untrusted) -> None:
        seen = self._untrusted.setdefault(claimed, {})
        if obj.uid not in seen:
            metrics.UNTRUSTED_OBJECTS.labels(kind).inc()
            log.warning(
                f"{kind[:-1]} {obj.namespace}/{obj.name} carries tunefleet's labels for profile "
                f"uid {claimed} but no controller ownerReference to it: ignored"
            )
        seen[obj.uid] = obj

    def _forget_untrusted(self, claimed: str, uid: str) -> None:
        seen = self._untrusted.get(claimed)
        if seen is None or uid not in seen:
            return
        del seen[uid]
        if not seen:
            del self._untrusted[claimed]

    def jobs(self, namespace: str, profile_uid: str) -> list[dict[str, Any]]:
        """The Jobs a profile controls, in its own namespace."""
        with self._lock:
            blobs = list((self._jobs.get((namespace, profile_uid)) or {}).values())
        return [_unpack(b) for b in blobs]

    def pods(self, namespace: str, job_uid: str) -> list[dict[str, Any]]:
        """The pods a Job controls."""
        with self._lock:
            blobs = list((self._pods.get((namespace, job_uid)) or {}).values())
        return [_unpack(b) for b in blobs]

    def untrusted(self, profile_uid: str) -> list[Untrusted]:
        with self._lock:
            return list((self._untrusted.get(profile_uid) or {}).values())

    # --- what a reflector's list is checked against -----------------------------------------

    def known(self, kind: str, namespace: str | None) -> set[str]:
        """The uids of this kind (in this namespace, or all) the cache holds."""
        with self._lock:
            if kind == "tuningprofiles":
                return {
                    e.uid
                    for key, e in self._profiles.items()
                    if namespace is None or key[0] == namespace
                }
            return {
                uid
                for uid, placed in self._at.items()
                if placed.kind == kind and (namespace is None or placed.namespace == namespace)
            }

    def stub(self, kind: str, uid: str) -> dict[str, Any]:
        """What a DELETED event of a known object needs: its metadata as the cache has it."""
        with self._lock:
            if kind == "tuningprofiles":
                key = self._uids.get(uid)
                return (
                    {"metadata": {"namespace": key[0], "name": key[1], "uid": uid}} if key else {}
                )
            placed = self._at.get(uid)
            if placed is None:
                return {}
            if not placed.owner:  # untrusted: nothing of it is kept but where it was
                return {"metadata": {"namespace": placed.namespace, "uid": uid}}
            table = self._jobs if kind == "jobs" else self._pods
            blob = (table.get((placed.namespace, placed.owner)) or {}).get(uid, b"")
        if not blob:
            return {"metadata": {"namespace": placed.namespace, "uid": uid}}
        meta = _unpack(blob)["metadata"]
        labels = meta.get("labels") or {}
        name = labels.get(naming.TUNING_PROFILE_LABEL)
        return {
            "metadata": {
                "namespace": placed.namespace,
                "name": meta.get("name", ""),
                "uid": uid,
                "labels": {naming.TUNING_PROFILE_LABEL: name} if name else {},
            }
        }

    def compact(self) -> None:
        """Rebuild the tables a burst grew and a deletion emptied (heap.compacted): a dict
        keeps its peak's table otherwise."""
        with self._lock:
            self._profiles = compacted(self._profiles)
            self._uids = compacted(self._uids)
            self._jobs = compacted(self._jobs)
            self._pods = compacted(self._pods)
            self._untrusted = compacted(self._untrusted)
            self._at = compacted(self._at)

    def sizes(self) -> dict[str, int]:
        """Entries per table (the memory figures of bench/ and a test of pruning)."""
        with self._lock:
            return {
                "profiles": len(self._profiles),
                "jobs": sum(len(v) for v in self._jobs.values()),
                "pods": sum(len(v) for v in self._pods.values()),
                "untrusted": sum(len(v) for v in self._untrusted.values()),
                "placed": len(self._at),
                "bytes": sum(len(e.blob) for e in self._profiles.values())
                + sum(
                    len(b) for t in (self._jobs, self._pods) for v in t.values() for b in v.values()
                ),
            }
