"""Model pods as they are deployed, on the real node: a Deployment that selects its GPU model
with a required node affinity is served without a nodeSelector added; a pod whose affinity
allows two models of its profile gets the artifact of the node it lands on, picked there by
its init container from the node map (the Downward API gives it its node; no credentials).

The profile's second model is a kwok one (NVIDIA H100): its tuning pod's publish step is
carried out here with a stand-in results file (testbed/operator.py), so both models
have an artifact and the pick has a real choice to make.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from testbed.cluster import (
    REAL_NODE,
    REAL_NODE_GPU_MODEL,
    STANDIN_IMAGE,
    wait_for_real_node_gpus,
)
from testbed.operator import InCluster, carry_out_publish
from testbed.poll import eventually
from testbed.real_node import KEY, real_profile
from tests.support.kube import apply, create, ended, get_json, ready, statuses, tuning_pods
from tunefleet.contracts import nodemap
from tunefleet.contracts.admission_record import Admission
from tunefleet.contracts.fetch_outcome import CONTAINER, LOADED, FetchOutcome
from tunefleet.plugin.why_cmd import explain

pytestmark = pytest.mark.e2e

H100 = "NVIDIA-H100-80GB-HBM3"  # a kwok node's model (hack/fleet.yaml)


@pytest.fixture(autouse=True)
def _real_node_gpus(cluster: Any) -> None:
    wait_for_real_node_gpus(cluster, 2)


def affinity(*models: str) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": KEY, "operator": "In", "values": list(models)}]}
                ]
            }
        }
    }


def server(gpus: int = 1) -> dict[str, Any]:
    return {
        "name": "server",
        "image": STANDIN_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["standin-server", "--once"],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }


def test_a_deployment_with_node_affinity_on_one_model_is_served_and_nothing_is_added(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    apply(cluster, namespace, real_profile("aff", s3, s3_secret))
    prof = ready(cluster, namespace, "aff")
    assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"])[:3000]
    template = {
        "metadata": {"labels": {"app": "llm", "tunefleet.io/profile": "aff"}},
        "spec": {
            # The common form: the model chosen by required node affinity, no nodeSelector.
            "affinity": affinity(REAL_NODE_GPU_MODEL),
            # Without --once the stand-in server reports, then sleeps: the Deployment stays up.
            "containers": [{**server(), "command": ["standin-server"]}],
        },
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "llm"}}, "template": template},
    }
    create(cluster, namespace, deployment)
    (pod,) = eventually(
        lambda: get_json(cluster, "pods", "-n", namespace, "-l", "app=llm")["items"],
        lambda ps: len(ps) == 1 and ps[0]["status"].get("phase") == "Running",
        "the Deployment's pod running",
        timeout=120,
        interval=1,
    )
    spec = pod["spec"]
    assert pod["metadata"]["labels"]["tunefleet.io/admission"] == "injected"
    assert KEY not in (spec.get("nodeSelector") or {})  # read, not added
    assert spec["affinity"] == template["spec"]["affinity"]
    assert spec["nodeName"] == REAL_NODE
    (art,) = prof["status"]["artifacts"]
    a = Admission.read(pod)
    assert a is not None and a.gpu_model == REAL_NODE_GPU_MODEL and a.sha256 == art["sha256"]
    log = eventually(
        lambda: (
            cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"], "-c", "server").stdout
        ),
        lambda text: "tunableop_results0.csv" in text,
        "the server's log",
        timeout=60,
        interval=1,
    )
    assert "+standin" in log and "PYTORCH_TUNABLEOP_TUNING=0" in log


def test_a_pod_that_may_land_on_two_models_gets_its_nodes_artifact_picked_there(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    apply(
        cluster,
        namespace,
        real_profile(
            "two", s3, s3_secret, gpu={"vendor": "nvidia", "models": [REAL_NODE_GPU_MODEL, H100]}
        ),
    )
    # The kwok model's tuning pod cannot run here: its publish step is played by the test.
    kwok = eventually(
        lambda: [
            p
            for p in tuning_pods(cluster, namespace, "two")
            if (p["spec"].get("nodeSelector") or {}).get(KEY) == H100
        ],
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "the kwok model's tuning pod",
        timeout=60,
    )[0]
    carry_out_publish(cluster.kubectl, kwok, s3.env())
    prof = ready(cluster, namespace, "two", timeout=240)
    assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"])[:3000]
    shas = {a["gpuModel"]: a["sha256"] for a in prof["status"]["artifacts"]}
    assert set(shas) == {REAL_NODE_GPU_MODEL, H100} and len(set(shas.values())) == 2
    # The operator's node map for this namespace lists each model's nodes.
    name = nodemap.config_map_name(KEY)
    cm = eventually(
        lambda: get_json(cluster, "configmap", "-n", namespace, name),
        lambda c: REAL_NODE in nodemap.decode((c.get("data") or {}).get(REAL_NODE_GPU_MODEL, "")),
        "the node map to list the real node",
        timeout=60,
    )
    assert "kwok-h100-0" in nodemap.decode(cm["data"][H100])
    assert {r["uid"] for r in cm["metadata"]["ownerReferences"]} == {prof["metadata"]["uid"]}

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "either", "labels": {"tunefleet.io/profile": "two"}},
        "spec": {
            "restartPolicy": "Never",
            "affinity": affinity(REAL_NODE_GPU_MODEL, H100),
            # Lands on the real node (containers run only there); says nothing of the model.
            "nodeSelector": {"type": "real"},
            "containers": [server()],
        },
    }
    create(cluster, namespace, pod)
    done = ended(cluster, namespace, "either", "the pod that picks at its node")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["spec"]["nodeSelector"] == {"type": "real"}  # nothing added
    a = Admission.read(done)
    assert a is not None and a.candidates == shas and not a.gpu_model
    fetch = statuses(done)[CONTAINER]["state"]["terminated"]
    outcome = FetchOutcome.parse(fetch["message"])
    assert outcome is not None and outcome.verdict == LOADED, fetch
    assert (outcome.gpu_model, outcome.node) == (REAL_NODE_GPU_MODEL, REAL_NODE)
    assert outcome.sha256 == shas[REAL_NODE_GPU_MODEL]
    # No new credentials: both artifacts are mounted ConfigMaps, no store Secret anywhere.
    pick = next(c for c in done["spec"]["initContainers"] if c["name"] == CONTAINER)
    assert not any("secretKeyRef" in json.dumps(e) for e in pick.get("env") or [])
    log = cluster.kubectl("logs", "-n", namespace, "either", "-c", "server").stdout
    assert "tunableop_results0.csv" in log and "+standin" in log
    # `kubectl tunefleet why` reads what was picked from the termination message.
    report = explain(done, get_json(cluster, "tp", "-n", namespace, "two"), [])
    assert report["tuned"] is True and report["artifact"]["gpuModel"] == REAL_NODE_GPU_MODEL
