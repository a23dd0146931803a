"""Two of docs/trust.md's cases measured on the local cluster, with the chart's operator on
the real node (the release installs the CRD; its replicas write status and admit pods):

(a) pins under concurrent writers (testbed/pins.py, as tests/e2e/test_pins_concurrent.py):
    `writers` clients pin one GPU model each at the same moment through the kubectl plugin's
    update_profile: the pins kept, the seconds, the writes refused as stale and redone; then
    20 rounds of two engineers at once (two rollbacks; a rollback and an unpin): writes lost.
(b) admission with 3 image-volume models behind a registry answering every request 2 s late
    (testbed/oci_volumes.py, as tests/e2e/test_oci.py's 50-pod test): the operator's replicas
    restarted, then `pods` pods at once: pods admitted with a decision, the burst's seconds,
    pods that mounted the volume at once, registry requests per digest during the burst, the
    webhook's timeout; then one pod per model once the checks are in, which mount.

    python -m bench trust
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.results import progress
from testbed.builders.fleet import profile_doc
from testbed.cluster import Cluster, S3Settings, ensure_images
from testbed.oci_volumes import admit_behind_slow_registry
from testbed.operator import InCluster, drop_namespace, install_in_cluster
from testbed.pins import race, two_at_once
from testbed.registry import Registry

ROUNDS = 20  # two-at-once rounds (each: two rollbacks, then a rollback and an unpin)
DELAY_S = 2.0  # the slowed registry's delay on every request
PINS_NOTE = (
    "the chart's operator on the real node writes the profile's status meanwhile (moving its "
    "resourceVersion); each writer its own client; times from the barrier's release"
)
ADMISSION_NOTE = (
    "3 signed oci:// profiles delivered as image volumes, their registry behind a TLS proxy "
    "holding every request 2 s; the operator's replicas restarted before the burst (no verdict "
    "remembered); pods created by 5 kubectl calls side by side, never scheduled"
)


def _namespace(cluster: Cluster, prefix: str) -> str:
    ns = f"bench-{prefix}-{int(time.time())}"
    cluster.kubectl("create", "namespace", ns)
    return ns


def _pinned_profile(cluster: Cluster, prefix: str) -> str:
    """A namespace of its own with the profile "pinned", no pin on it: its name."""
    ns = _namespace(cluster, prefix)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(profile_doc("pinned")))
    return ns


def pins(cluster: Cluster, writers: int) -> dict[str, Any]:
    # Each part on a profile of its own (as the e2e's two tests): the race's pins left on the
    # profile would count as lost in every two-at-once step.
    ns = _pinned_profile(cluster, "pins")
    try:
        progress("trust", f"pins: {writers} writers at once")
        got = race(cluster, ns, writers)
    finally:
        drop_namespace(cluster, ns)
    ns = _pinned_profile(cluster, "pins-two")
    try:
        progress("trust", f"pins: {ROUNDS} rounds of two at once")
        steps = two_at_once(cluster, ns, ROUNDS)
    finally:
        drop_namespace(cluster, ns)
    return {
        "writers": writers,
        "pins_kept": len(got.kept & set(got.models)),
        "seconds": round(got.seconds, 1),
        "stale_writes_redone": sum(got.rounds) - len(got.rounds),
        "most_rounds_one_writer": max(got.rounds),
        "two_at_once_rounds": ROUNDS,
        "two_at_once_pins_lost": sum(len(want ^ seen) for want, seen in steps),
        "note": PINS_NOTE,
    }


def admission(
    cluster: Cluster, deployed: tuple[InCluster, S3Settings], pods: int
) -> dict[str, Any]:
    in_cluster, s3 = deployed
    ns = _namespace(cluster, "admission")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-trust-") as where:
            progress("trust", f"admission: 3 volume models, then {pods} pods at once")
            got = admit_behind_slow_registry(
                cluster, (in_cluster, s3, Registry.from_state()), ns, Path(where), pods, DELAY_S
            )
    finally:
        drop_namespace(cluster, ns)
    return {
        "profiles": len(got.volumes),
        "pods": pods,
        "registry_delay_s": DELAY_S,
        "operator_replicas": got.replicas,
        "admitted_with_a_decision": len(got.pods) - len(got.undecided()),
        "burst_s": round(got.took, 1),
        "mounted_at_once": got.mounted_at_once(),
        "registry_requests_per_digest": got.checks,
        "webhook_timeout_s": got.timeout,
        "later_pods_mounted": sum(got.late.get(n) == [v] for n, v in got.volumes.items()),
        "note": ADMISSION_NOTE,
    }


def run(cluster: Cluster, s3: S3Settings, writers: int = 100, pods: int = 50) -> dict[str, Any]:
    """Both groups' figures: {"pins_concurrent": ..., "admission_slow_registry": ...}."""
    ensure_images()
    deployed = install_in_cluster(cluster, s3)
    try:
        return {
            "pins_concurrent": pins(cluster, writers),
            "admission_slow_registry": admission(cluster, (deployed, s3), pods),
        }
    finally:
        deployed.uninstall()
