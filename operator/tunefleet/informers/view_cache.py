"""What the operator keeps of the objects it watches: small views, by key and by owner. Roots
(the objects a controller reconciles) by (namespace, name); their children (objects a root
controls, and what those control) under their controller's uid. Which kinds, which views and
what a view claims is the domain's to say (`Schema`; tunefleet's: watched/cache.py): this
module knows nothing of it.

Filled by the reflectors (runtime/reflector.py): their lists (at startup, and again after a
watch expired) and their watch events, through the event handlers. Readers are the reconcile
workers (threads) and the webhook (the event loop), so every access holds a lock, and every
reader gets its own copy.

Each view is kept as compact JSON bytes (orjson's, read back in ~2-5 microseconds),
not as dicts: a profile's view as dicts took ~10 KB, as bytes ~2 KB, and bytes this size live
outside Python's small-object arenas, so what a deletion frees goes back to the system
(heap.release_memory) instead of pinning half-empty arenas (bench/scale.md).

Ownership is identity: a child is kept under its owner only through its controller
ownerReference (the view's `metadata.owner`, which the domain's view reads from it). A child
that claims a root (by a label, say) without that ownership is kept apart as untrusted, by the
root it claims, so the reconcile of that root can report it; it is never read as its child.

Every entry leaves with what it describes: on its DELETED event, or when a reflector's list no
longer returns it (`known` and `stub` let the reflector find and hand those back as DELETED).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from tunefleet.runtime.heap import compacted

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
    """A child that claims a root (by a label, say) without being controlled by it."""

    kind: str
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Schema:
    """What a cache needs to know of the kinds it holds; the domain gives it."""

    root: str  # the kind name of the roots (the reflector's Kind.name)
    root_view: Callable[[dict[str, Any]], dict[str, Any]]
    # What readers need of a root's view without unpacking it (a scrape's figures).
    summarize: Callable[[dict[str, Any]], Any]
    # kind name -> view; a view's metadata.owner is its controller's uid (or None).
    children: Mapping[str, Callable[[dict[str, Any]], dict[str, Any]]]
    # The root uid a child's view claims (by a label, say), or "".
    claims: Callable[[dict[str, Any]], str]
    # The labels a DELETED stub of a kept child carries, from its view's metadata.
    stub_labels: Callable[[dict[str, Any]], dict[str, str]]
    # Told once of each untrusted child when it is first seen: (it, the root uid it claims).
    on_untrusted: Callable[[Untrusted, str], None] = lambda obj, claimed: None


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
class _Root:
    uid: str
    blob: bytes
    summary: Any
    seen: tuple[str, int, bool] = ("", 0, False)  # spec_seen()


@dataclass(frozen=True, slots=True)
class _Placed:
    """Where a child's view is kept: under its owner, or as untrusted (claimed uid)."""

    kind: str
    namespace: str
    owner: str  # the owner's uid ("" when untrusted)
    claimed: str  # the root uid it claims


class Cache:
    """Roots by key, children by owner, as `schema` describes them."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._lock = threading.Lock()
        self._roots: dict[Key, _Root] = {}
        self._uids: dict[str, Key] = {}  # root uid -> key
        # kind -> (namespace, owner uid) -> object uid -> view
        self._children: dict[str, dict[Owner, dict[str, bytes]]] = {k: {} for k in schema.children}
        # claimed root uid -> object uid -> what it is
        self._untrusted: dict[str, dict[str, Untrusted]] = {}
        # object uid -> where it is kept
        self._at: dict[str, _Placed] = {}
        # Bumped by every change to a root: what is derived from all roots (the metrics'
        # tallies) is kept until it moves, so a scrape of a settled fleet reads no root.
        self._version = 0

    # --- roots ------------------------------------------------------------------------------

    def put_root(self, body: dict[str, Any]) -> dict[str, Any]:
        """Keep a root's watch event (or list item); returns its view."""
        view = self.schema.root_view(body)
        meta = view["metadata"]
        key = (meta.get("namespace", ""), meta.get("name", ""))
        uid = meta.get("uid", "")
        entry = _Root(uid, _pack(view), self.schema.summarize(view), spec_seen(view))
        with self._lock:
            old = self._roots.get(key)
            if old is not None and old.uid != uid:
                self._uids.pop(old.uid, None)
            self._roots[key] = entry
            self._uids[uid] = key
            self._version += 1
        return view

    def written(self, key: Key, resource_version: str, status: dict[str, Any]) -> None:
        """What the API server answered to our status write: fresher than the watch, until
        the watch brings the same (or newer) back."""
        with self._lock:
            entry = self._roots.get(key)
            if entry is None:
                return
            view = _unpack(entry.blob)
            view["metadata"]["resourceVersion"] = resource_version
            view["status"] = status
            summary = self.schema.summarize(view)
            self._roots[key] = _Root(entry.uid, _pack(view), summary, entry.seen)
            self._version += 1

    def spec_seen(self, key: Key) -> tuple[str, int, bool] | None:
        """spec_seen() of the root held under `key`, without unpacking its view."""
        with self._lock:
            entry = self._roots.get(key)
        return entry.seen if entry is not None else None

    def drop_root(self, key: Key) -> None:
        with self._lock:
            entry = self._roots.pop(key, None)
            if entry is not None:
                self._version += 1
                self._uids.pop(entry.uid, None)
                self._untrusted.pop(entry.uid, None)

    def root(self, key: Key) -> dict[str, Any] | None:
        with self._lock:
            entry = self._roots.get(key)
        return _unpack(entry.blob) if entry is not None else None

    def roots(self) -> list[Key]:
        with self._lock:
            return list(self._roots)

    def has_root_uid(self, uid: str) -> bool:
        with self._lock:
            return uid in self._uids

    def summaries(self) -> tuple[int, list[Any]]:
        """Each root's schema.summarize(), as kept beside its view, and the version of the
        roots they were read at (the same version: the same summaries)."""
        with self._lock:
            return self._version, [e.summary for e in self._roots.values()]

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    # --- children, by owner ----------------------------------------------------------------

    def follow(self, kind: str, event: str | None, body: dict[str, Any]) -> bool:
        """A child's watch event: keep its view under its owner (or as untrusted, under the
        root it claims), or drop it when deleted. False when the event changed nothing kept
        (a field no view keeps, such as a Job's Suspended condition): whatever reads the
        cache would read what it read before."""
        meta_in = body.get("metadata") or {}
        uid, ns = meta_in.get("uid", ""), meta_in.get("namespace", "")
        if event == "DELETED":
            with self._lock:
                self._unplace(uid)
            return True
        view = self.schema.children[kind](body)
        meta = view["metadata"]
        owner = meta.get("owner") or ""
        claimed = self.schema.claims(view)
        blob = _pack(view) if owner else b""
        with self._lock:
            if owner and self._at.get(uid) == _Placed(kind, ns, owner, claimed):
                kept = self._children[kind].get((ns, owner)) or {}
                if kept.get(uid) == blob:
                    return False
            # Wherever it was kept before: its owner reference may have changed since.
            self._unplace(uid)
            if owner:
                # Chosen under the lock: compact() may have swapped the tables in between.
                self._children[kind].setdefault((ns, owner), {})[uid] = blob
                self._at[uid] = _Placed(kind, ns, owner, claimed)
            elif claimed:
                name = meta.get("name", "")
                self._remember_untrusted(claimed, Untrusted(kind, ns, name, uid))
                self._at[uid] = _Placed(kind, ns, "", claimed)
        return True

    def _unplace(self, uid: str) -> None:
        placed = self._at.pop(uid, None)
        if placed is None:
            return
        if placed.owner:
            table = self._children[placed.kind]
            key = (placed.namespace, placed.owner)
            children = table.get(key)
            if children is not None:
                children.pop(uid, None)
                if not children:
                    del table[key]
        else:
            self._forget_untrusted(placed.claimed, uid)

    def _remember_untrusted(self, claimed: str, obj: Untrusted) -> None:
        seen = self._untrusted.setdefault(claimed, {})
        if obj.uid not in seen:
            self.schema.on_untrusted(obj, claimed)
        seen[obj.uid] = obj

    def _forget_untrusted(self, claimed: str, uid: str) -> None:
        seen = self._untrusted.get(claimed)
        if seen is None or uid not in seen:
            return
        del seen[uid]
        if not seen:
            del self._untrusted[claimed]

    def children(self, kind: str, namespace: str, owner_uid: str) -> list[dict[str, Any]]:
        """The views of the `kind` objects that `owner_uid` controls, in its namespace."""
        with self._lock:
            blobs = list((self._children[kind].get((namespace, owner_uid)) or {}).values())
        return [_unpack(b) for b in blobs]

    def untrusted(self, root_uid: str) -> list[Untrusted]:
        with self._lock:
            return list((self._untrusted.get(root_uid) or {}).values())

    # --- what a reflector's list is checked against -----------------------------------------

    def known(self, kind: str, namespace: str | None) -> set[str]:
        """The uids of this kind (in this namespace, or all) the cache holds."""
        with self._lock:
            if kind == self.schema.root:
                return {
                    e.uid
                    for key, e in self._roots.items()
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
            if kind == self.schema.root:
                key = self._uids.get(uid)
                return (
                    {"metadata": {"namespace": key[0], "name": key[1], "uid": uid}} if key else {}
                )
            placed = self._at.get(uid)
            if placed is None:
                return {}
            if not placed.owner:  # untrusted: nothing of it is kept but where it was
                return {"metadata": {"namespace": placed.namespace, "uid": uid}}
            table = self._children[kind]
            blob = (table.get((placed.namespace, placed.owner)) or {}).get(uid, b"")
        if not blob:
            return {"metadata": {"namespace": placed.namespace, "uid": uid}}
        meta = _unpack(blob)["metadata"]
        return {
            "metadata": {
                "namespace": placed.namespace,
                "name": meta.get("name", ""),
                "uid": uid,
                "labels": self.schema.stub_labels(meta),
            }
        }

    def compact(self) -> None:
        """Rebuild the tables a burst grew and a deletion emptied (heap.compacted): a dict
        keeps its peak's table otherwise."""
        with self._lock:
            self._roots = compacted(self._roots)
            self._uids = compacted(self._uids)
            self._children = {k: compacted(t) for k, t in self._children.items()}
            self._untrusted = compacted(self._untrusted)
            self._at = compacted(self._at)

    def sizes(self) -> dict[str, int]:
        """Entries per table (the memory figures of bench/ and a test of pruning)."""
        with self._lock:
            out = {"roots": len(self._roots)}
            out.update({k: sum(len(v) for v in t.values()) for k, t in self._children.items()})
            out["untrusted"] = sum(len(v) for v in self._untrusted.values())
            out["placed"] = len(self._at)
            out["bytes"] = sum(len(e.blob) for e in self._roots.values()) + sum(
                len(b) for t in self._children.values() for v in t.values() for b in v.values()
            )
            return out
