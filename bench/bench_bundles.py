"""`python -m bench bundles`: what a torchCompile bundle buys a pod's start, on the real node,
with real torch (hack/images.sh --torch) and real Inductor compiling for its CPU.

The operator runs as the chart's Deployment; a caches-only profile tunes the workload
(examples/torch-compile/serve.py, max-autotune) once. Then `pods` pods per arm, the arms
interleaved (eager, compiled cold, compiled with the bundle; one pod at a time, so none waits
on another's CPU), each running the workload once and printing its figures. For each pod:

- container start to first inference done: the kubelet's startedAt of the server container
  (whole seconds) to the epoch time the workload answered, and the same from the process's
  own start (sub-second; what the ratio uses);
- the first call alone, and the steady-state median of 20 calls after it;
- for the bundle, the fetch init container's time (download, check, unpack: delivery).

Goal (the bundles issue): (bundle - eager) / (cold - eager) <= 0.25 of process start to first
inference, medians, with steady-state latency of the bundle equal to the cold compiled run's
within noise. Inductor's per-process CPU ISA probe (cpu_vec_isa.py: a test program built and
loaded in a new Python process per ISA, seconds each here) is in every compiled arm and no
cache removes it: the workload times it apart (isa_probe_s), and the ratio is also given
without it. On a GPU node that probe does not run (Triton kernels instead).
"""

from __future__ import annotations

import datetime
import json
import statistics
import time
from typing import Any

import yaml

from bench.results import progress
from tests.support.cluster import Cluster, S3Settings, ensure_torch_image, wait_for_real_node_gpus
from tests.support.compile import compile_pod, compile_profile, result_of, workload_config_map
from tests.support.operator import SERVING_SECRET, create_s3_secret, install_in_cluster
from tests.support.poll import eventually

ARMS = ("eager", "cold", "bundle")


def _epoch(stamp: str) -> float:
    return (
        datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")
        .replace(tzinfo=datetime.UTC)
        .timestamp()
    )


class _Run:
    def __init__(self, cluster: Cluster, ns: str, image: str) -> None:
        self.cluster, self.ns, self.image = cluster, ns, image

    def get(self, kind: str, name: str) -> dict[str, Any]:
        out = self.cluster.kubectl("get", kind, "-n", self.ns, name, "-o", "json").stdout
        doc: dict[str, Any] = json.loads(out)
        return doc

    def apply(self, doc: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=yaml.safe_dump(doc))

    def pod(self, name: str, arm: str) -> dict[str, Any]:
        mode = "eager" if arm == "eager" else "compiled"
        profile = "bundle" if arm == "bundle" else None
        created = time.time()
        self.cluster.kubectl(
            "create", "-n", self.ns, "-f", "-",
            input=yaml.safe_dump(compile_pod(name, self.image, profile, mode)),
        )  # fmt: skip
        pod = eventually(
            lambda: self.get("pod", name),
            lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
            f"{name} to finish",
            timeout=900,
            interval=0.5,
        )
        log = self.cluster.kubectl("logs", "-n", self.ns, name, "-c", "server").stdout
        result = result_of(log)
        if pod["status"]["phase"] != "Succeeded" or result is None:
            raise AssertionError(f"{name} failed: {log[-3000:]}")
        self.cluster.kubectl("delete", "pod", "-n", self.ns, name, "--wait=false")
        return _figures(arm, pod, result, created)


def _figures(
    arm: str, pod: dict[str, Any], result: dict[str, Any], created: float
) -> dict[str, Any]:
    states = {
        c["name"]: c["state"].get("terminated") or {}
        for c in pod["status"].get("initContainerStatuses", [])
        + pod["status"].get("containerStatuses", [])
    }
    started = _epoch(states["server"]["startedAt"])
    out: dict[str, Any] = {
        "arm": arm,
        "container_start_to_first_s": round(result["answered_at"] - started, 2),
        "process_to_first_s": result["process_to_first_s"],
        "create_to_first_s": round(result["answered_at"] - created, 2),
        "first_call_s": result["first_call_s"],
        "isa_probe_s": result.get("isa_probe_s", 0.0),
        "steady_median_ms": result["steady_median_ms"],
        "fxgraph_cache_hit": result["counters"].get("fxgraph_cache_hit"),
        "fxgraph_cache_miss": result["counters"].get("fxgraph_cache_miss"),
        "output_sha256": result["output_sha256"],
    }
    fetch = states.get("tunefleet-fetch")
    if fetch:
        out["fetch_s"] = _epoch(fetch["finishedAt"]) - _epoch(fetch["startedAt"])
    return out


def _medians(rows: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    mine = [r for r in rows if r["arm"] == arm]
    keys = ("container_start_to_first_s", "process_to_first_s", "create_to_first_s",
            "first_call_s", "isa_probe_s", "steady_median_ms", "fetch_s")  # fmt: skip
    return {
        k: round(statistics.median(r[k] for r in mine), 3)
        for k in keys
        if all(k in r and r[k] is not None for r in mine)
    }


def run(cluster: Cluster, s3: S3Settings, pods: int = 5) -> dict[str, Any]:
    image = ensure_torch_image()
    install_in_cluster(cluster, s3)
    ns = f"bench-bundles-{int(time.time())}"
    cluster.kubectl("create", "namespace", ns)
    r = _Run(cluster, ns, image)
    try:
        return _measure(r, s3, pods)
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _measure(r: _Run, s3: S3Settings, pods: int) -> dict[str, Any]:
    cluster, ns = r.cluster, r.ns
    secret = create_s3_secret(cluster.kubectl, ns, s3.access_key, s3.secret_key)
    create_s3_secret(
        cluster.kubectl, ns, s3.reader_access_key, s3.reader_secret_key, SERVING_SECRET
    )
    r.apply(workload_config_map())
    wait_for_real_node_gpus(cluster, 1)
    t = time.perf_counter()
    r.apply(compile_profile("bundle", r.image, s3, secret))
    prof = eventually(
        lambda: r.get("tp", "bundle"),
        lambda p: (p.get("status") or {}).get("phase") in ("Ready", "Failed"),
        "the bundle profile Ready",
        timeout=1500,
        interval=1,
    )
    tuned_s = time.perf_counter() - t
    if prof["status"]["phase"] != "Ready":
        raise AssertionError(json.dumps(prof["status"], indent=2)[:3000])
    (cache,) = prof["status"]["artifacts"][0]["caches"]
    rows = []
    for i in range(pods):
        for arm in ARMS:
            progress("bundles", f"pod {i + 1}/{pods}, {arm}")
            rows.append(r.pod(f"{arm}-{i}", arm))
    med = {arm: _medians(rows, arm) for arm in ARMS}
    e, c, b = (med[a]["process_to_first_s"] for a in ARMS)
    ke, kc, kb = (med[a]["container_start_to_first_s"] for a in ARMS)
    # The same without Inductor's ISA probe, which every compiling process pays, cache or not.
    pc, pb = c - med["cold"]["isa_probe_s"], b - med["bundle"]["isa_probe_s"]
    cold_outputs = {x["output_sha256"] for x in rows if x["arm"] != "eager"}
    return {
        "pods_per_arm": pods,
        "image": r.image,
        "tuning_job_to_ready_s": round(tuned_s, 1),
        "bundle": {k: cache[k] for k in ("files", "size", "bytes", "sha256")},
        "medians": med,
        "ratio_bundle_over_cold_start_cost": round((b - e) / (c - e), 3),
        "ratio_from_container_start": round((kb - ke) / (kc - ke), 3),
        "ratio_without_isa_probe": round((pb - e) / (pc - e), 3),
        "goal": "(bundle - eager) / (cold - eager) <= 0.25, process start to first inference",
        "bundle_hits_every_pod": all(
            x["fxgraph_cache_hit"] and not x["fxgraph_cache_miss"]
            for x in rows
            if x["arm"] == "bundle"
        ),
        "compiled_outputs_identical": len(cold_outputs) == 1,
        "runs": rows,
    }
