"""The controller's handling of reconcile outcomes, and the scan for pods the webhook missed."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from tunefleet import controller as controller_mod
from tunefleet import kube
from tunefleet.config import Config
from tunefleet.controller import Controller, Indexes


def make(monkeypatch: pytest.MonkeyPatch, outcome: Exception | None) -> Controller:
    profiles = {("ml", "p"): {"metadata": {"name": "p", "namespace": "ml", "uid": "u"}}}
    indexes = Indexes(
        profile=profiles.get,
        profiles=lambda: list(profiles),
        jobs=lambda ns, uid: [],
        pods=lambda ns, uid: [],
    )

    def sync(*_: Any, **__: Any) -> dict[str, Any]:
        if outcome is not None:
            raise outcome
        return {}

    monkeypatch.setattr(controller_mod, "sync_profile", sync)
    return Controller(Config(), indexes, workers=1)


def test_temporary_errors_back_off_and_success_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    c = make(monkeypatch, kopf.TemporaryError("api down", delay=5))
    c.process(("ml", "p"))
    c.process(("ml", "p"))
    assert c.queue.failures(("ml", "p")) == 2
    assert c.queue.pending() == 1  # waiting for its backoff, not spinning


def test_permanent_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    c = make(monkeypatch, kopf.PermanentError("bad spec"))
    c.process(("ml", "p"))
    assert c.queue.failures(("ml", "p")) == 0 and c.queue.pending() == 0


def test_a_bug_is_logged_and_retried_never_fatal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    c = make(monkeypatch, KeyError("oops"))
    c.process(("ml", "p"))
    assert c.queue.failures(("ml", "p")) == 1
    assert "reconcile failed" in caplog.text


def test_a_deleted_profile_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    c = make(monkeypatch, None)
    c.memory.unadmitted[("ml", "gone")] = ["x"]
    c.process(("ml", "gone"))
    assert ("ml", "gone") not in c.memory.unadmitted


def test_our_own_status_echo_is_not_reconciled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    c = make(monkeypatch, None)
    written = {"observedGeneration": 2, "phase": "Ready"}
    c.memory.of("u").written_rv = "41"
    view = {"metadata": {"uid": "u", "generation": 2, "resourceVersion": "41"}, "status": written}
    assert c.wants(view) is False
    assert c.wants({**view, "metadata": {"uid": "u", "generation": 3, "resourceVersion": "42"}})
    assert c.wants({**view, "metadata": {"uid": "other", "resourceVersion": "41"}}) is True


def test_scan_counts_pods_without_the_admission_label(monkeypatch: pytest.MonkeyPatch) -> None:
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

    monkeypatch.setattr(kube, "list_pods", list_pods)
    c = make(monkeypatch, None)
    assert c.scan_unadmitted() == {("ml", "p")}
    assert c.memory.unadmitted == {("ml", "p"): ["a"]}
    assert seen == ["tunefleet.io/profile,!tunefleet.io/admission"]
    assert c.scan_unadmitted() == set()  # unchanged: nothing to reconcile
