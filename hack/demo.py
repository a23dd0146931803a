"""`make demo`: the whole tunefleet flow on the local control plane, narrated.

Everything is real except what this machine cannot do: containers do not run on kwok's fake
nodes and there is no GPU, so the tuning pod's tune step is stood in for by a recorded
results file (said so when it happens), and its publish step is run here with the pod's own
command against the real S3 server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.cluster import Cluster, S3Settings, ensure_cluster, ensure_s3  # noqa: E402
from tests.support.operator import (  # noqa: E402
    STAND_IN_NOTE,
    carry_out_publish,
    create_s3_secret,
    install,
    tool_env,
)
from tests.support.poll import eventually  # noqa: E402

NS = "demo"


def step(title: str) -> None:
    print(f"\n\033[1m== {title}\033[0m", flush=True)


def show(cluster: Cluster, *args: str) -> str:
    out = cluster.kubectl(*args).stdout
    print(f"$ kubectl {' '.join(args)}\n{out.rstrip()}")
    return out


def gpu_present() -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def main() -> None:
    started = time.monotonic()
    cluster, s3 = ensure_cluster(), ensure_s3()

    step("1. The local control plane: a real kube-apiserver and a fake mixed GPU fleet (kwok)")
    print(cluster.kubectl("version").stdout.strip())
    show(cluster, "get", "nodes", "-L", "amd.com/gpu.product-name,nvidia.com/gpu.product")

    step("2. Install the chart; the operator runs here as the chart's ServiceAccount")
    operator = install(cluster, s3.endpoint)
    print(f"operator PID {operator.proc.pid if operator.proc else '?'}, log {operator.log}")
    try:
        run_flow(cluster, s3)
    finally:
        operator.stop()
    step("Done")
    print(f"The demo took {time.monotonic() - started:.0f}s. The cluster is still up:")
    print(f"  export KUBECONFIG={cluster.kubeconfig}")
    print(f"  {cluster.bin_dir}/kubectl get tuningprofiles,jobs,pods -n {NS} -o wide")
    print("Clean up with:  make cluster-down   (stops every process cluster-up started)")


def run_flow(cluster: Cluster, s3: S3Settings) -> None:
    env = s3.env()
    cluster.kubectl("create", "namespace", NS, check=False)
    create_s3_secret(cluster.kubectl, NS, s3.access_key, s3.secret_key)

    step("3. Apply a TuningProfile (examples/tuningprofile-nvidia.yaml)")
    print((ROOT / "examples/tuningprofile-nvidia.yaml").read_text())
    cluster.kubectl("apply", "-n", NS, "-f", str(ROOT / "examples/tuningprofile-nvidia.yaml"))

    step("4. The operator made one tuning Job, scheduled on a node with that GPU model")
    sel = "tunefleet.io/tuning-profile=mistral-7b-cuda"
    pods = eventually(
        lambda: json.loads(
            cluster.kubectl("get", "pods", "-n", NS, "-l", sel, "-o", "json").stdout
        )["items"],
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "the tuning pod",
    )
    show(cluster, "get", "jobs", "-n", NS, "-o", "wide")
    show(cluster, "get", "pods", "-n", NS, "-l", sel, "-o", "wide")
    show(cluster, "get", "node", pods[0]["spec"]["nodeName"], "-L", "nvidia.com/gpu.product")

    step("5. The tuning pod's steps: tune, then publish to S3")
    if gpu_present():
        print(
            "A GPU is present, but kwok's fake nodes run no containers; see scripts/gpu-check.sh "
            "for the real TunableOp path on this GPU."
        )
    print(f"NOTE: {STAND_IN_NOTE}.")
    result = carry_out_publish(cluster.kubectl, pods[0], env)
    print("publish (the pod's own command, run for real) wrote the termination message:")
    print(json.dumps(result, indent=2))

    step("6. The profile is Ready with its artifact")
    eventually(
        lambda: json.loads(
            cluster.kubectl("get", "tp", "-n", NS, "mistral-7b-cuda", "-o", "json").stdout
        ),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "Ready",
    )
    show(cluster, "get", "tuningprofiles", "-n", NS)
    show(cluster, "get", "tuningprofiles", "-n", NS, "-o", "wide")

    step("7. Deploy a model that references the profile (examples/model-deployment.yaml)")
    cluster.kubectl("apply", "-n", NS, "-f", str(ROOT / "examples/model-deployment.yaml"))
    pod = eventually(
        lambda: json.loads(
            cluster.kubectl("get", "pods", "-n", NS, "-l", "app=mistral-7b", "-o", "json").stdout
        )["items"],
        lambda ps: len(ps) == 1,
        "the model pod",
    )[0]
    spec = pod["spec"]
    print("Injected init container (from the stored pod):")
    print(json.dumps(spec["initContainers"][0], indent=2))
    print("App container env and mounts:")
    print(
        json.dumps(
            {
                "env": spec["containers"][0]["env"],
                "volumeMounts": spec["containers"][0]["volumeMounts"],
            },
            indent=2,
        )
    )
    print("Volumes:", json.dumps(spec["volumes"]))
    print(
        "Annotations:",
        json.dumps(
            {k: v for k, v in pod["metadata"]["annotations"].items() if k.startswith("tunefleet")},
            indent=2,
        ),
    )

    step("8. Run that init container's fetch for real")
    cmd = list(spec["initContainers"][0]["command"])
    dest = Path(tempfile.mkdtemp(prefix="tunefleet-demo-"))
    cmd[cmd.index("--dest") + 1] = str(dest)
    print("$ " + " ".join(cmd))
    done = subprocess.run(cmd, env=tool_env(env), capture_output=True, text=True, timeout=120)
    print((done.stdout + done.stderr).strip())
    for f in sorted(dest.iterdir()):
        print(f"  {f}  {f.stat().st_size} bytes")
    if done.returncode != 0:
        raise SystemExit("fetch failed")


if __name__ == "__main__":
    main()
