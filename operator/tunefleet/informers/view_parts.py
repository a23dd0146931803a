"""Pieces every view of a watched object is made of (the domain's views: watched/views.py).

A view is a small plain dict taken from a watched body: only the fields the operator reads, so
the cache holds little for each object over the operator's lifetime.

Who controls an object is read from its controller ownerReference, never from its labels:
anyone who may create a Job or a pod can copy another controller's labels; a controller
reference the API server accepted in the same namespace is what garbage collection goes by.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def pick(d: Mapping[str, Any] | None, *keys: str) -> dict[str, Any]:
    """The keys of d that are set (None counts as unset)."""
    d = d or {}
    return {k: d[k] for k in keys if d.get(k) is not None}


def controller_of(meta: Mapping[str, Any]) -> dict[str, str] | None:
    """The object's controller ownerReference: {apiVersion, kind, uid, name}, or None."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return {k: str(ref.get(k) or "") for k in ("apiVersion", "kind", "uid", "name")}
    return None


def controller_uid(meta: Mapping[str, Any], kind: str, api_version: str) -> str | None:
    """The uid of the controller of this object when it is a `kind` of `api_version` (one that
    ends in "/" names a group: any of its versions), or None."""
    ref = controller_of(meta)
    if ref is None or ref["kind"] != kind:
        return None
    if api_version.endswith("/"):
        matches = ref["apiVersion"].startswith(api_version)
    else:
        matches = ref["apiVersion"] == api_version
    return (ref["uid"] or None) if matches else None
