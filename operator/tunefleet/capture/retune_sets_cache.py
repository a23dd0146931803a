"""The operator's view of capture stores and retune sets (capture/retune_sets.py), by profile uid.

Filled by a reflector (runtime/reflector.py: listed before the reconciler runs, as a
retune's revision depends on its set), then kept current by its watch (handlers/on_capture.py).
Every replica keeps it: the endpoint reads a store here to skip writes that would add nothing,
the leader's reconcile reads it instead of the API server. A ConfigMap that carries our
labels without being owned by the profile it names parses to nothing here and is ignored.
"""

from __future__ import annotations

import threading
from typing import Any

from tunefleet import naming
from tunefleet.capture.retune_sets import (
    RetuneSet,
    StoreView,
    parse_retune,
    parse_store,
)

Key = tuple[str, str]  # (namespace, name)


class CaptureCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[Key, StoreView] = {}
        self._retunes: dict[Key, RetuneSet] = {}
        self._uids: dict[Key, str] = {}  # what is kept, by ConfigMap uid (for `known`)

    def follow(self, event: str | None, body: dict[str, Any]) -> str | None:
        """Keep one watch event; returns the profile uid it concerns (None: nothing kept)."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        role = (meta.get("labels") or {}).get(naming.ROLE_LABEL)
        with self._lock:
            return self._follow(event, body, meta, key, role)

    def _follow(
        self, event: str | None, body: dict[str, Any], meta: dict[str, Any], key: Key, role: Any
    ) -> str | None:
        self._uids.pop(key, None)
        found = self._keep(event, body, meta, key, role)
        if key in self._stores or key in self._retunes:
            self._uids[key] = str(meta.get("uid") or "")
        return found

    def _keep(
        self, event: str | None, body: dict[str, Any], meta: dict[str, Any], key: Key, role: Any
    ) -> str | None:
        if event == "DELETED" or meta.get("deletionTimestamp"):
            old = self._stores.pop(key, None) or self._retunes.pop(key, None)
            return (
                old.key.profile_uid
                if isinstance(old, StoreView)
                else (old.profile_uid if old is not None else None)
            )
        if role == naming.ROLE_CAPTURE:
            view = parse_store(body)
            if view is None:
                self._stores.pop(key, None)
                return None
            self._stores[key] = view
            return view.key.profile_uid
        if role == naming.ROLE_RETUNE:
            found = parse_retune(body)
            if found is None:
                self._retunes.pop(key, None)
                return None
            self._retunes[key] = found
            return found.profile_uid
        return None

    def known(self, kind: str, namespace: str | None) -> set[str]:
        """The uids of the ConfigMaps kept (in this namespace, or all): a reflector's relist
        hands back as DELETED those it no longer returns."""
        with self._lock:
            return {u for k, u in self._uids.items() if namespace is None or k[0] == namespace}

    def stub(self, kind: str, uid: str) -> dict[str, Any]:
        with self._lock:
            key = next((k for k, u in self._uids.items() if u == uid), None)
        if key is None:
            return {}
        return {"metadata": {"namespace": key[0], "name": key[1], "uid": uid}}

    def store(self, namespace: str, name: str) -> StoreView | None:
        with self._lock:
            return self._stores.get((namespace, name))

    def stores(self, profile_uid: str) -> list[StoreView]:
        with self._lock:
            return [v for v in self._stores.values() if v.key.profile_uid == profile_uid]

    def retunes(self, profile_uid: str) -> list[RetuneSet]:
        with self._lock:
            return [r for r in self._retunes.values() if r.profile_uid == profile_uid]

    def sizes(self) -> dict[str, int]:
        with self._lock:
            return {"stores": len(self._stores), "retunes": len(self._retunes)}
