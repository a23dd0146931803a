"""What a TuningProfile event sets in motion: a status write (most events of a burst) must
not make the node maps recompute its namespace; a new profile, a spec change, a deletion do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.wrappers import make_profile
from tunefleet.handlers import startup, tuningprofile


class _Maps:
    def __init__(self) -> None:
        self.changed: list[str] = []

    def profile_changed(self, namespace: str, name: str) -> None:
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


# Profile ns/p (uid u1) at generation 1, as its events hand it over.
PROFILE = (
    make_profile("p", "ns")
    .uid("u1")
    .generation(1)
    .resource_version("11")
    .spec_is({})
    .gpu("nvidia", "H100")
    .status()
)


@pytest.fixture
def wired(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[_Maps, _Controller]]:
    maps, controller = _Maps(), _Controller()
    monkeypatch.setattr(startup.OPERATOR, "node_maps", maps)
    monkeypatch.setattr(startup.OPERATOR, "_controller", controller)
    yield maps, controller
    startup.OPERATOR.cache.drop_profile(("ns", "p"))


def test_status_writes_do_not_recompute_node_maps(wired: tuple[_Maps, _Controller]) -> None:
    maps, controller = wired
    tuningprofile.tuningprofile_event("ADDED", PROFILE.obj())
    assert maps.changed == ["ns"]
    for i in range(5):
        tuningprofile.tuningprofile_event("MODIFIED", PROFILE.status(phase=f"step {i}").obj())
    assert maps.changed == ["ns"], "status writes alone made the node maps recompute"
    assert len(controller.queued) == 6  # every event still reaches the reconciler


def test_spec_change_new_object_and_deletion_recompute(wired: tuple[_Maps, _Controller]) -> None:
    maps, _ = wired
    edited = PROFILE.generation(2).resource_version("12")
    renewed = PROFILE.uid("u2")
    tuningprofile.tuningprofile_event("ADDED", PROFILE.obj())
    tuningprofile.tuningprofile_event("MODIFIED", edited.obj())  # spec edited
    tuningprofile.tuningprofile_event("MODIFIED", renewed.obj())  # same name, new
    tuningprofile.tuningprofile_event("MODIFIED", renewed.deleting("2026-12-01T00:00:00Z").obj())
    tuningprofile.tuningprofile_event("DELETED", renewed.obj())
    assert maps.changed == ["ns"] * 5
