"""What a TuningProfile event sets in motion: a status write (most events of a burst) must
not make the node maps recompute its namespace; a new profile, a spec change, a deletion do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tunefleet.handlers import startup, tuningprofile


class _Maps:
    def __init__(self) -> None:
        self.changed: list[str] = []

    def profile_changed(self, namespace: str) -> None:
        self.changed.append(namespace)


class _Controller:
    def __init__(self) -> None:
        self.queued: list[tuple[str, str]] = []

    def wants(self, view: dict[str, Any]) -> bool:
        return True

    def enqueue(self, key: tuple[str, str]) -> None:
        self.queued.append(key)

    def forget(self, key: tuple[str, str], uid: str | None) -> None:
        pass


def _profile(
    generation: int, status: dict[str, Any], uid: str = "u1", **meta: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "tunefleet.io/v1alpha1",
        "kind": "TuningProfile",
        "metadata": {"name": "p", "namespace": "ns", "uid": uid, "generation": generation,
                     "resourceVersion": str(10 + generation), **meta},
        "spec": {"gpu": {"vendor": "nvidia", "models": ["H100"]}},
        "status": status,
    }  # fmt: skip


@pytest.fixture
def wired(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[_Maps, _Controller]]:
    maps, controller = _Maps(), _Controller()
    monkeypatch.setattr(startup.OPERATOR, "node_maps", maps)
    monkeypatch.setattr(startup.OPERATOR, "_controller", controller)
    yield maps, controller
    startup.OPERATOR.cache.drop_profile(("ns", "p"))


def test_status_writes_do_not_recompute_node_maps(wired: tuple[_Maps, _Controller]) -> None:
    maps, controller = wired
    tuningprofile.tuningprofile_event("ADDED", _profile(1, {}))
    assert maps.changed == ["ns"]
    for i in range(5):
        tuningprofile.tuningprofile_event("MODIFIED", _profile(1, {"phase": f"step {i}"}))
    assert maps.changed == ["ns"], "status writes alone made the node maps recompute"
    assert len(controller.queued) == 6  # every event still reaches the reconciler


def test_spec_change_new_object_and_deletion_recompute(wired: tuple[_Maps, _Controller]) -> None:
    maps, _ = wired
    tuningprofile.tuningprofile_event("ADDED", _profile(1, {}))
    tuningprofile.tuningprofile_event("MODIFIED", _profile(2, {}))  # spec edited
    tuningprofile.tuningprofile_event("MODIFIED", _profile(1, {}, uid="u2"))  # same name, new
    tuningprofile.tuningprofile_event(
        "MODIFIED", _profile(1, {}, uid="u2", deletionTimestamp="2026-12-01T00:00:00Z")
    )
    tuningprofile.tuningprofile_event("DELETED", _profile(1, {}, uid="u2"))
    assert maps.changed == ["ns"] * 5
