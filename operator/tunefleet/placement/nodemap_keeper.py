"""The node map keeper: which nodes have which GPU model, for pods that pick their artifact
where they land (contracts/nodemap.py says what the map is and who reads it).

Every replica watches the nodes of each GPU label key its profiles use, metadata only (labels,
no status) and selected by the key on the server, and keeps name -> model for those nodes
alone (about 100 bytes a node: 1 MiB at 10,000). The leader writes one ConfigMap per
(namespace, label key) for the namespaces with TuningProfiles, listing the nodes of the models
their profiles tune (builders/placement.py builds it):

- written only when what it lists changes: a node added, removed or relabelled among those
  models, a profile's models changed. Node status updates (a Node's most frequent change)
  change nothing here and cost no write;
- at most every MIN_INTERVAL_S per map: a burst of node changes (a scale-up) is one write;
  a change of its owners alone (profiles added to a namespace that has the map) at most
  every OWNERS_INTERVAL_S: ownership only decides when garbage collection may remove it, and
  a burst of 10,000 profiles over 100 namespaces would otherwise rewrite 100 maps every 2 s;
- owned by the namespace's profiles that use it, none its controller: garbage collection
  removes it with the last of them. One of that name that is not ours is left alone (and its
  namespace's pods then start untuned where the map would have told their model).

A pod mounts the map at start (the kubelet reads it then), so a node that joined after its
last write is not in it: the pod starts untuned and says so, and is never given a guess.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tunefleet import GROUP, KIND, kube, metrics, naming
from tunefleet.builders.placement import build_node_map
from tunefleet.contracts import nodemap
from tunefleet.kube import Kube

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, profile name)
Map = tuple[str, str]  # (namespace, GPU label key)
MIN_INTERVAL_S = 2.0
OWNERS_INTERVAL_S = 30.0
WATCH_TIMEOUT_S = 300
RETRY_S = 5.0
LOOP_S = 0.5


def profile_gpu(view: dict[str, Any]) -> tuple[str, list[str]] | None:
    """(label key, models) of a profile (a view), or None when it has none to map (being
    deleted, or a spec too broken to say). Read leniently: validation is reconcile's."""
    if (view.get("metadata") or {}).get("deletionTimestamp"):
        return None
    gpu = (view.get("spec") or {}).get("gpu") or {}
    key = gpu.get("labelKey") or naming.DEFAULT_LABEL_KEYS.get(str(gpu.get("vendor")))
    models = [m for m in gpu.get("models") or [] if isinstance(m, str) and naming.is_label_value(m)]
    if not isinstance(key, str) or not naming.is_qualified_name(key) or not models:
        return None
    return key, models


class NodeIndex:
    """name -> GPU model, per label key, of the nodes that have the key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, dict[str, str]] = {}
        self._synced: set[str] = set()

    @staticmethod
    def _model(key: str, obj: dict[str, Any]) -> tuple[str, str | None]:
        meta = obj.get("metadata") or {}
        value = (meta.get("labels") or {}).get(key)
        # Interned: thousands of nodes share a handful of model strings.
        return str(meta.get("name") or ""), sys.intern(str(value)) if value else None

    def load(self, key: str, items: list[dict[str, Any]]) -> set[str]:
        """A full list: replaces what was known. Returns the models whose nodes changed."""
        fresh: dict[str, str] = {}
        for obj in items:
            name, model = self._model(key, obj)
            if name and model:
                fresh[sys.intern(name)] = model
        with self._lock:
            old = self._by_key.get(key, {})
            self._by_key[key] = fresh
            self._synced.add(key)
        changed = {m for n, m in old.items() if fresh.get(n) != m}
        return changed | {m for n, m in fresh.items() if old.get(n) != m}

    def apply(self, key: str, kind: str, obj: dict[str, Any]) -> set[str]:
        """One watch event. Returns the models whose nodes changed (none for a status update)."""
        name, model = self._model(key, obj)
        if kind == "DELETED":
            model = None
        with self._lock:
            nodes = self._by_key.setdefault(key, {})
            old = nodes.get(name)
            if old == model:
                return set()
            if model is None:
                nodes.pop(name, None)
            else:
                nodes[sys.intern(name)] = model
        return {m for m in (old, model) if m}

    def forget(self, key: str) -> None:
        with self._lock:
            self._by_key.pop(key, None)
            self._synced.discard(key)

    def synced(self, key: str) -> bool:
        with self._lock:
            return key in self._synced

    def nodes(self, key: str, models: frozenset[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {m: [] for m in models}
        with self._lock:
            for name, model in self._by_key.get(key, {}).items():
                if model in out:
                    out[model].append(name)
        return out

    def size(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._by_key.values())


@dataclass(frozen=True)
class Want:
    models: frozenset[str]
    owners: tuple[tuple[str, str], ...]  # (profile name, uid), sorted


@dataclass
class _Watch:
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


def ours(cm: dict[str, Any], label_key: str) -> bool:
    """A node map this operator made: its labels and key, and owned by profiles only."""
    meta = cm.get("metadata") or {}
    labels = meta.get("labels") or {}
    return (
        labels.get(naming.MANAGED_KEY) == naming.MANAGED_VALUE
        and labels.get(naming.ROLE_LABEL) == nodemap.ROLE
        and (meta.get("annotations") or {}).get(nodemap.LABEL_KEY_ANNOTATION) == label_key
        and all(
            r.get("kind") == KIND and str(r.get("apiVersion") or "").startswith(f"{GROUP}/")
            for r in meta.get("ownerReferences") or []
        )
    )


def _content(cm: dict[str, Any]) -> str:
    """What a write would change: data, the node counts left out, the owners' uids."""
    meta = cm.get("metadata") or {}
    left = (meta.get("annotations") or {}).get(nodemap.LEFT_OUT_ANNOTATION)
    owners = sorted(str(r.get("uid")) for r in meta.get("ownerReferences") or [])
    return json.dumps([cm.get("data") or {}, left, owners], sort_keys=True)


class NodeMaps:
    """Keeps the node maps (see the module docstring). `profiles`/`profile` read the cache;
    maps are written only while `active` is set (this replica leads)."""

    def __init__(
        self,
        client: Kube,
        profiles: Callable[[], list[Key]],
        profile: Callable[[Key], dict[str, Any] | None],
        active: threading.Event,
        *,
        min_interval: float = MIN_INTERVAL_S,
        owners_interval: float = OWNERS_INTERVAL_S,
    ) -> None:
        self.client = client  # the process's one: the node watches and the maps' writes
        self._profiles, self._profile, self._active = profiles, profile, active
        self.min_interval, self.owners_interval = min_interval, owners_interval
        self.index = NodeIndex()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._namespaces: set[str] = set()  # to read again whole: recompute what they want
        self._keys: set[Key] = set()  # profiles whose spec changed (or that came or went)
        # What each profile of a namespace asks, as last read: (uid, (label key, models)). A
        # burst of 10,000 new profiles reads each once, not its whole namespace each time.
        self._members: dict[str, dict[str, tuple[str, tuple[str, list[str]]]]] = {}
        self._all = True  # recompute every namespace (startup, lead)
        self._want: dict[Map, Want] = {}
        self._dirty: dict[Map, float] = {}  # map -> not before (monotonic)
        self._urgent: set[Map] = set()  # dirty for more than its owners (nodes, models, new)
        self._last: dict[Map, float] = {}  # map -> last write attempt
        self._written: dict[Map, str] = {}  # map -> content last written or found (leader)
        self._reported: set[str] = set()  # uids of maps found not ours, said once
        self._retired: list[Map] = []  # maps no profile wants any more: removed if ours
        self._watches: dict[str, _Watch] = {}
        self._thread: threading.Thread | None = None

    # --- triggers ---------------------------------------------------------------------------

    def profile_changed(self, namespace: str, name: str | None = None) -> None:
        """A profile's spec changed, or it came or went (`name`); without a name, read the
        whole namespace again."""
        with self._lock:
            if name is None:
                self._namespaces.add(namespace)
            else:
                self._keys.add((namespace, name))

    def lead(self) -> None:
        """This replica leads now: check every map against what the API server holds."""
        with self._lock:
            self._all = True
            self._written.clear()
            for m in self._want:
                self._dirty[m] = 0.0
                self._urgent.add(m)

    def follow(self) -> None:
        with self._lock:
            self._written.clear()

    def nodes_changed(self, key: str, models: set[str]) -> None:
        if not models:
            return
        with self._lock:
            for m, want in self._want.items():
                if m[1] == key and want.models & models:
                    self._dirty[m] = 0.0  # due now, even if waiting for OWNERS_INTERVAL_S
                    self._urgent.add(m)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="node-maps", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        for w in self._watches.values():
            w.stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("node maps: a step failed; trying again")
            self._stop.wait(LOOP_S)

    # --- one step -------------------------------------------------------------------------

    def step(self, now: float | None = None) -> None:
        """Recompute what changed namespaces want, follow the label keys in use, and write
        the maps that are due (leader only)."""
        now = time.monotonic() if now is None else now
        self._recompute()
        self._follow_keys()
        if not self._active.is_set():
            return
        with self._lock:
            due = [m for m, at in self._dirty.items() if at <= now]
            retired, self._retired = self._retired, []
        for m in retired:
            self._retire(m)
        for m in due:
            if not self.index.synced(m[1]):
                continue  # not listed yet: an empty map would send every pod untuned
            last = self._last.get(m)
            with self._lock:
                interval = (
                    self.min_interval if m in self._urgent
                    else max(self.min_interval, self.owners_interval)
                )  # fmt: skip
            if last is not None and now - last < interval:
                with self._lock:
                    self._dirty[m] = last + interval
                continue
            with self._lock:
                # Taken before the write: a change during it marks the map again.
                self._dirty.pop(m, None)
                self._urgent.discard(m)
            self._last[m] = now
            try:
                self._write(m)
            except kube.Gone as e:
                # The namespace is going: nothing to write there, and retrying every few
                # seconds only fills the log until it is gone. A profile change there
                # wants the map again.
                log.debug(f"node map {m[0]}/{nodemap.config_map_name(m[1])}: {e}; dropped")
                with self._lock:
                    self._want.pop(m, None)
                    self._urgent.discard(m)
            except (kube.Temporary, kube.Conflict, kube.NotLeading) as e:
                log.info(f"node map {m[0]}/{nodemap.config_map_name(m[1])}: {e}; retrying")
                metrics.NODE_MAP_WRITES.labels("failed").inc()
                with self._lock:
                    self._dirty[m] = max(self._dirty.get(m, 0.0), now + RETRY_S)

    def _recompute(self) -> None:
        with self._lock:
            spaces, keys, everything = set(self._namespaces), set(self._keys), self._all
            self._namespaces.clear()
            self._keys.clear()
            self._all = False
        if not spaces and not keys and not everything:
            return
        if everything or spaces:
            if everything:
                self._members.clear()
            for ns in spaces:
                self._members[ns] = {}
            for key in self._profiles():
                if everything or key[0] in spaces:
                    self._read(key)
        for key in keys:
            if not everything and key[0] not in spaces:
                self._read(key)
        touched = set(self._members) if everything else spaces | {k[0] for k in keys}
        found: dict[Map, tuple[set[str], list[tuple[str, str]]]] = {}
        for ns in touched:
            for name, (uid, gpu) in (self._members.get(ns) or {}).items():
                models, owners = found.setdefault((ns, gpu[0]), (set(), []))
                models.update(gpu[1])
                owners.append((name, uid))
        with self._lock:
            gone = [m for m in self._want if (everything or m[0] in touched) and m not in found]
            for m in gone:
                # No profile there uses the key any more (a profile deleted takes its map
                # with it by garbage collection; one that changed its key does not).
                del self._want[m]
                self._dirty.pop(m, None)
                self._urgent.discard(m)
                self._retired.append(m)
            for m, (models, owners) in found.items():
                want = Want(frozenset(models), tuple(sorted(owners, key=lambda o: o[1])))
                old = self._want.get(m)
                if old != want:
                    self._want[m] = want
                    self._dirty.setdefault(m, 0.0)
                    if old is None or old.models != want.models:
                        self._dirty[m] = 0.0
                        self._urgent.add(m)

    def _read(self, key: Key) -> None:
        """What one profile asks now (its view unpacked), into its namespace's members."""
        view = self._profile(key)
        gpu = profile_gpu(view) if view is not None else None
        members = self._members.setdefault(key[0], {})
        if gpu is None or view is None:
            members.pop(key[1], None)
            if not members:
                del self._members[key[0]]
            return
        # Interned: 10,000 profiles name a handful of keys and models.
        asks = (sys.intern(gpu[0]), [sys.intern(m) for m in gpu[1]])
        members[key[1]] = (str((view.get("metadata") or {}).get("uid") or ""), asks)

    def wanted(self) -> dict[Map, Want]:
        with self._lock:
            return dict(self._want)

    def _follow_keys(self) -> None:
        with self._lock:
            keys = {m[1] for m in self._want}
        for key in keys - set(self._watches):
            w = _Watch()
            w.thread = threading.Thread(
                target=self._watch, args=(key, w.stop), name=f"nodes-{key}"[:15], daemon=True
            )
            self._watches[key] = w
            w.thread.start()
        for key in set(self._watches) - keys:
            self._watches.pop(key).stop.set()
            self.index.forget(key)

    def _watch(self, key: str, stop: threading.Event) -> None:
        """List, then watch from the list's version; list again when the version is too old
        (410) or anything fails."""
        while not stop.is_set() and not self._stop.is_set():
            try:
                items, rv = self.client.list_node_metadata(key)
                self.nodes_changed(key, self.index.load(key, items))
                while not stop.is_set():
                    rv = self._follow(key, rv, stop)
                    if not rv:
                        break  # 410: list again
            except Exception as e:
                log.info(f"watching nodes with label {key}: {e}; listing again in {RETRY_S:.0f}s")
                stop.wait(RETRY_S)

    def _follow(self, key: str, rv: str, stop: threading.Event) -> str:
        """One watch, until the server ends it; returns the version to go on from ("" when
        the version expired)."""
        for event in self.client.watch_node_metadata(key, rv, WATCH_TIMEOUT_S):
            kind, obj = str(event.get("type") or ""), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    return ""
                raise RuntimeError(f"watch error: {obj.get('message') or obj}")
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            if kind != "BOOKMARK":
                self.nodes_changed(key, self.index.apply(key, kind, obj))
            if stop.is_set():
                break
        return rv

    # --- writes ---------------------------------------------------------------------------

    def _write(self, m: Map) -> None:
        ns, key = m
        with self._lock:
            want = self._want.get(m)
        if want is None:
            return
        cm = build_node_map(
            namespace=ns,
            label_key=key,
            nodes=self.index.nodes(key, want.models),
            owners=list(want.owners),
        )
        content = _content(cm)
        if self._written.get(m) == content:
            return
        name = cm["metadata"]["name"]
        there = self.client.read("ConfigMap", ns, name)
        if there is None:
            there = self.client.create_config_map(cm)
            if there is None:  # made meanwhile: judged on the next step
                raise kube.Conflict(f"ConfigMap {ns}/{name} appeared as it was made")
            metrics.NODE_MAP_WRITES.labels("written").inc()
        elif not ours(there, key):
            self._not_ours(there)
            content = "not ours"
        elif _content(there) != content:
            old = there.get("data") or {}
            data: dict[str, Any] = {**{k: None for k in old if k not in cm["data"]}, **cm["data"]}
            meta = cm["metadata"]
            left = meta["annotations"].get(nodemap.LEFT_OUT_ANNOTATION)
            patch = {
                "metadata": {
                    "labels": meta["labels"],
                    "annotations": {**meta["annotations"], nodemap.LEFT_OUT_ANNOTATION: left},
                    "ownerReferences": meta["ownerReferences"],
                },
                "data": data,
            }
            if (
                self.client.patch_config_map(ns, name, there["metadata"]["resourceVersion"], patch)
                is None
            ):
                raise kube.Conflict(f"ConfigMap {ns}/{name} went away as it was written")
            metrics.NODE_MAP_WRITES.labels("written").inc()
        left_out = cm["metadata"]["annotations"].get(nodemap.LEFT_OUT_ANNOTATION)
        if left_out and content != "not ours":
            log.warning(
                f"node map {ns}/{name}: {left_out} nodes did not fit a ConfigMap and are left "
                "out: pods that land on them and pick their model at the node start untuned"
            )
        self._written[m] = content

    def _retire(self, m: Map) -> None:
        ns, key = m
        name = nodemap.config_map_name(key)
        with self._lock:
            if m in self._want:
                return  # wanted again meanwhile
        self._written.pop(m, None)
        self._last.pop(m, None)
        try:
            there = self.client.read("ConfigMap", ns, name)
            if there is not None and ours(there, key):
                self.client.delete_owned("ConfigMap", ns, name, there["metadata"]["uid"])
        except (kube.Temporary, kube.NotLeading, kube.Gone) as e:
            log.info(f"node map {ns}/{name} no profile uses: not removed ({e})")

    def _not_ours(self, cm: dict[str, Any]) -> None:
        meta = cm.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if uid in self._reported:
            return
        self._reported.add(uid)
        metrics.UNTRUSTED_OBJECTS.labels("configmaps").inc()
        metrics.NODE_MAP_WRITES.labels("not_ours").inc()
        log.warning(
            f"ConfigMap {meta.get('namespace')}/{meta.get('name')} has the node map's name but "
            "was not made by tunefleet: it is left alone, and pods there that pick their GPU "
            "model at the node start untuned. Delete it so tunefleet can make its own."
        )
