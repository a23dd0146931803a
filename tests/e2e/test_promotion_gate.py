"""The promotion gate on the real node, with the stand-in torch's timing knob: the tuning Job
measures for real (tuner_job/measure.py times the stand-in's GEMMs with TunableOp off and on),
but what it times is the knob's sleep (FAKE_TORCH_GEMM_SLEEP, FAKE_TORCH_TUNED_SPEEDUP), so every
figure says stand-in: no real gain is claimed.

A profile's first artifact is faster with its results and serves; a changed spec's artifact is
slower, is kept in history, never served, and Ready says which figure failed and by how much;
new model pods still get the first. `kubectl tunefleet rollback --to <second> --force` serves
the rejected one (pinned, and status says why); `kubectl tunefleet unpin` returns to the first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster import wait_for_real_node_gpus
from testbed.operator import InCluster
from testbed.poll import eventually
from testbed.real_node import SHAPES, model_pod, real_profile
from tests.support.kube import apply, create, get_json, pod_of, ready
from tunefleet.contracts.admission_record import ARTIFACT_SHA_ANNOTATION

pytestmark = pytest.mark.e2e

PLUGIN = Path(sys.executable).parent / "kubectl-tunefleet"


def knob(speedup: str, *more: dict[str, Any]) -> dict[str, Any]:
    return {
        "shapes": [*SHAPES, *more],
        "env": [
            {"name": "FAKE_TORCH_BACKEND", "value": "rocm"},
            {"name": "FAKE_TORCH_GEMM_SLEEP", "value": "0.002"},
            {"name": "FAKE_TORCH_TUNED_SPEEDUP", "value": speedup},
        ],
    }


def plugin(cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig}
    done = subprocess.run([str(PLUGIN), *args], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    print(
        f"$ kubectl tunefleet {' '.join(args)}  (exit {done.returncode})\n{done.stdout}{done.stderr}"
    )
    return done


def served(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    (art,) = get_json(cluster, "tp", "-n", namespace, name)["status"]["artifacts"]
    return dict(art)


def serving(cluster: Any, namespace: str, name: str, sha: str) -> dict[str, Any]:
    """The profile's served artifact once it is `sha` (a pin or unpin is acted on)."""
    return dict(eventually(lambda: served(cluster, namespace, name),
                           lambda art: art["sha256"] == sha, f"{name} to serve {sha[:12]}",
                           timeout=120, interval=1))  # fmt: skip


def admitted_sha(cluster: Any, namespace: str, pod: str, profile: str, want: str) -> str:
    """The artifact the webhook pins a new model pod to, once it pins `want`: the replicas
    read the profile from their caches, a moment behind the status just written."""
    tries = iter(range(1000))

    def admit() -> str:
        name = f"{pod}-{next(tries)}"
        create(cluster, namespace, model_pod(name, profile))
        anns = pod_of(cluster, namespace, name)["metadata"]["annotations"]
        cluster.kubectl("delete", "pod", "-n", namespace, name, "--wait=false")
        return str(anns.get(ARTIFACT_SHA_ANNOTATION, ""))

    return str(eventually(admit, lambda sha: sha == want, f"{pod} to get {want[:12]}",
                          timeout=60, interval=2))  # fmt: skip


def test_a_slower_artifact_is_never_served_then_rollback_and_unpin(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    wait_for_real_node_gpus(cluster, 2)
    profile = real_profile("gated", s3, s3_secret, workload=knob("3"))
    apply(cluster, namespace, profile)
    first = ready(cluster, namespace, "gated", timeout=300)
    assert first["status"]["phase"] == "Ready", first["status"]
    a = served(cluster, namespace, "gated")
    gain = a["gain"]
    assert gain["standIn"] is True  # the stand-in's timings: never a real gain
    (fig,) = [f for f in gain["figures"] if f["name"] == "gemms"]
    assert fig["speedup"] > 1.05 and fig["repetitions"] >= 5, fig
    assert a["promotion"]["verdict"] == "Passed"
    wide = cluster.kubectl("get", "tp", "-n", namespace, "gated", "-o", "wide").stdout
    assert "GAIN" in wide and "stand-in" in wide, wide

    # A changed spec (a new revision, one more GEMM: other bytes) whose "tuned" kernels are
    # slower: measured, refused.
    profile["spec"]["workload"] = knob("0.4", {"mnk": [96, 256, 512], "dtype": "bfloat16"})
    apply(cluster, namespace, profile)
    rejected = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "gated"),
        lambda p: (p.get("status") or {}).get("phase") == "Rejected",
        "the second artifact to be rejected",
        timeout=300,
        interval=2,
    )["status"]
    assert [x["sha256"] for x in rejected["artifacts"]] == [a["sha256"]]
    assert rejected["history"], json.dumps(rejected, indent=1)[:6000]
    b = rejected["history"][0]
    assert b["sha256"] != a["sha256"] and b["promotion"]["verdict"] == "Rejected"
    message = next(c for c in rejected["conditions"] if c["type"] == "Ready")
    assert message["reason"] == "PromotionRejected", message
    assert "gemms 0." in message["message"] and "% below" in message["message"], message
    assert f"{a['sha256'][:12]} keeps serving" in message["message"]
    assert admitted_sha(cluster, namespace, "after-reject", "gated", a["sha256"])

    # Rollback to the rejected one (forced), then unpin.
    refused = plugin(cluster, "rollback", "gated", "-n", namespace, "--to", b["sha256"][:12])
    assert refused.returncode != 0 and "--force" in refused.stdout + refused.stderr
    done = plugin(cluster, "rollback", "gated", "-n", namespace, "--to", b["sha256"][:12],
                  "--force", "--reason", "e2e")  # fmt: skip
    assert done.returncode == 0
    pinned = serving(cluster, namespace, "gated", b["sha256"])
    assert pinned["pinned"]["reason"] == "e2e" and pinned["promotion"]["verdict"] == "Pinned"
    assert admitted_sha(cluster, namespace, "after-rollback", "gated", b["sha256"])
    status = plugin(cluster, "status", "gated", "-n", namespace)
    assert status.returncode == 0 and "stand-in" in status.stdout

    assert plugin(cluster, "unpin", "gated", "-n", namespace).returncode == 0
    back = serving(cluster, namespace, "gated", a["sha256"])
    assert "pinned" not in back
    assert admitted_sha(cluster, namespace, "after-unpin", "gated", a["sha256"])


# Crashes (SIGSEGV) only in the measured arm with the artifact: TunableOp on with results,
# tuning and recording off. The tuning run (recording) and the arm without it run clean.
CRASHES_WITH_RESULTS = (
    "import os, signal; e = os.environ.get; "
    "on = (e('PYTORCH_TUNABLEOP_ENABLED'), e('PYTORCH_TUNABLEOP_TUNING'), "
    "e('PYTORCH_TUNABLEOP_RECORD_UNTUNED')) == ('1', '0', '0'); "
    "on and os.kill(os.getpid(), signal.SIGSEGV)"
)


def test_an_artifact_that_crashes_its_workload_is_rejected_never_served(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    """Issue 40: the gate failed open. A workload that crashed with the artifact made it "not
    measured", and it was promoted. Now it is Rejected with the cause, and no pod gets it."""
    wait_for_real_node_gpus(cluster, 2)
    workload = {**knob("3"), "command": ["python3", "-c", CRASHES_WITH_RESULTS]}
    apply(cluster, namespace, real_profile("crashing", s3, s3_secret, workload=workload,
                                          promotion={"budgetSeconds": 60}))  # fmt: skip
    st = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "crashing").get("status") or {},
        lambda s: bool(s.get("history")),
        "the crashing artifact judged",
        timeout=300,
        interval=2,
    )
    (rejected,) = st["history"]
    assert rejected["promotion"]["verdict"] == "Rejected", rejected
    assert rejected["gain"]["failed"]["figure"] == "workload", rejected["gain"]
    assert "killed by SIGSEGV with the artifact loaded" in rejected["gain"]["failed"]["cause"]
    assert st["artifacts"] == [] and st["phase"] == "Rejected", st
    cond = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert cond["reason"] == "PromotionRejected", cond
    assert (
        "workload failed with the artifact: the workload was killed by SIGSEGV" in cond["message"]
    )
    create(cluster, namespace, model_pod("not-served", "crashing"))
    anns = pod_of(cluster, namespace, "not-served")["metadata"]["annotations"]
    assert ARTIFACT_SHA_ANNOTATION not in anns, anns  # nothing of it reaches a pod
    assert anns["tunefleet.io/status"].startswith("untuned"), anns
