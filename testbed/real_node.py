"""TuningProfiles and model pods for the real node (containers run there; its GPUs are a fake
resource, see testbed/cluster.py), for e2e tests: `real_profile(name, s3, secret)` (the
stand-in inference image tuning `SHAPES`), `model_pod(name, profile)` (a standin-server pod
that runs once), and `KEY`, the node label those pods select on."""

from __future__ import annotations

from typing import Any

from testbed.builders.wrappers import make_pod, make_profile
from testbed.cluster import REAL_NODE_GPU_MODEL, STANDIN_IMAGE

KEY = "nvidia.com/gpu.product"

SHAPES = [
    {"mnk": [64, 128, 256], "dtype": "bfloat16", "transB": True},
    {"mnk": [32, 4096, 4096], "dtype": "float16", "transB": True},
    {"mnk": [128, 128, 64], "batch": 8, "dtype": "bfloat16"},
    {"mnk": [1, 4096, 4096], "dtype": "bfloat16", "transB": True},
    {"mnk": [16, 14336, 4096], "dtype": "bfloat16", "transB": True},
    {"mnk": [16, 4096, 14336], "dtype": "bfloat16", "transB": True},
    {"mnk": [256, 1024, 1024], "dtype": "float32"},
    {"mnk": [512, 512, 512], "dtype": "bfloat16", "transA": True},
]


def real_profile(
    name: str, s3: Any, secret: str, image: str = STANDIN_IMAGE, **spec_over: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": image,
        "imagePullPolicy": "Never",
        "gpu": {"vendor": "nvidia", "models": [REAL_NODE_GPU_MODEL]},
        # The stand-in on a "ROCm" backend offers kernels besides Default, so tuning gains.
        "workload": {"shapes": SHAPES, "env": [{"name": "FAKE_TORCH_BACKEND", "value": "rocm"}]},
        "tuning": {"backoffLimit": 0, "budgetSeconds": 300, "activeDeadlineSeconds": 600},
        "storage": {
            "uri": f"s3://{s3.bucket}/real",
            "endpoint": s3.pod_endpoint,
            "credentialsSecret": {"name": secret},
        },
    }
    spec.update(spec_over)
    return make_profile(name, "").spec_is(spec).obj()


def model_pod(name: str, profile: str, gpus: int = 2, **labels: str) -> dict[str, Any]:
    pod = make_pod(name, "").labels({"tunefleet.io/profile": profile, **labels})
    pod = pod.spec(restartPolicy="Never", nodeSelector={KEY: REAL_NODE_GPU_MODEL})
    command = ["standin-server", "--once"]
    server = pod.container(
        "server", STANDIN_IMAGE, gpus=gpus, imagePullPolicy="Never", command=command
    )
    return server.obj()


def fleet_profile(
    s3: Any, secret: str, prefix: str, image: str, name: str = "llama", **env: str
) -> dict[str, Any]:
    """real_profile for fleet mode (docs/fleet.md): stored under `prefix` of the bucket (a
    test's own: the fleet's claims and entries live there), its image `image` (pinned by
    digest, testbed.cluster.pinned_image), these variables added to its workload's."""
    profile = real_profile(name, s3, secret, image=image)
    profile["spec"]["storage"]["uri"] = f"s3://{s3.bucket}/{prefix}"
    profile["spec"]["workload"]["env"] += [{"name": k, "value": v} for k, v in env.items()]
    return profile
