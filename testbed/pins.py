"""Pins under concurrent writers, on the real API server (tests/e2e/test_pins_concurrent.py and
the `trust` benchmark, bench/bench_trust.py): every pin write goes through the kubectl
plugin's update_profile (plugin/cluster.py), which carries the resourceVersion it read and
reads and changes again when a write lost the race.

The writers run against a profile named "pinned" in the namespace; each has a client of its
own, as each on-call engineer's kubectl is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunefleet.contracts import pin as pins
from tunefleet.plugin import cluster as cluster_mod

AT = "2026-12-04T00:00:00Z"
SHA = "a" * 64
PROFILE = "pinned"


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

    assert kube.update_profile(namespace, PROFILE, change) is not None
    return rounds


def unpin(kube: cluster_mod.Cluster, namespace: str, model: str) -> None:
    def change(profile: dict[str, Any]) -> tuple[None, dict[str, Any] | None]:
        current = pins.read((profile.get("metadata") or {}).get("annotations"))
        if model not in current:
            return None, None
        return None, pins.patch(pins.unpinned(current, model))

    assert kube.update_profile(namespace, PROFILE, change) is not None


def pinned_models(cluster: Any, namespace: str) -> set[str]:
    profile = writer(cluster, namespace).profile(namespace, PROFILE)
    assert profile is not None
    return set(pins.read(profile["metadata"].get("annotations")))


@dataclass(frozen=True)
class Race:
    """`writers` clients pinning one GPU model each at the same moment: the pins there after,
    the seconds it took, and the rounds each writer's update took (1: its first write won)."""

    models: list[str]
    kept: set[str]
    seconds: float
    rounds: list[int]


def race(cluster: Any, namespace: str, writers: int = 100) -> Race:
    """`writers` concurrent pin writes on the profile "pinned" (applied beforehand)."""
    models = [f"GPU-{i:03d}" for i in range(writers)]
    clients = [writer(cluster, namespace) for _ in models]
    start = time.monotonic()
    rounds = together(
        [lambda k=k, m=m: pin(k, namespace, m) for k, m in zip(clients, models, strict=True)]
    )
    took = time.monotonic() - start
    return Race(models, pinned_models(cluster, namespace), took, rounds)


def two_at_once(cluster: Any, namespace: str, rounds: int = 20) -> list[tuple[set[str], set[str]]]:
    """Each round: two engineers roll back two GPU models at the same moment (both pins stay),
    then one unpins H100 while the other pins MI300X (H200 and MI300X stay). The pins each
    step should leave and those it left, two per round."""
    a, b = writer(cluster, namespace), writer(cluster, namespace)
    seen: list[tuple[set[str], set[str]]] = []
    for _ in range(rounds):
        unpin(a, namespace, "H100")
        unpin(a, namespace, "H200")
        together([lambda: pin(a, namespace, "H100"), lambda: pin(b, namespace, "H200")])
        seen.append(({"H100", "H200"}, pinned_models(cluster, namespace)))
        together([lambda: unpin(a, namespace, "H100"), lambda: pin(b, namespace, "MI300X")])
        seen.append(({"H200", "MI300X"}, pinned_models(cluster, namespace)))
        unpin(a, namespace, "MI300X")
    return seen
