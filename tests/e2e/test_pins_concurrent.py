"""Pins under concurrent writers, on the real API server: every pin write (kubectl tunefleet
rollback, unpin, retune: plugin/cluster.py's update_profile) carries the resourceVersion it was
computed from, and a write that lost the race is read and changed again. Before, each wrote the
whole pin annotation from its own read, and of two on-call engineers pinning two GPU models at
the same moment one lost silently.

The chart's operator runs (`in_cluster`: the release installs the CRD these profiles need) and
writes their status, which moves the resourceVersion too; it writes no annotation, so every pin
a writer was told it wrote must be there at the end. The writers are testbed/pins.py's, which
the `trust` benchmark runs too (docs/trust.md quotes its figures).
"""

from __future__ import annotations

from typing import Any

import pytest

from testbed.builders.fleet import profile_doc
from testbed.operator import InCluster
from testbed.pins import race, two_at_once
from tests.support.kube import apply

pytestmark = pytest.mark.e2e


def test_a_hundred_concurrent_pin_writes_lose_none(
    cluster: Any, in_cluster: InCluster, namespace: str
) -> None:
    apply(cluster, namespace, profile_doc("pinned"))
    got = race(cluster, namespace, 100)
    assert got.kept == set(got.models)
    print(
        f"100 concurrent pin writes: {len(got.kept)} of 100 pins kept in {got.seconds:.2f}s, "
        f"{sum(got.rounds) - len(got.rounds)} writes refused as stale and redone "
        f"(most rounds for one writer: {max(got.rounds)})"
    )


def test_two_rollbacks_and_a_rollback_with_an_unpin_at_once_many_times(
    cluster: Any, in_cluster: InCluster, namespace: str
) -> None:
    apply(cluster, namespace, profile_doc("pinned"))
    for step, (want, got) in enumerate(two_at_once(cluster, namespace, 20)):
        assert got == want, f"round {step // 2}"
