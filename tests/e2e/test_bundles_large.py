"""A real-size bundle on the real node: a stack that writes a 1 GiB incompressible cache.

The stand-in inference image tunes (its torch computes nothing and says so) and its workload
plays a stack whose autotuner leaves 1 GiB in the directory its variable names (the generic
`cache` kind). Every step runs in containers: the tune step packs the GiB to a file, publish
uploads it to the real S3 server in parts, and a model pod's fetch init container streams it
to disk, checks it against the manifest and unpacks it, in bounded memory: it reports its
cgroup's peak (memory.peak, or v1's max_usage_in_bytes), which must stay within 64 MiB
whatever the bundle's size. The pod prints the SHA-256 of what it got; the test compares it
with the bytes the workload wrote (a seeded generator, computed here too).

A second pod may hold less than the bundle needs (its tunefleet.io/caches-limit annotation; an
ephemeral-storage limit says the same where the node accounts local storage, which the real
node here does not):
fetch says so, the stack starts cold, the profile's Degraded condition counts it with an
Event, and nothing is OOMKilled or restarted.

Tuned once for both tests (module scope); the namespace and the S3 objects go afterwards.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from testbed.cluster import create_namespace, delete_namespace, wait_for_real_node_gpus
from testbed.large import BLOB, expected_sha256, large_profile, serving_pod
from testbed.operator import SERVING_SECRET, InCluster, create_s3_secret
from testbed.poll import eventually
from tests.support.kube import apply, condition, create, events_about, pod_of, ready, statuses

pytestmark = pytest.mark.e2e

SIZE_MIB = 1024
PEAK_LIMIT = 64 << 20


@dataclass
class Tuned:
    namespace: str
    profile: dict[str, Any]


_tuned: dict[str, Tuned] = {}


@pytest.fixture(scope="module")
def cleanup(cluster: Any, s3: Any) -> Iterator[dict[str, str]]:
    made: dict[str, str] = {}
    yield made
    if "namespace" in made:
        api = cluster.api_client()
        try:
            delete_namespace(api, made["namespace"])
        finally:
            api.close()
    if "prefix" in made:
        s3.delete_prefix(made["prefix"] + "/")


def tuned(cluster: Any, in_cluster: InCluster, s3: Any, made: dict[str, str]) -> Tuned:
    """The profile with the 1 GiB cache, Ready (tuned once for the module)."""
    if "t" in _tuned:
        return _tuned["t"]
    wait_for_real_node_gpus(cluster, 1)
    namespace = f"large-{uuid.uuid4().hex[:8]}"
    prefix = f"large/{uuid.uuid4().hex[:12]}"
    api = cluster.api_client()
    try:
        create_namespace(api, namespace)
    finally:
        api.close()
    made.update(namespace=namespace, prefix=prefix)
    create_s3_secret(
        cluster.kubectl, namespace, s3.reader_access_key, s3.reader_secret_key, SERVING_SECRET
    )
    secret = create_s3_secret(cluster.kubectl, namespace, s3.access_key, s3.secret_key)
    profile = large_profile("big", s3, secret, prefix, SIZE_MIB)
    apply(cluster, namespace, profile)
    prof = ready(cluster, namespace, "big", timeout=900)
    assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"], indent=2)[:4000]
    _tuned["t"] = Tuned(namespace, prof)
    return _tuned["t"]


def _serving(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    """The pod once its server container runs (its fetch ended)."""
    return dict(
        eventually(
            lambda: pod_of(cluster, namespace, name),
            lambda p: (
                bool((statuses(p).get("server") or {}).get("state", {}).get("running"))
                or p["status"].get("phase") in ("Succeeded", "Failed")
            ),
            f"{name} running",
            timeout=600,
            interval=2,
        )
    )


def _peak(log: str) -> int:
    m = re.search(r"memory peak (\d+) bytes", log)
    assert m, f"fetch said no memory peak:\n{log}"
    return int(m.group(1))


def test_a_1_gib_cache_is_tuned_and_served_whole_in_bounded_memory(
    cluster: Any, in_cluster: InCluster, s3: Any, cleanup: dict[str, str]
) -> None:
    t = tuned(cluster, in_cluster, s3, cleanup)
    (art,) = t.profile["status"]["artifacts"]
    (cache,) = art["caches"]
    assert (cache["name"], cache["files"], cache["bytes"]) == ("big", 1, SIZE_MIB << 20)
    assert cache["size"] >= SIZE_MIB << 20  # incompressible: the archive is the GiB

    serve = f'sha256sum {BLOB} && echo "served" && sleep 3600'
    create(cluster, t.namespace, serving_pod("whole", "big", serve))
    pod = _serving(cluster, t.namespace, "whole")
    fetch = statuses(pod)["tunefleet-fetch"]
    done = fetch["state"].get("terminated") or {}
    assert done.get("exitCode") == 0 and fetch.get("restartCount") == 0, fetch
    assert "caches big unpacked to /tunefleet/caches" in done.get("message", ""), done
    fetch_log = cluster.kubectl("logs", "-n", t.namespace, "whole", "-c", "tunefleet-fetch").stdout
    log = eventually(
        lambda: cluster.kubectl("logs", "-n", t.namespace, "whole", "-c", "server").stdout,
        lambda text: "served" in text,
        "the pod's SHA-256 of its cache",
        timeout=120,
        interval=2,
    )
    assert log.split()[0] == expected_sha256(SIZE_MIB), log
    peak = _peak(fetch_log)
    assert peak <= PEAK_LIMIT, f"fetch's peak memory {peak >> 20} MiB (limit 64 MiB)\n{fetch_log}"
    cluster.kubectl("delete", "pod", "-n", t.namespace, "whole", "--wait=false")


def test_a_bundle_larger_than_the_pod_may_hold_is_told_and_the_pod_starts_cold(
    cluster: Any, in_cluster: InCluster, s3: Any, cleanup: dict[str, str]
) -> None:
    t = tuned(cluster, in_cluster, s3, cleanup)
    serve = f'test -e {BLOB} && echo "warm" || echo "cold"; sleep 3600'
    pod = serving_pod("small", "big", serve)
    # What the pod may hold, said by its annotation: the real node accounts no local storage,
    # so an ephemeral-storage limit (which says the same) would leave it Pending here.
    pod["metadata"]["annotations"] = {"tunefleet.io/caches-limit": "256Mi"}
    create(cluster, t.namespace, pod)
    pod = _serving(cluster, t.namespace, "small")
    fetch = statuses(pod)["tunefleet-fetch"]
    done = fetch["state"].get("terminated") or {}
    message = done.get("message", "")
    assert done.get("exitCode") == 0, fetch
    assert "caches not served: the bundle needs" in message, message
    assert "more than the 256 MiB this pod may hold" in message, message
    assert "wrote 1 results file(s)" in message  # the results still serve
    log = eventually(
        lambda: cluster.kubectl("logs", "-n", t.namespace, "small", "-c", "server").stdout,
        lambda text: "warm" in text or "cold" in text,
        "the server's start",
        timeout=120,
        interval=2,
    )
    assert log.strip() == "cold", log

    prof = eventually(
        lambda: cluster.kubectl("get", "tp", "-n", t.namespace, "big", "-o", "json").stdout,
        lambda text: condition(json.loads(text), "Degraded").get("status") == "True",
        "the profile's Degraded condition",
        timeout=120,
        interval=2,
    )
    degraded = condition(json.loads(prof), "Degraded")
    assert "caches_not_served" in degraded["message"], degraded
    events = events_about(cluster, t.namespace, "big", reason="PodsStartedUntuned")
    assert any("may hold" in e.get("message", "") for e in events), events
    # Never OOMKilled, never restarted: the pod runs, cold, with every count at zero.
    pod = pod_of(cluster, t.namespace, "small")
    for name, st in statuses(pod).items():
        assert st.get("restartCount", 0) == 0, (name, st)
        last = (st.get("lastState") or {}).get("terminated") or {}
        assert last.get("reason") != "OOMKilled", (name, st)
    assert pod["status"]["phase"] == "Running", pod["status"]
