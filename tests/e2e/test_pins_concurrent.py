"""Pins under concurrent writers, on the real API server: every pin write (kubectl tunefleet
rollback, unpin, retune: plugin/cluster.py's update_profile) carries the resourceVersion it was
computed from, and a write that lost the race is read and changed again. Before, each wrote the
whole pin annotation from its own read, and of two on-call engineers pinning two GPU models at
the same moment one lost silently.

The chart's operator runs (`in_cluster`: the release installs the CRD these profiles need) and
writes their status, which moves the resourceVersion too; it writes no annotation, so every pin
a writer was told it wrote must be there at the end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from testbed.builders.fleet import profile_doc
from testbed.operator import InCluster
from tests.support.kube import apply
from tunefleet.contracts import pin as pins
from tunefleet.plugin import cluster as cluster_mod

pytestmark = pytest.mark.e2e

AT = "2026-12-04T00:00:00Z"
SHA = "a" * 64


def together(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run every job in its own thread, released at one barrier; their results, in order."""
    gate = threading.Barrier(len(jobs))
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(i: int, job: Callable[[], Any]) -> None:
        gate.wait()
        try:
            results[i] = job()
        except BaseException as e:  # reported below, with the others
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    return results


def writer(cluster: Any, namespace: str) -> cluster_mod.Cluster:
    """A client of its own, as each engineer's kubectl is."""
    return cluster_mod.connect(cluster.kubeconfig, None, namespace)


def pin(kube: cluster_mod.Cluster, namespace: str, model: str) -> int:
    """Pin `model` as rollback does (the current pins plus this one); the rounds it took."""
    rounds = 0

    def change(profile: dict[str, Any]) -> tuple[None, dict[str, Any]]:
        nonlocal rounds
        rounds += 1
        current = pins.read((profile.get("metadata") or {}).get("annotations"))
        return None, pins.patch(pins.pinned(current, pins.Pin(model, SHA, "e2e", AT)))

    assert kube.update_profile(namespace, "pinned", change) is not None
    return rounds


def unpin(kube: cluster_mod.Cluster, namespace: str, model: str) -> None:
    def change(profile: dict[str, Any]) -> tuple[None, dict[str, Any] | None]:
        current = pins.read((profile.get("metadata") or {}).get("annotations"))
        if model not in current:
            return None, None
        return None, pins.patch(pins.unpinned(current, model))

    assert kube.update_profile(namespace, "pinned", change) is not None


def pinned_models(cluster: Any, namespace: str) -> set[str]:
    profile = writer(cluster, namespace).profile(namespace, "pinned")
    assert profile is not None
    return set(pins.read(profile["metadata"].get("annotations")))


def test_a_hundred_concurrent_pin_writes_lose_none(
    cluster: Any, in_cluster: InCluster, namespace: str
) -> None:
    apply(cluster, namespace, profile_doc("pinned"))
    models = [f"GPU-{i:03d}" for i in range(100)]
    clients = [writer(cluster, namespace) for _ in models]
    start = time.monotonic()
    rounds = together(
        [lambda k=k, m=m: pin(k, namespace, m) for k, m in zip(clients, models, strict=True)]
    )
    took = time.monotonic() - start
    assert pinned_models(cluster, namespace) == set(models)
    print(
        f"100 concurrent pin writes: 100 of 100 pins kept in {took:.2f}s, "
        f"{sum(rounds) - len(rounds)} writes refused as stale and redone "
        f"(most rounds for one writer: {max(rounds)})"
    )


def test_two_rollbacks_and_a_rollback_with_an_unpin_at_once_many_times(
    cluster: Any, in_cluster: InCluster, namespace: str
) -> None:
    apply(cluster, namespace, profile_doc("pinned"))
    a, b = writer(cluster, namespace), writer(cluster, namespace)
    for round_ in range(20):
        unpin(a, namespace, "H100")
        unpin(a, namespace, "H200")
        # Two engineers roll back two GPU models at the same moment: both pins stay.
        together([lambda: pin(a, namespace, "H100"), lambda: pin(b, namespace, "H200")])
        assert pinned_models(cluster, namespace) == {"H100", "H200"}, f"round {round_}"
        # One unpins H100 while the other pins MI300X: H200 and MI300X stay, H100 goes.
        together([lambda: unpin(a, namespace, "H100"), lambda: pin(b, namespace, "MI300X")])
        assert pinned_models(cluster, namespace) == {"H200", "MI300X"}, f"round {round_}"
        unpin(a, namespace, "MI300X")
