"""`python -m bench bundles`: what a torchCompile bundle buys a pod's start, on the real node,
with real torch (hack/images.sh --torch) and real Inductor compiling for its CPU.

The operator runs as the chart's Deployment; a caches-only profile tunes the workload
(examples/torch-compile/serve.py, max-autotune, --precompile: its tuning run also keeps the
forward AOT-precompiled in Inductor's cache dir, which a pod with the bundle loads instead of
tracing it and looking its graph up) once. Then `pods` pods per arm, the arms
interleaved (eager, compiled cold, compiled with the bundle; one pod at a time, so none waits
on another's CPU), each running the workload once and printing its figures. For each pod:

- container start to first inference done: the kubelet's startedAt of the server container
  (whole seconds) to the epoch time the workload answered, and the same from the process's
  own start (sub-second; what the ratio uses);
- the first call alone, and the steady-state median of 20 calls after it;
- the workload's breakdown of its process start to first inference, every second by phase
  (torch's import, the compiler's, the ISA probe's builds and loads, Dynamo, Inductor's caches
  or compile, C++ builds, the precompiled load, the run; "other" the rest), medians per phase;
- for the bundle, the fetch init container's time (download, check, unpack: delivery).

Goal (the bundles issue): (bundle - eager) / (cold - eager) <= 0.25 of process start to first
inference, medians, with steady-state latency of the bundle equal to the cold compiled run's
within noise. Inductor's per-process CPU ISA probe (cpu_vec_isa.py: a test program built and
loaded in a new Python process per ISA, seconds each here) is in every compiled arm: the bundle
carries its builds (they are in Inductor's cache dir), no cache removes its loads (each a new
Python process importing torch 2.11). The workload times it apart (isa_probe_s), and the ratio
is also given without it. On a GPU node that probe does not run (Triton kernels instead).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.realnode import ARMS, Run, arm_pods, epoch, in_namespace, medians, tuned
from testbed.cluster import Cluster, S3Settings, ensure_torch_image
from testbed.compile import compile_pod, compile_profile, result_of, workload_config_map


class _Run(Run):
    def pod(self, name: str, arm: str) -> dict[str, Any]:
        mode = "eager" if arm == "eager" else "compiled"
        profile = "bundle" if arm == "bundle" else None
        created = time.time()
        self.create(compile_pod(name, self.image, profile, mode, precompile=True))
        pod = self.finished(name)
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
    started = epoch(states["server"]["startedAt"])
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
        # "loaded" where the bundle's precompiled forward served (no FX graph cache lookup then)
        "precompiled": result.get("precompiled"),
        "breakdown": result.get("breakdown") or {},
        "output_sha256": result["output_sha256"],
    }
    fetch = states.get("tunefleet-fetch")
    if fetch:
        out["fetch_s"] = epoch(fetch["finishedAt"]) - epoch(fetch["startedAt"])
    return out


def _medians(rows: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    mine = [r for r in rows if r["arm"] == arm]
    keys = ("container_start_to_first_s", "process_to_first_s", "create_to_first_s",
            "first_call_s", "isa_probe_s", "steady_median_ms", "fetch_s")  # fmt: skip
    med = medians(rows, arm, keys, 3)
    phases = sorted({p for r in mine for p in r.get("breakdown", {})})
    med["breakdown"] = {
        p: round(statistics.median(r.get("breakdown", {}).get(p, 0.0) for r in mine), 3)
        for p in phases
    }  # medians per phase: their sum is near, not exactly, the median total
    return med


def run(cluster: Cluster, s3: S3Settings, pods: int = 5) -> dict[str, Any]:
    image = ensure_torch_image()
    return in_namespace(cluster, s3, "bench-bundles", _Run(cluster, "", image), _measure, pods)


def _measure(r: _Run, s3: S3Settings, pods: int) -> dict[str, Any]:
    prof, tuned_s = tuned(
        r, s3, workload_config_map(),
        lambda secret: compile_profile("bundle", r.image, s3, secret, precompile=True), "bundle",
    )  # fmt: skip
    (cache,) = prof["status"]["artifacts"][0]["caches"]
    rows = arm_pods(r, "bundles", pods)
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
        # Served from the bundle: its precompiled forward loaded, or every graph an FX graph
        # cache hit (a failed load falls back to those); each run says which ("precompiled")
        "bundle_hits_every_pod": all(
            x["precompiled"] == "loaded" or (x["fxgraph_cache_hit"] and not x["fxgraph_cache_miss"])
            for x in rows
            if x["arm"] == "bundle"
        ),
        "compiled_outputs_identical": len(cold_outputs) == 1,
        "runs": rows,
    }
