"""The README's "Using it" steps, as a newcomer runs them on the local cluster.

`test_the_readmes_steps_bring_the_amd_example_to_jobs_on_both_models` runs README.md's
local-cluster block itself (the shell block under the marker below, verbatim, in bash): make
cluster-up, the chart installed with hack/local-cluster-values.yaml, the S3 Secret,
examples/tuningprofile-amd.yaml. Then the operator must run where containers run and the
example must get a tuning Job per AMD model, each pod placed on a node of its model. Edit the
README's commands and this test runs the new ones.

The others show what the chart's defaults do on this cluster: every node a container could
run on is tainted, so the replicas stay Pending with the scheduler's reason; replicas told to
tolerate everything land on kwok nodes, where kwok never reports them Ready (no container runs
there to pass the readiness probe). Either way, nothing claims an operator that is not there.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.cluster import (
    REAL_NODE,
    ROOT,
    Cluster,
    condition,
    fleet,
    state_dir,
    wait_for,
)
from testbed.operator import RELEASE, SYSTEM_NS, helm

pytestmark = pytest.mark.e2e

README = ROOT / "README.md"
MARKER = "<!-- tests/e2e/test_readme.py runs this block -->"
AMD_EXAMPLE = ROOT / "examples" / "tuningprofile-amd.yaml"
AMD_LABEL = "amd.com/gpu.product-name"
AMD_MODELS = {"AMD_Instinct_MI300X_OAM", "AMD_Instinct_MI325X_OAM"}


def readme_block() -> str:
    """The shell block that follows MARKER in README.md."""
    text = README.read_text()
    assert MARKER in text, f"README.md has no {MARKER!r} (the local-cluster steps this runs)"
    m = re.search(r"```sh\n(.*?)```", text[text.index(MARKER) :], re.S)
    assert m, f"no ```sh block after {MARKER!r} in README.md"
    return m.group(1)


def operator_pods(cluster: Cluster) -> list[dict[str, Any]]:
    pods = cluster.kubectl_json(
        "get", "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/name=tunefleet"
    )["items"]
    return [
        p
        for p in pods
        if any(o.get("kind") == "ReplicaSet" for o in p["metadata"].get("ownerReferences") or [])
    ]


def is_ready(pod: dict[str, Any]) -> bool:
    return (condition(pod, "Ready") or {}).get("status") == "True"


@pytest.fixture
def readme_objects(cluster: Cluster) -> Iterator[None]:
    """What the README's steps create in namespace default, removed afterwards."""
    yield
    cluster.kubectl("delete", "-f", str(AMD_EXAMPLE), "--ignore-not-found", "--wait=false")
    cluster.kubectl("delete", "secret", "s3-credentials", "-n", "default", "--ignore-not-found")


def test_the_readmes_steps_bring_the_amd_example_to_jobs_on_both_models(
    cluster: Cluster, no_release: None, readme_objects: None
) -> None:
    if state_dir() != ROOT / ".tunefleet":
        pytest.skip("the README's commands use ./.tunefleet; TUNEFLEET_STATE points elsewhere")
    block = readme_block()
    assert "helm install tunefleet charts/tunefleet" in block, block
    assert "examples/tuningprofile-amd.yaml" in block, block
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "TUNEFLEET_STATE")}
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (
        f"README.md's local-cluster block failed ({done.returncode}):\n{block}\n"
        f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    )
    print(f"README block ran in {time.monotonic() - started:.1f}s:\n{done.stdout}")

    # The operator runs where containers run, and says so only when it does.
    pods = operator_pods(cluster)
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        assert pod["spec"]["nodeName"] == REAL_NODE, pod["spec"].get("nodeName")
        assert is_ready(pod), pod["status"]

    # A tuning Job per AMD model, each pod on a (kwok) node of its model.
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in fleet()}

    def placed_pods() -> dict[str, list[dict[str, Any]]]:
        items = cluster.kubectl_json(
            "get", "pods", "-n", "default", "-l", "tunefleet.io/tuning-profile=llama-8b-rocm"
        )["items"]
        by_model: dict[str, list[dict[str, Any]]] = {}
        for pod in items:
            if pod["spec"].get("nodeName"):
                model = pod["metadata"]["labels"]["tunefleet.io/gpu-model"]
                by_model.setdefault(model, []).append(pod)
        return by_model

    placed = wait_for(
        placed_pods,
        timeout=120,
        interval=1,
        describe="a placed tuning pod for each AMD model of examples/tuningprofile-amd.yaml",
        until=lambda by_model: set(by_model) == AMD_MODELS,
    )
    for model, model_pods in placed.items():
        for pod in model_pods:
            node = pod["spec"]["nodeName"]
            assert nodes.get(node, {}).get(AMD_LABEL) == model, (model, node)
    job_models = {
        j["metadata"]["annotations"]["tunefleet.io/gpu-model"]
        for j in cluster.kubectl_json(
            "get", "jobs", "-n", "default", "-l", "tunefleet.io/tuning-profile=llama-8b-rocm"
        )["items"]
    }
    assert job_models == AMD_MODELS
    profile = wait_for(
        lambda: cluster.kubectl_json("get", "tuningprofile", "-n", "default", "llama-8b-rocm"),
        timeout=60,
        describe="llama-8b-rocm's status",
        until=lambda p: (p.get("status") or {}).get("phase") == "Tuning",
    )
    assert condition(profile, "Progressing"), profile["status"]


def wait_settled(cluster: Cluster, count: int) -> list[dict[str, Any]]:
    """The release's replicas once the scheduler has decided each (placed or refused)."""
    return wait_for(
        lambda: operator_pods(cluster),
        timeout=60,
        describe=f"{count} operator replicas placed or refused by the scheduler",
        until=lambda ps: (
            len(ps) == count
            and all(
                p["spec"].get("nodeName")
                or (condition(p, "PodScheduled") or {}).get("reason") == "Unschedulable"
                for p in ps
            )
        ),
    )


def assert_never_ready(cluster: Cluster, seconds: float = 8) -> list[dict[str, Any]]:
    """No replica, and so not the Deployment, becomes Ready for `seconds` (kwok plays a
    pod's start within a second)."""
    deadline = time.monotonic() + seconds
    while True:
        pods = operator_pods(cluster)
        assert not any(is_ready(p) for p in pods), [p["status"] for p in pods]
        deploy = cluster.kubectl_json("get", "deployment", "-n", SYSTEM_NS, RELEASE)
        assert not (deploy.get("status") or {}).get("readyReplicas"), deploy["status"]
        if time.monotonic() >= deadline:
            return pods
        time.sleep(1)


def install(cluster: Cluster, *args: str) -> None:
    helm(
        cluster.bin_dir,
        cluster.kubeconfig,
        "install",
        RELEASE,
        str(ROOT / "charts" / "tunefleet"),
        "-n",
        SYSTEM_NS,
        "--create-namespace",
        *args,
    )


def test_the_charts_defaults_stay_pending_here_with_the_schedulers_reason(
    cluster: Cluster, no_release: None
) -> None:
    install(cluster)
    pods = wait_settled(cluster, 2)
    for pod in pods:
        assert not pod["spec"].get("nodeName"), pod["spec"]["nodeName"]
        message = (condition(pod, "PodScheduled") or {}).get("message", "")
        # Every node is tainted: the real node and the fake NVIDIA ones like NVIDIA GPU nodes,
        # the fake AMD ones like AMD GPU nodes, kwok-cpu-0 with kwok's taint.
        assert "0/7 nodes are available: 7 node(s) had untolerated taint" in message, message
    assert_never_ready(cluster)


def test_replicas_placed_on_kwok_nodes_are_never_ready(cluster: Cluster, no_release: None) -> None:
    install(
        cluster,
        "--set",
        "operator.nodeSelector.type=kwok",
        "--set",
        "operator.tolerations[0].operator=Exists",
    )
    pods = wait_settled(cluster, 2)
    kwok = {n["metadata"]["name"] for n in fleet()}
    for pod in pods:
        assert pod["spec"].get("nodeName") in kwok, pod["spec"].get("nodeName")
    pods = assert_never_ready(cluster)
    for pod in pods:
        # kwok plays the start (the pod is Running) but never a probe it cannot run.
        assert pod["status"]["phase"] == "Running", pod["status"]
        ready = condition(pod, "Ready") or {}
        assert ready.get("reason") == "ReadinessProbeNeverRun", ready
        assert "no container runs on kwok node" in ready.get("message", ""), ready
