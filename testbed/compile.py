"""torch.compile on the real node, for real: the workload (examples/torch-compile/serve.py) as a
ConfigMap, a caches-only TuningProfile that tunes it in the real torch CPU image, and pods that
run it with or without the profile; their `TUNEFLEET_RESULT` lines read back. Shared by
tests/e2e/test_bundles_torch.py and the `bundles` benchmark (bench/suite.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from testbed.builders.wrappers import make_config_map, make_pod, make_profile
from testbed.cluster import REAL_NODE_GPU_MODEL

ROOT = Path(__file__).resolve().parents[1]
SERVE = ROOT / "examples" / "torch-compile" / "serve.py"
WORKLOAD_CM = "compile-workload"
WORKLOAD_DIR = "/workload"
KEY = "nvidia.com/gpu.product"
RESULT = "TUNEFLEET_RESULT "
# Inductor probes the CPU's vector ISAs in every new process by building and loading a test
# program per ISA (torch/_inductor/cpu_vec_isa.py): the builds land in Inductor's cache dir, so
# a bundle carries them, but each load is a new Python process importing torch (torch 2.11),
# seconds that no cache removes. Trusting the ISA the CPU reports skips the base check; it is
# set alike in every arm.
INDUCTOR_ENV = [{"name": "TORCHINDUCTOR_VEC_ISA_OK", "value": "1"}]


def workload_config_map() -> dict[str, Any]:
    return make_config_map(WORKLOAD_CM, "").data(**{"serve.py": SERVE.read_text()}).obj()


def command(
    mode: str = "compiled", iterations: int = 3, serve: bool = False, precompile: bool = False
) -> list[str]:
    """precompile: the workload's --precompile (its tuning run also keeps the forward
    AOT-precompiled in Inductor's cache dir; a pod with the bundle loads it instead of tracing
    and looking its graph up: counters then say no FX graph cache hit, "precompiled" says
    "loaded")."""
    return [
        "python3", f"{WORKLOAD_DIR}/serve.py", "--mode", mode, "--iterations", str(iterations),
        *(["--precompile"] if precompile else []), *(["--serve"] if serve else []),
    ]  # fmt: skip


def compile_profile(
    name: str, image: str, s3: Any, secret: str, precompile: bool = False, **over: Any
) -> dict[str, Any]:
    """TorchCompile caches alone (no TunableOp: the real node has no GPU) of the workload."""
    spec: dict[str, Any] = {
        "image": image,
        "imagePullPolicy": "Never",
        "gpu": {"vendor": "nvidia", "models": [REAL_NODE_GPU_MODEL]},
        "workload": {"command": command(iterations=3, precompile=precompile), "env": INDUCTOR_ENV},
        "artifacts": {"tunableop": False, "caches": [{"kind": "torchCompile"}]},
        "tuning": {"backoffLimit": 0, "budgetSeconds": 900, "activeDeadlineSeconds": 1500},
        # The gate's measuring: cold against warm first inferences, a few pairs (~30 s each
        # alone; a cold run took 56 s with the 2 cores shared, and 150 s then fitted one pair).
        "promotion": {"budgetSeconds": 240},
        "storage": {
            "uri": f"s3://{s3.bucket}/bundles",
            "endpoint": s3.pod_endpoint,
            "credentialsSecret": {"name": secret},
        },
        "template": {
            "spec": {"volumes": [{"name": "workload", "configMap": {"name": WORKLOAD_CM}}]},
            "tune": {
                "volumeMounts": [{"name": "workload", "mountPath": WORKLOAD_DIR, "readOnly": True}]
            },
        },
    }
    spec.update(over)
    return make_profile(name, "").spec_is(spec).obj()


def compile_pod(
    name: str,
    image: str,
    profile: str | None,
    mode: str = "compiled",
    serve: bool = False,
    precompile: bool = False,
) -> dict[str, Any]:
    """A model pod on the real node running the workload once (or serving, with serve); with
    a profile, tunefleet's webhook injects its caches."""
    labels = {"tunefleet.io/profile": profile} if profile else {"app": "compile-reference"}
    pod = (
        make_pod(name, "")
        .labels(labels)
        .spec(
            restartPolicy="Never",
            nodeSelector={KEY: REAL_NODE_GPU_MODEL},
            volumes=[{"name": "workload", "configMap": {"name": WORKLOAD_CM}}],
        )
    )
    return pod.container(
        "server",
        image,
        gpus=1,
        env=list(INDUCTOR_ENV),
        imagePullPolicy="Never",
        command=command(mode, iterations=20, serve=serve, precompile=precompile),
        volumeMounts=[{"name": "workload", "mountPath": WORKLOAD_DIR, "readOnly": True}],
    ).obj()


def result_of(log: str) -> dict[str, Any] | None:
    """The workload's TUNEFLEET_RESULT line in a pod's log, parsed; None before it is there."""
    for line in log.splitlines():
        if line.startswith(RESULT):
            doc: dict[str, Any] = json.loads(line[len(RESULT) :])
            return doc
    return None
