"""Tuning Jobs through a real Kueue (testbed/kueue.py runs it beside the cluster): a
profile of two models on a ClusterQueue with one GPU of quota runs one Job, the other waits
Queued with Kueue's own reason and runs when the first one frees the quota; the real node's
Job goes through Kueue and publishes for real.

kwok stands in for the fleet's GPU nodes (the pods' steps are carried out here, see
testbed/operator.py); Kueue, the scheduler and the Job controller are real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.builders.fleet import profile_doc
from testbed.cluster import KWOK_TOLERATION, wait_for_real_node_gpus
from testbed.kueue import GROUP, Kueue, start_kueue
from testbed.operator import InCluster, Operator, carry_out_publish
from testbed.poll import eventually
from testbed.real_node import real_profile
from tests.support.kube import apply, get_json, jobs_of, ready, tuning_pods
from tunefleet.builders.kueue import QUEUE_LABEL

pytestmark = pytest.mark.e2e

H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"


@pytest.fixture(scope="module")
def kueue(cluster: Any) -> Iterator[Kueue]:
    k = start_kueue(cluster)
    yield k
    k.stop()


@pytest.fixture
def queued(kueue: Kueue, cluster: Any, namespace: str) -> Iterator[Kueue]:
    """Kueue for one test: its queues and Workloads go before the test's namespace does
    (Kueue holds finalizers on them, and only a running Kueue removes them)."""
    yield kueue
    cluster.kubectl("delete", "tp,jobs", "--all", "-n", namespace, "--wait=false", check=False)
    eventually(
        lambda: get_json(cluster, f"workloads.{GROUP}", "-n", namespace)["items"],
        lambda items: not items,
        "the test's Workloads gone",
        timeout=90,
        interval=1,
    )
    kueue.clean()


def job_lines(profile: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {j["gpuModel"]: j for j in (profile.get("status") or {}).get("jobs") or []}


def test_the_second_model_waits_queued_with_kueues_reason_and_runs_when_quota_frees(
    cluster: Any, operator: Operator, s3: Any, namespace: str, queued: Kueue
) -> None:
    # The flavor puts Kueue's own node label and toleration on the pods it admits: the
    # operator must take the Jobs Kueue changed as its own, unchanged in name and meaning.
    lq = queued.queue(
        namespace, gpus=1, node_labels={"type": "kwok"}, tolerations=[KWOK_TOLERATION]
    )
    doc = profile_doc(
        "queued",
        gpu={"vendor": "nvidia", "models": [H100, H200]},
        tuning={"backoffLimit": 0, "queueName": lq},
    )
    apply(cluster, namespace, doc)
    jobs = eventually(
        lambda: jobs_of(cluster, namespace, "queued"),
        lambda js: len(js) == 2,
        "both Jobs made",
    )
    assert all(j["metadata"]["labels"][QUEUE_LABEL] == lq for j in jobs)
    (first,) = eventually(
        lambda: tuning_pods(cluster, namespace, "queued"),
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "one tuning pod admitted by Kueue and scheduled",
        timeout=90,
    )
    first_model = first["spec"]["nodeSelector"]["nvidia.com/gpu.product"]
    second_model = H200 if first_model == H100 else H100
    assert first["spec"]["nodeSelector"]["type"] == "kwok"  # Kueue's flavor label
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "queued"),
        # Queued at once; Kueue's reason once it has made the Workload (read again each
        # reconcile until then).
        # The phase is Tuning once the first Job is seen running (the Job controller's word
        # may come after Kueue's on the second).
        lambda p: (
            job_lines(p).get(second_model, {}).get("reason") == "Queued"
            and "insufficient unused quota" in job_lines(p)[second_model].get("message", "")
            and (p.get("status") or {}).get("phase") == "Tuning"
        ),
        "the second model Queued with Kueue's reason",
        timeout=60,
    )
    line = job_lines(prof)[second_model]
    assert f"queued in Kueue LocalQueue {lq}" in line["message"], line
    assert "insufficient unused quota for nvidia.com/gpu" in line["message"], line
    assert line["state"] == "Pending"
    progressing = next(c for c in prof["status"]["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "Queued" and "queued in Kueue" in progressing["message"]
    assert prof["status"]["phase"] == "Tuning"
    failed = next(c for c in prof["status"]["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "False"
    waiting = next(
        j for j in jobs_of(cluster, namespace, "queued") if j["metadata"]["name"] == line["name"]
    )
    assert waiting["spec"]["suspend"] is True  # Kueue's to resume, never the operator's

    carry_out_publish(cluster.kubectl, first, s3.env())
    (second,) = eventually(
        lambda: [
            p
            for p in tuning_pods(cluster, namespace, "queued")
            if p["metadata"]["uid"] != first["metadata"]["uid"]
        ],
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "the second Job admitted once the first freed the quota",
        timeout=120,
    )
    assert second["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == second_model
    carry_out_publish(cluster.kubectl, second, s3.env())
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "queued"),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "Ready",
        timeout=90,
    )
    assert {a["gpuModel"] for a in prof["status"]["artifacts"]} == {H100, H200}
    # The Jobs are the ones made at first: the same names, never made again.
    assert {j["metadata"]["name"] for j in jobs_of(cluster, namespace, "queued")} == {
        j["metadata"]["name"] for j in jobs
    }
    workloads = get_json(cluster, f"workloads.{GROUP}", "-n", namespace)["items"]
    assert len(workloads) == 2
    for wl in workloads:
        conds = {c["type"]: c["status"] for c in wl["status"]["conditions"]}
        assert conds.get("Admitted") == "True" and conds.get("Finished") == "True", conds


def test_the_real_nodes_job_goes_through_kueue_and_publishes(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str, queued: Kueue
) -> None:
    wait_for_real_node_gpus(cluster, 1)
    lq = queued.queue(namespace, gpus=1)
    apply(
        cluster,
        namespace,
        real_profile(
            "real-queued",
            s3,
            s3_secret,
            tuning={
                "backoffLimit": 0,
                "budgetSeconds": 300,
                "activeDeadlineSeconds": 600,
                "queueName": lq,
            },
        ),
    )
    prof = ready(cluster, namespace, "real-queued", timeout=240)
    assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"], indent=2)[:4000]
    (job,) = jobs_of(cluster, namespace, "real-queued")
    assert job["metadata"]["labels"][QUEUE_LABEL] == lq
    assert job["spec"]["suspend"] is False  # resumed by Kueue
    (wl,) = get_json(cluster, f"workloads.{GROUP}", "-n", namespace)["items"]
    owner = next(r for r in wl["metadata"]["ownerReferences"] if r.get("controller"))
    assert owner["uid"] == job["metadata"]["uid"]
    conds = {c["type"]: c["status"] for c in wl["status"]["conditions"]}
    assert conds.get("Admitted") == "True" and conds.get("Finished") == "True", conds
    (art,) = prof["status"]["artifacts"]
    assert art["outcomes"]["tuned"] > 0 and art["job"] == job["metadata"]["name"]
