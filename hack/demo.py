"""`make demo`: the whole tunefleet flow on the local control plane, narrated.

What runs where, said as it happens:
- real containers, on the real node (containerd, runc; it has NO GPU, its nvidia.com/gpu is a
  fake resource): the operator (the chart's Deployment, two replicas), a tuning Job's steps
  (bootstrap, the sync sidecar, tune in a STAND-IN inference image whose torch computes
  nothing, publish to the S3 server) and a model Deployment's pod (the injected fetch, a
  stand-in model server);
- kwok's fake GPU fleet: scheduling only; no container runs there, so for a kwok tuning pod
  the demo carries out the publish step itself (the pod's own command, with a hand-written
  results file in TunableOp's format) and says so.

When it ends, nothing of it runs: the model Deployment is scaled to 0 (so it holds none of
the real node's fake GPUs, which `make test` needs) and the chart is uninstalled (so the
README's `helm install` finds the name free); the profiles, their Jobs and artifacts stay,
and the demo lists what it left.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from testbed.cluster import (  # noqa: E402
    REAL_NODE,
    REAL_NODE_GPU_MODEL,
    STANDIN_IMAGE,
    Cluster,
    S3Settings,
    ensure_cluster,
    ensure_images,
    ensure_s3,
    real_node_gpu_holders,
)
from testbed.operator import (  # noqa: E402
    RELEASE,
    SERVING_SECRET,
    STAND_IN_NOTE,
    SYSTEM_NS,
    carry_out_publish,
    create_s3_secret,
    install_in_cluster,
    uninstall_release,
)
from testbed.poll import eventually  # noqa: E402

NS = "demo"
WHERE: list[tuple[str, str]] = []


def step(title: str) -> None:
    print(f"\n\033[1m== {title}\033[0m", flush=True)


def show(cluster: Cluster, *args: str) -> str:
    out = cluster.kubectl(*args).stdout
    print(f"$ kubectl {' '.join(args)}\n{out.rstrip()}", flush=True)
    return out


def plugin(cluster: Cluster, s3: S3Settings, *args: str) -> None:
    """The kubectl plugin, as a user runs it (kubectl finds kubectl-tunefleet on PATH)."""
    exe = Path(sys.executable).parent / "kubectl-tunefleet"
    if not exe.exists():
        return
    env = {"KUBECONFIG": cluster.kubeconfig, "PATH": f"{exe.parent}:/usr/bin:/bin", **s3.env()}
    done = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=120)
    print(f"$ kubectl tunefleet {' '.join(args)}\n{(done.stdout + done.stderr).rstrip()}")


def get(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def main() -> None:
    started = time.monotonic()
    cluster, s3 = ensure_cluster(), ensure_s3()

    step(
        "1. The local control plane: a real kube-apiserver, a fake GPU fleet (kwok), one real node"
    )
    print(cluster.kubectl("version").stdout.strip())
    show(cluster, "get", "nodes", "-L", "type,amd.com/gpu.product-name,nvidia.com/gpu.product")
    print(
        f"{REAL_NODE} runs real containers (containerd) but has NO GPU: its nvidia.com/gpu is a "
        f"fake resource and its label {REAL_NODE_GPU_MODEL} names no real model."
    )

    step("2. Build the images (buildah, no registry) and install the chart on the real node")
    ensure_images()
    install_in_cluster(cluster, s3)
    show(cluster, "get", "pods", "-n", "tunefleet-system", "-o", "wide")
    WHERE.append(("operator (2 replicas, Lease, webhook via Service)", "real containers"))

    cluster.kubectl("create", "namespace", NS, check=False)
    secret = create_s3_secret(cluster.kubectl, NS, s3.access_key, s3.secret_key)
    # Model pods that fetch from the store get read-only credentials, never the publish ones.
    create_s3_secret(
        cluster.kubectl, NS, s3.reader_access_key, s3.reader_secret_key, SERVING_SECRET
    )

    step(f"3. Tune for the real node's model: a profile in the stand-in image ({STANDIN_IMAGE})")
    print(
        "NOTE: the stand-in image's torch follows TunableOp's file formats and offline API but "
        "computes nothing; everything it writes says +standin, so no real torch would load it."
    )
    profile = standin_profile(s3, secret)
    print(yaml.safe_dump(profile, sort_keys=False).rstrip())
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(profile))
    eventually(
        lambda: get(cluster, "tp", "-n", NS, "standin-llm"),
        lambda p: (p.get("status") or {}).get("phase") in ("Ready", "Failed"),
        "standin-llm Ready",
        timeout=300,
        interval=1,
    )
    show(cluster, "get", "pods", "-n", NS, "-l", "tunefleet.io/tuning-profile=standin-llm")
    show(cluster, "get", "tuningprofiles", "-n", NS)
    show(cluster, "get", "tuningprofiles", "-n", NS, "-o", "wide")
    WHERE.append(("tuning Job: bootstrap, sync, tune (stand-in torch), publish", "real containers"))
    plugin(cluster, s3, "status", "standin-llm", "-n", NS)

    step("4. Serve: a model Deployment labelled tunefleet.io/profile=standin-llm")
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(model_deployment()))
    pod = eventually(
        lambda: [
            p
            for p in get(cluster, "pods", "-n", NS, "-l", "app=standin-llm")["items"]
            if (p.get("status") or {}).get("phase") == "Running"
        ],
        lambda ps: len(ps) == 1,
        "the model pod Running",
        timeout=180,
        interval=1,
    )[0]
    name = pod["metadata"]["name"]
    art = get(cluster, "tp", "-n", NS, "standin-llm")["status"]["artifacts"][0]
    print(
        f"the artifact's delivery: {art.get('delivery')} {art.get('configMap', {}).get('name', '')}"
    )
    print(
        "the model pod mounts it: no init container, no storage credentials, no store request "
        f"(init containers: {[c['name'] for c in pod['spec'].get('initContainers') or []]})"
    )
    show(cluster, "logs", "-n", NS, name, "-c", "server")
    WHERE.append(("model pod: artifact from its ConfigMap, stand-in server", "real containers"))
    plugin(cluster, s3, "why", name, "-n", NS)

    step("5. The kwok fleet: examples/tuningprofile-nvidia.yaml on a fake H100 node")
    cluster.kubectl("apply", "-n", NS, "-f", str(ROOT / "examples/tuningprofile-nvidia.yaml"))
    kwok_pod = eventually(
        lambda: get(cluster, "pods", "-n", NS, "-l", "tunefleet.io/tuning-profile=mistral-7b-cuda")[
            "items"
        ],
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "the kwok tuning pod",
    )[0]
    print(f"scheduled on {kwok_pod['spec']['nodeName']} (kwok: no container runs there).")
    print(f"NOTE: {STAND_IN_NOTE}; the pod's own publish command runs here, for real, against S3.")
    carry_out_publish(cluster.kubectl, kwok_pod, s3.env())
    eventually(
        lambda: get(cluster, "tp", "-n", NS, "mistral-7b-cuda"),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "mistral-7b-cuda Ready",
    )
    show(cluster, "get", "tuningprofiles", "-n", NS)
    WHERE.append(("kwok tuning pod: scheduling (real), publish (carried out here)", "kwok"))

    step("Where each step ran")
    for what, where in WHERE:
        print(f"  {where:16} {what}")

    step("Done: what the demo leaves")
    stop_what_runs(cluster)
    print(f"The demo took {time.monotonic() - started:.0f}s. The cluster is still up; nothing")
    print("of the demo's runs there:")
    print(f"  - Deployment {NS}/standin-llm: scaled to 0, so it holds none of {REAL_NODE}'s")
    print(f"    fake GPUs (`kubectl scale deployment -n {NS} standin-llm --replicas=1` brings")
    print("    its pod back, which gets the artifact again once an operator runs);")
    print(f"  - the chart (release {RELEASE} in {SYSTEM_NS}): uninstalled, so the README's")
    print("    `helm install` finds the name free; the TuningProfile CRD stays;")
    print(f"  - in namespace {NS}: the TuningProfiles standin-llm and mistral-7b-cuda (Ready),")
    print("    their finished Jobs, and the s3-credentials Secret; their artifacts in S3.")
    holders = real_node_gpu_holders(cluster)
    held = ", ".join(f"{name} ({gpus}, {state})" for name, gpus, state in holders)
    print(f"Pods holding {REAL_NODE}'s fake GPUs now: {held or 'none'}.")
    print(f"  export KUBECONFIG={cluster.kubeconfig}")
    print(f"  {cluster.bin_dir}/kubectl get tuningprofiles,jobs,pods -n {NS} -o wide")
    print('`make run` runs the operator here; README.md, "Using it", installs the chart.')
    print("Clean up with:  make cluster-down   (stops every process cluster-up started)")


def stop_what_runs(cluster: Cluster) -> None:
    """Scale the model Deployment to 0 and wait until its pod is gone (it held 2 of the real
    node's fake GPUs, which `make test` needs), then uninstall the chart."""
    cluster.kubectl("scale", "deployment", "-n", NS, "standin-llm", "--replicas=0")
    eventually(
        lambda: get(cluster, "pods", "-n", NS, "-l", "app=standin-llm")["items"],
        lambda ps: not ps,
        "the model pod gone",
        timeout=120,
        interval=1,
    )
    uninstall_release(cluster)


def standin_profile(s3: S3Settings, secret: str) -> dict[str, Any]:
    return {
        "apiVersion": "tunefleet.io/v1alpha1",
        "kind": "TuningProfile",
        "metadata": {"name": "standin-llm"},
        "spec": {
            "image": STANDIN_IMAGE,
            "imagePullPolicy": "Never",
            "gpu": {"vendor": "nvidia", "models": [REAL_NODE_GPU_MODEL]},
            "workload": {
                "shapes": [
                    {"mnk": [m, n, k], "dtype": "bfloat16", "transB": True}
                    for m in (1, 16, 128)
                    for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))
                ],
                # The stand-in offers kernels besides Default on its "ROCm" backend.
                "env": [{"name": "FAKE_TORCH_BACKEND", "value": "rocm"}],
            },
            "tuning": {"budgetSeconds": 300, "activeDeadlineSeconds": 600},
            "storage": {
                "uri": f"s3://{s3.bucket}/demo",
                "endpoint": s3.pod_endpoint,
                "credentialsSecret": {"name": secret},
            },
        },
    }


def model_deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "standin-llm"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "standin-llm"}},
            "template": {
                "metadata": {
                    "labels": {"app": "standin-llm", "tunefleet.io/profile": "standin-llm"}
                },
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": REAL_NODE_GPU_MODEL},
                    "containers": [
                        {
                            "name": "server",
                            "image": STANDIN_IMAGE,
                            "imagePullPolicy": "Never",
                            "resources": {"limits": {"nvidia.com/gpu": "2"}},
                        }
                    ],
                },
            },
        },
    }


if __name__ == "__main__":
    main()
