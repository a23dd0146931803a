"""What the real-node start-up benchmarks (`bundles`, `vllm`) share: a namespace of their own
with the store's Secrets, a caches-only profile tuned to Ready once, kubectl as JSON, the
kubelet's timestamps as epoch seconds."""

from __future__ import annotations

import datetime
import json
import random
import re
import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from bench.results import progress
from testbed.cluster import Cluster, S3Settings, wait_for_real_node_gpus
from testbed.operator import SERVING_SECRET, create_s3_secret, install_in_cluster
from testbed.poll import eventually

R = TypeVar("R", bound="Run")
# The arms of a start-up benchmark: no cache at all (eager), a cache the pod fills itself
# (cold), the bundle tunefleet tuned once (bundle).
ARMS = ("eager", "cold", "bundle")


def epoch(stamp: str) -> float:
    """An RFC 3339 time as the API server (whole seconds) and the kubelet's log stamps
    (nanoseconds) write it, as epoch seconds."""
    s = stamp.strip().replace("Z", "+00:00")
    main, _, rest = s.partition(".")
    if not rest:
        return datetime.datetime.fromisoformat(s).timestamp()
    digits = re.match(r"\d+", rest)
    frac = digits.group(0) if digits else ""
    zone = rest[len(frac) :]
    return datetime.datetime.fromisoformat(main + zone).timestamp() + float(f"0.{frac or 0}")


class Run:
    """One benchmark's namespace on the cluster, and the image its pods run."""

    def __init__(self, cluster: Cluster, ns: str, image: str) -> None:
        self.cluster, self.ns, self.image = cluster, ns, image

    def get(self, kind: str, name: str) -> dict[str, Any]:
        out = self.cluster.kubectl("get", kind, "-n", self.ns, name, "-o", "json").stdout
        doc: dict[str, Any] = json.loads(out)
        return doc

    def apply(self, doc: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=yaml.safe_dump(doc))

    def create(self, doc: dict[str, Any]) -> None:
        self.cluster.kubectl("create", "-n", self.ns, "-f", "-", input=yaml.safe_dump(doc))

    def finished(self, name: str) -> dict[str, Any]:
        """The pod `name` once it has Succeeded or Failed (polled every 0.5 s, 900 s at most)."""
        pod: dict[str, Any] = eventually(
            lambda: self.get("pod", name),
            lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
            f"{name} to finish",
            timeout=900,
            interval=0.5,
        )
        return pod

    def pod(self, name: str, arm: str) -> dict[str, Any]:
        """One start-up of `arm`, measured (each benchmark says how)."""
        raise NotImplementedError


def arm_pods(
    r: Run, routine: str, pods: int, shuffle: random.Random | None = None
) -> list[dict[str, Any]]:
    """`pods` start-ups of every arm, interleaved (eager, cold, bundle, eager, ...), so that
    the node's drift falls on every arm alike; with `shuffle`, each round's arm order is
    drawn anew (a fixed order would give one arm the node's after-effects of another: page
    cache, a previous server's last writes). Each row says its round and place."""
    rows = []
    for i in range(pods):
        order = list(ARMS)
        if shuffle is not None:
            shuffle.shuffle(order)
        for place, arm in enumerate(order):
            progress(routine, f"pod {i + 1}/{pods}, {arm}")
            rows.append({**r.pod(f"{arm}-{i}", arm), "round": i, "place": place})
    return rows


def medians(
    rows: list[dict[str, Any]], arm: str, keys: tuple[str, ...], digits: int
) -> dict[str, Any]:
    """The median of each of `keys` over the arm's rows; a key some row lacks is left out."""
    mine = [r for r in rows if r["arm"] == arm]
    return {
        k: round(statistics.median(r[k] for r in mine), digits)
        for k in keys
        if all(r.get(k) is not None for r in mine)
    }


def in_namespace(
    cluster: Cluster,
    s3: S3Settings,
    prefix: str,
    run: R,
    measure: Callable[[R, S3Settings, int], dict[str, Any]],
    pods: int,
) -> dict[str, Any]:
    """measure(run, s3, pods) with `run` in a new namespace of its own, the operator installed
    as the chart's Deployment; the namespace goes afterwards, whatever happened."""
    install_in_cluster(cluster, s3)
    run.ns = f"{prefix}-{int(time.time())}"
    cluster.kubectl("create", "namespace", run.ns)
    try:
        return measure(run, s3, pods)
    finally:
        cluster.kubectl("delete", "namespace", run.ns, "--wait=false", check=False)


def tuned(
    r: Run,
    s3: S3Settings,
    workload: dict[str, Any],
    profile: Callable[[str], dict[str, Any]],
    name: str,
) -> tuple[dict[str, Any], float]:
    """The profile `profile(secret)` (its workload ConfigMap applied first) once Ready, and
    how long it took from apply; AssertionError with its status when it failed."""
    cluster, ns = r.cluster, r.ns
    secret = create_s3_secret(cluster.kubectl, ns, s3.access_key, s3.secret_key)
    create_s3_secret(
        cluster.kubectl, ns, s3.reader_access_key, s3.reader_secret_key, SERVING_SECRET
    )
    r.apply(workload)
    wait_for_real_node_gpus(cluster, 1)
    t = time.perf_counter()
    r.apply(profile(secret))
    prof = eventually(
        lambda: r.get("tp", name),
        lambda p: (p.get("status") or {}).get("phase") in ("Ready", "Failed"),
        f"the {name} profile Ready",
        timeout=1500,
        interval=1,
    )
    if prof["status"]["phase"] != "Ready":
        raise AssertionError(json.dumps(prof["status"], indent=2)[:3000])
    return prof, time.perf_counter() - t
