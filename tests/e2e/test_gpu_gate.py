"""The GPU gate on the local control plane (placement/gate.py): with every GPU of a model held
by one profile's tuning Job, the next profile's Job is made suspended, with no pod for the
scheduler to retry, and status says why (phase Queued, WaitingForGPU) with no Warning; when
the first Job ends, the operator starts the waiting one and it runs to Ready.

Real kube-apiserver, scheduler, Job controller and GC; the model's one kwok node advertises 8
GPUs. Containers do not run on kwok nodes: the test plays each tuning pod's publish step
(testbed/operator.py) with a stand-in results file, as test_operator.py does.
"""

from __future__ import annotations

from typing import Any

import pytest

from testbed.builders.fleet import profile_doc
from testbed.operator import Operator, carry_out_publish
from testbed.poll import eventually
from tests.support.kube import apply, events_about, get_json, jobs_of, tuning_pods
from tunefleet import naming

pytestmark = pytest.mark.e2e

# One kwok node (kwok-mi325x-0, hack/fleet.yaml) with amd.com/gpu: 8.
MODEL = "AMD_Instinct_MI325X_OAM"
WHOLE_NODE = {"vendor": "amd", "models": [MODEL], "count": 8}


def _held_elsewhere(cluster: Any, namespace: str) -> list[str]:
    """Started, unfinished tuning Jobs of MODEL outside this test's namespace (another test's,
    on its way out): they hold the GPUs the test needs."""
    jobs = get_json(cluster, "jobs", "-A", "-l", "app.kubernetes.io/managed-by=tunefleet")
    out = []
    for job in jobs["items"]:
        meta = job["metadata"]
        if meta["namespace"] == namespace or meta.get("deletionTimestamp"):
            continue
        if (meta.get("annotations") or {}).get(naming.MODEL_ANNOTATION) != MODEL:
            continue
        done = {c["type"] for c in (job.get("status") or {}).get("conditions") or []}
        if not job["spec"].get("suspend") and not done & {"Complete", "Failed"}:
            out.append(f"{meta['namespace']}/{meta['name']}")
    return out


def _profile(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict(get_json(cluster, "tp", "-n", namespace, name))


def _scheduled_pod(cluster: Any, namespace: str, profile: str) -> dict[str, Any]:
    (pod,) = eventually(
        lambda: tuning_pods(cluster, namespace, profile),
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        f"{profile}'s tuning pod on a node",
    )
    return dict(pod)


def _config_maps(cluster: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    items = get_json(cluster, "configmaps", "-n", namespace)["items"]
    return [c for c in items if c["metadata"]["name"] == name]


def test_a_job_waits_suspended_while_our_jobs_hold_every_gpu_then_runs_to_ready(
    cluster: Any, operator: Operator, s3: Any, namespace: str
) -> None:
    eventually(lambda: _held_elsewhere(cluster, namespace), lambda held: not held,
               f"no other test's tuning Job holding {MODEL}", timeout=180)  # fmt: skip
    apply(cluster, namespace, profile_doc("first", gpu=WHOLE_NODE))
    first_pod = _scheduled_pod(cluster, namespace, "first")

    # The model's 8 GPUs are first's: second's Job is made, suspended, with no pod.
    second_shapes = {"shapes": [{"mnk": [128, 64, 64]}]}
    apply(cluster, namespace, profile_doc("second", gpu=WHOLE_NODE, workload=second_shapes))
    waiting = eventually(
        lambda: _profile(cluster, namespace, "second"),
        lambda p: (
            [j.get("reason") for j in (p.get("status") or {}).get("jobs") or []]
            == ["WaitingForGPU"]
        ),
        "second's Job waiting for a GPU in status",
    )
    assert waiting["status"]["phase"] == "Queued"
    assert "held by tunefleet's tuning Jobs" in waiting["status"]["jobs"][0]["message"]
    (job,) = jobs_of(cluster, namespace, "second")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["annotations"][naming.GPU_GATE_ANNOTATION] == "true"
    assert tuning_pods(cluster, namespace, "second") == []
    # Its configuration is made when it starts: no pod mounts it before.
    name = job["metadata"]["name"]
    assert _config_maps(cluster, namespace, name) == []
    warnings = events_about(cluster, namespace, "second", type="Warning")
    assert warnings == [], [e["message"] for e in warnings]

    # first's Job ends: the gate starts second's, whose pod lands where first's was.
    carry_out_publish(cluster.kubectl, first_pod, s3.env())
    eventually(
        lambda: _profile(cluster, namespace, "first"),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "first Ready",
    )
    second_pod = _scheduled_pod(cluster, namespace, "second")
    (job,) = jobs_of(cluster, namespace, "second")
    assert not job["spec"].get("suspend")
    (config,) = _config_maps(cluster, namespace, name)
    assert "config.json" in config["data"]
    assert (
        config["metadata"]["ownerReferences"][0]["uid"]
        == job["metadata"]["ownerReferences"][0]["uid"]
    )
    eventually(
        lambda: events_about(cluster, namespace, "second", reason="TuningJobStarted"),
        lambda items: len(items) == 1,
        "one TuningJobStarted Event for second",
    )
    carry_out_publish(cluster.kubectl, second_pod, s3.env())
    ready = eventually(
        lambda: _profile(cluster, namespace, "second"),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "second Ready",
    )
    assert ready["status"]["artifacts"][0]["gpuModel"] == MODEL
