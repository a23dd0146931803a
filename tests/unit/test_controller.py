"""The controller's handling of reconcile outcomes, and the scan for pods the webhook missed."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.builders.wrappers import make_profile
from tests.support.fake_kube import FakeKube
from tunefleet import kube
from tunefleet.api.conditions import Reason
from tunefleet.api.profile_status import TuningProfileStatus
from tunefleet.config import Config
from tunefleet.reconciler.controller import Controller, Indexes
from tunefleet.reconciler.decide import REDELIVER_AFTER_S
from tunefleet.reconciler.memory import QUEUED_TTL
from tunefleet.reconciler.reconcile import ENDS, Outcome, requeue_after


def make(
    outcome: Exception | None,
    after: float | None = None,
    client: FakeKube | None = None,
) -> Controller:
    profiles = {("ml", "p"): make_profile().uid("u").obj()}
    indexes = Indexes(
        profile=profiles.get,
        profiles=lambda: list(profiles),
        jobs=lambda ns, uid: [],
        pods=lambda ns, uid: [],
    )

    def sync(*_: Any, **__: Any) -> Outcome:
        # As sync_profile: the project's errors come back in the Outcome, a bug raises.
        if isinstance(outcome, ENDS):
            return Outcome(TuningProfileStatus.from_status({}), after, outcome)
        if outcome is not None:
            raise outcome
        return Outcome(TuningProfileStatus.from_status({}), after)

    # Handed its reconcile, as the operator hands it sync_profile: nothing to patch.
    return Controller(client or FakeKube(), Config(), indexes, sync, workers=1)


def test_temporary_errors_back_off_and_success_resets() -> None:
    c = make(kube.Temporary("api down", delay=5))
    c.process(("ml", "p"))
    c.process(("ml", "p"))
    assert c.queue.failures(("ml", "p")) == 2
    assert c.queue.pending() == 1  # waiting for its backoff, not spinning


def test_permanent_errors_are_not_retried() -> None:
    c = make(kube.Permanent("bad spec"))
    c.process(("ml", "p"))
    assert c.queue.failures(("ml", "p")) == 0 and c.queue.pending() == 0


def test_a_bug_is_logged_and_retried_never_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = make(KeyError("oops"))
    c.process(("ml", "p"))
    assert c.queue.failures(("ml", "p")) == 1
    assert "reconcile failed" in caplog.text


def test_the_engine_requeues_after_the_delay_the_reconcile_asked_for() -> None:
    c = make(None, after=12.5)
    c.process(("ml", "p"))
    assert c.queue.pending() == 1 and c.queue.failures(("ml", "p")) == 0
    assert c.queue.get(timeout=0.05) is None  # not before its time
    c = make(None, after=None)
    c.process(("ml", "p"))
    assert c.queue.pending() == 0  # nothing asked: the next event or resync brings it


def test_requeue_after_is_decided_from_status_alone() -> None:
    def job(reason: str) -> dict[str, Any]:
        return {
            "gpuModel": "H100",
            "name": "j",
            "state": "Pending",
            "message": "",
            "reason": reason,
        }

    def degraded(reason: str) -> dict[str, Any]:
        return {
            "conditions": [
                {"type": "Degraded", "status": "True", "reason": reason, "message": "m",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]
        }  # fmt: skip

    def read(raw: dict[str, Any]) -> TuningProfileStatus:
        return TuningProfileStatus.from_status(raw)

    assert requeue_after(read({"jobs": [job(Reason.QUEUED)]})) == QUEUED_TTL
    assert requeue_after(read(degraded("DeliveryFailed"))) == REDELIVER_AFTER_S
    # Pods' events bring the next change.
    assert requeue_after(read(degraded("PodsStartedUntuned"))) is None
    assert requeue_after(read({"phase": "Ready", "jobs": [job("Completed")]})) is None


def test_a_deleted_profile_is_forgotten() -> None:
    c = make(None)
    c.memory.unadmitted[("ml", "gone")] = ["x"]
    c.process(("ml", "gone"))
    assert ("ml", "gone") not in c.memory.unadmitted


def test_our_own_status_echo_is_not_reconciled_again() -> None:
    c = make(None)
    written = {"observedGeneration": 2, "phase": "Ready"}
    c.memory.of("u").written_rv = "41"
    view = {"metadata": {"uid": "u", "generation": 2, "resourceVersion": "41"}, "status": written}
    assert c.wants(view) is False
    assert c.wants({**view, "metadata": {"uid": "u", "generation": 3, "resourceVersion": "42"}})
    assert c.wants({**view, "metadata": {"uid": "other", "resourceVersion": "41"}}) is True


def test_scan_counts_pods_without_the_admission_label() -> None:
    pods = [
        {"metadata": {"name": "a", "namespace": "ml", "labels": {"tunefleet.io/profile": "p"}}},
        {
            "metadata": {
                "name": "old",
                "namespace": "ml",
                "labels": {"tunefleet.io/profile": "p"},
                "annotations": {"tunefleet.io/status": "injected"},
            }
        },
        {
            "metadata": {
                "name": "done",
                "namespace": "ml",
                "labels": {"tunefleet.io/profile": "p"},
            },
            "status": {"phase": "Succeeded"},
        },
    ]
    seen: list[str] = []

    def list_pods(ns: str | None, selector: str) -> list[dict[str, Any]]:
        seen.append(selector)
        return pods

    c = make(None, client=FakeKube(intercept={"list_pods": list_pods}))
    assert c.scan_unadmitted() == {("ml", "p")}
    assert c.memory.unadmitted == {("ml", "p"): ["a"]}
    assert seen == ["tunefleet.io/profile,!tunefleet.io/admission"]
    assert c.scan_unadmitted() == set()  # unchanged: nothing to reconcile
