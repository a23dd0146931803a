"""`FakeApi`: a recording stand-in for tunefleet.kube (create, patch, delete, list, status
writes, Events), installed with monkeypatch, for unit tests of the reconcile path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tunefleet import kube


class FakeApi:
    """Records calls; `existing` names answer as the API server does to a create of an object
    that is there (ours: None; `foreign`: someone else's, NotOurs)."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        existing: set[str] | None = None,
        foreign: set[str] | None = None,
    ):
        self.existing = set(existing or ())
        self.foreign = set(foreign or ())
        self.created: list[tuple[str, str]] = []
        self.patches: list[dict[str, Any]] = []
        self.owned_patches: list[tuple[str, str, dict[str, Any]]] = []
        self.deleted: list[tuple[str, str]] = []
        self.events: list[tuple[str, str]] = []
        self.fail_job_with: Exception | None = None
        self.conflict = False
        # What a list answers, by kind ("configmaps", "pods"), and the lists made.
        self.listed: dict[str, list[dict[str, Any]]] = {}
        self.lists: list[tuple[str, str]] = []
        monkeypatch.setattr(kube, "list_all", self.list_all)
        monkeypatch.setattr(kube, "create_owned", self.create_owned)
        monkeypatch.setattr(kube, "replace_profile_status", self.replace_status)
        monkeypatch.setattr(kube, "patch_owned", self.patch_owned)
        monkeypatch.setattr(kube, "delete_owned", self.delete_owned)
        monkeypatch.setattr(kube, "read", lambda kind, ns, name: None)
        monkeypatch.setattr(kube, "post_event_soon", self.event)
        monkeypatch.setattr(kube, "pod_events", lambda ns, name: [])
        self.job_events: list[dict[str, Any]] = []
        monkeypatch.setattr(kube, "job_events", lambda ns, name: self.job_events)

    def create_owned(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        if obj["kind"] == "Job" and self.fail_job_with is not None:
            raise self.fail_job_with
        name = obj["metadata"]["name"]
        if name in self.foreign:
            raise kube.NotOurs(
                f"{obj['kind']} ml/{name} exists but is not controlled by it: it is not used; "
                "delete it"
            )
        if (obj["kind"], name) in {(k, n) for k, n in self.created} or name in self.existing:
            return None
        self.created.append((obj["kind"], name))
        return {**obj, "metadata": {**obj["metadata"], "uid": f"juid-{name}"}}  # as jobs_for

    def replace_status(self, ns: str, name: str, rv: str, status: dict[str, Any]) -> str:
        if self.conflict:
            raise kube.Conflict("changed")
        self.patches.append(status)
        return f"rv-{len(self.patches)}"

    def patch_owned(self, kind: str, ns: str, name: str, owner: str, patch: dict[str, Any]) -> bool:
        self.owned_patches.append((kind, name, patch))
        return True

    def delete_owned(self, kind: str, ns: str, name: str, uid: str) -> None:
        self.deleted.append((kind, name))

    def list_all(
        self, kind: str, label_selector: str = "", namespace: str | None = None
    ) -> Iterator[dict[str, Any]]:
        self.lists.append((kind, label_selector))
        yield from self.listed.get(kind, [])

    def event(self, ref: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((reason, message))
