"""What a TuningProfile event sets in motion: a status write (most events of a burst) must
not make the node maps recompute its namespace; a new profile, a spec change, a deletion do."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.builders.profiles import CFG
from testbed.builders.wrappers import make_profile
from tests.support.fake_kube import FakeKube
from tunefleet.handlers import on_profile
from tunefleet.handlers.startup import Operator


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
def wired() -> tuple[Operator, _Maps, _Controller]:
    """An operator handed stand-ins for the node maps and the controller (its own cache)."""
    maps, controller = _Maps(), _Controller()
    operator = Operator(FakeKube(), CFG, controller=controller, node_maps=maps)  # type: ignore[arg-type]
    return operator, maps, controller


def test_status_writes_do_not_recompute_node_maps(
    wired: tuple[Operator, _Maps, _Controller],
) -> None:
    operator, maps, controller = wired
    on_profile.tuningprofile_event(operator, "ADDED", PROFILE.obj())
    assert maps.changed == ["ns"]
    for i in range(5):
        on_profile.tuningprofile_event(
            operator, "MODIFIED", PROFILE.status(phase=f"step {i}").obj()
        )
    assert maps.changed == ["ns"], "status writes alone made the node maps recompute"
    assert len(controller.queued) == 6  # every event still reaches the reconciler


def test_spec_change_new_object_and_deletion_recompute(
    wired: tuple[Operator, _Maps, _Controller],
) -> None:
    operator, maps, _ = wired
    edited = PROFILE.generation(2).resource_version("12")
    renewed = PROFILE.uid("u2")
    on_profile.tuningprofile_event(operator, "ADDED", PROFILE.obj())
    on_profile.tuningprofile_event(operator, "MODIFIED", edited.obj())  # spec edited
    on_profile.tuningprofile_event(operator, "MODIFIED", renewed.obj())  # same name, new
    on_profile.tuningprofile_event(
        operator, "MODIFIED", renewed.deleting("2026-12-01T00:00:00Z").obj()
    )
    on_profile.tuningprofile_event(operator, "DELETED", renewed.obj())
    assert maps.changed == ["ns"] * 5
