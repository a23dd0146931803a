"""Which artifact ConfigMaps exist now, by name, and the uid each has: followed by a
metadata-only reflector (watched/kinds.ARTIFACT_CONFIGMAPS; handlers/on_delivery.py) on every
replica.

Two readers:
- admission (handlers/on_pod.py) mounts an artifact from its ConfigMap only while the one of that
  name is the object the operator made (the uid status recorded); otherwise the pod fetches
  the same artifact from the store, verified, instead of starting untuned;
- the reconcile (reconcile.py) makes a deleted or replaced one again (delivery.py).

Only existence and uid are kept, never content: a ConfigMap the operator made is immutable, so
its uid stands for the content verified when it was made, and one of another uid is not ours
whatever its labels say. Labels only select what is watched; a replacement without them is
simply absent here, which reads the same as deleted (never mounted).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from tunefleet.informers import view_parts
from tunefleet.runtime.heap import compacted

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class Seen:
    uid: str
    owner_uid: str  # the controller ownerReference's uid ("" without one)
    owner_name: str


class DeliveredConfigMaps:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[Key, Seen] = {}
        self._keys: dict[str, Key] = {}  # uid -> key (a relist's DELETED stubs)

    def follow(self, event: str | None, body: dict[str, Any]) -> Key | None:
        """Keep one watch event; returns (namespace, owning profile's name) to reconcile, or
        None when no profile claims it."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        uid = str(meta.get("uid") or "")
        ref = view_parts.controller_of(meta) or {}
        with self._lock:
            old = self._by_name.get(key)
            if event == "DELETED" or meta.get("deletionTimestamp"):
                if old is not None and (not uid or old.uid == uid):
                    del self._by_name[key]
                    self._keys.pop(old.uid, None)
                owner = old.owner_name if old is not None else str(ref.get("name") or "")
                return (key[0], owner) if owner else None
            if old is not None:
                self._keys.pop(old.uid, None)
            seen = Seen(uid, str(ref.get("uid") or ""), str(ref.get("name") or ""))
            self._by_name[key] = seen
            self._keys[uid] = key
        return (key[0], seen.owner_name) if seen.owner_name else None

    def uid_of(self, namespace: str, name: str) -> str:
        """The uid of the artifact ConfigMap of that name now; "" when there is none."""
        with self._lock:
            seen = self._by_name.get((namespace, name))
        return seen.uid if seen is not None else ""

    def known(self, kind: str, namespace: str | None) -> set[str]:
        with self._lock:
            return {u for u, k in self._keys.items() if namespace is None or k[0] == namespace}

    def stub(self, kind: str, uid: str) -> dict[str, Any]:
        with self._lock:
            key = self._keys.get(uid)
        if key is None:
            return {}
        return {"metadata": {"namespace": key[0], "name": key[1], "uid": uid}}

    def compact(self) -> None:
        with self._lock:
            self._by_name = compacted(self._by_name)
            self._keys = compacted(self._keys)

    def sizes(self) -> dict[str, int]:
        with self._lock:
            return {"artifactConfigMaps": len(self._by_name)}
