"""Fleet-wide reuse through the operator: a sharded profile on two nodes of one model, a pod
lost mid-tuning that resumes from its checkpoint, a second profile that reuses the first's
GEMMs, and a parallelism larger than the model's nodes.

kwok's fake MI300X nodes (two of them) place the pods; their steps (the sync sidecar, the
tuner with the stand-in torch, publish, merge) run on this machine with each pod's own
command against the real S3 server (testbed/operator.py: carry_out_tuning_pod). The
stand-in torch computes nothing; its results say so.
"""

from __future__ import annotations

from typing import Any

import pytest

from testbed.builders.fleet import profile_doc
from testbed.operator import Operator, carry_out_merge, carry_out_tuning_pod
from testbed.poll import eventually
from tests.support.kube import apply, condition, get_json, tuning_pods

pytestmark = pytest.mark.e2e

MI300X = "AMD_Instinct_MI300X_OAM"
ROCM = {"FAKE_TORCH_BACKEND": "rocm"}


def shapes(indices: range) -> list[dict[str, Any]]:
    return [
        {"mnk": [64 + 16 * (i % 64), 128 + 16 * (i // 64), 64], "transB": True} for i in indices
    ]


def sharded(
    name: str, s3: Any, secret: str, parallelism: int, n: range, **over: Any
) -> dict[str, Any]:
    return profile_doc(
        name,
        image="tunefleet.local/standin-inference:2.11.0-standin",
        gpu={"vendor": "amd", "models": [MI300X], "parallelism": parallelism},
        workload={"shapes": shapes(n)},
        tuning={"backoffLimit": 2, "checkpoint": {"everyGemms": 5}},
        storage={"uri": f"s3://{s3.bucket}/sharding", "credentialsSecret": {"name": secret}},
        **over,
    )


def pods_of(cluster: Any, namespace: str, name: str, role: str = "tune") -> list[dict[str, Any]]:
    return [
        p
        for p in tuning_pods(cluster, namespace, name)
        if p["metadata"]["labels"].get("tunefleet.io/role", "tune") == role
        and p["spec"].get("nodeName")
        and not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]


def test_a_sharded_profile_tunes_disjoint_shares_on_two_nodes_and_merges_one_artifact(
    cluster: Any, operator: Operator, s3: Any, namespace: str, s3_secret: str
) -> None:
    apply(cluster, namespace, sharded("wide", s3, s3_secret, 2, range(24)))
    pods = eventually(
        lambda: pods_of(cluster, namespace, "wide"),
        lambda ps: len(ps) == 2,
        "two shard pods placed",
    )
    assert pods[0]["spec"]["nodeName"] != pods[1]["spec"]["nodeName"]  # a node each
    first = carry_out_tuning_pod(cluster.kubectl, pods[0], s3.env(), ROCM)
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "wide"),
        lambda p: "1/2 shards" in ((p.get("status") or {}).get("progress") or ""),
        "progress 1/2 shards",
    )
    assert "1/2" in cluster.kubectl("get", "tp", "-n", namespace, "wide").stdout
    second = carry_out_tuning_pod(cluster.kubectl, pods[1], s3.env(), ROCM)
    assert set(first.tuned).isdisjoint(second.tuned)
    assert len(first.tuned) + len(second.tuned) == 24
    assert abs(len(first.tuned) - len(second.tuned)) <= 4  # balanced by estimated cost
    (merge,) = eventually(
        lambda: pods_of(cluster, namespace, "wide", role="merge"),
        lambda ps: len(ps) == 1,
        "the merge Job's pod",
    )
    result = carry_out_merge(cluster.kubectl, merge, s3.env())
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "wide"),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "wide Ready",
    )
    (art,) = prof["status"]["artifacts"]
    assert art["sha256"] == result["sha256"] and art["shards"] == 2
    assert art["gemms"] == 24 and art["newlyTuned"] == 24 and art["reused"] == 0

    # A second profile of the same software identity reuses what the first tuned.
    apply(cluster, namespace, sharded("reuser", s3, s3_secret, 1, range(16, 32)))
    (pod,) = eventually(
        lambda: pods_of(cluster, namespace, "reuser"), lambda ps: len(ps) == 1, "reuser's pod"
    )
    again = carry_out_tuning_pod(cluster.kubectl, pod, s3.env(), ROCM)
    assert len(again.tuned) == 8  # 16..23 came from the library
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "reuser"),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "reuser Ready",
    )
    (art,) = prof["status"]["artifacts"]
    assert (art["reused"], art["newlyTuned"], art["recorded"]) == (8, 8, 16)
    wide = cluster.kubectl("get", "tp", "-n", namespace, "reuser", "-o", "wide").stdout
    assert "8/16" in wide  # REUSED


def test_a_pod_lost_mid_tuning_resumes_from_its_checkpoint(
    cluster: Any, operator: Operator, s3: Any, namespace: str, s3_secret: str
) -> None:
    apply(cluster, namespace, sharded("resume", s3, s3_secret, 1, range(40)))
    (pod,) = eventually(
        lambda: pods_of(cluster, namespace, "resume"), lambda ps: len(ps) == 1, "the pod"
    )
    slow = {**ROCM, "FAKE_TORCH_TUNE_SLEEP": "0.05"}
    lost = carry_out_tuning_pod(cluster.kubectl, pod, s3.env(), slow, kill_after_gemms=20)
    assert lost.tune_rc != 0 and 20 <= len(lost.tuned) < 40
    # The Job makes a new pod for the index (backoffLimit 2); it resumes.
    (retry,) = eventually(
        lambda: [
            p
            for p in pods_of(cluster, namespace, "resume")
            if p["metadata"]["uid"] != pod["metadata"]["uid"]
        ],
        lambda ps: len(ps) == 1,
        "the retried pod",
        timeout=90,
    )
    again = carry_out_tuning_pod(cluster.kubectl, retry, s3.env(), slow)
    twice = set(lost.tuned) & set(again.tuned)
    # At most a checkpoint interval's worth (5), and the GEMM in flight when the pod died
    # (its log names it; its result never reached a checkpoint).
    assert len(twice) <= 5 + 1, f"{len(twice)} GEMMs tuned twice, checkpoint interval is 5"
    assert len(set(lost.tuned) | set(again.tuned)) == 40
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "resume"),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "resume Ready",
    )
    (art,) = prof["status"]["artifacts"]
    assert art["resumed"] >= 15 and art["resumed"] + art["newlyTuned"] == 40


def test_parallelism_above_the_nodes_of_a_model_is_refused_with_the_count(
    cluster: Any, operator: Operator, s3: Any, namespace: str, s3_secret: str
) -> None:
    apply(cluster, namespace, sharded("too-wide", s3, s3_secret, 3, range(4)))
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "too-wide"),
        lambda p: condition(p, "Ready").get("reason") == "ParallelismTooHigh",
        "ParallelismTooHigh",
    )
    assert (
        "spec.gpu.parallelism is 3 but 2 node(s) have amd.com/gpu.product-name="
        in condition(prof, "Ready")["message"]
    )
    assert tuning_pods(cluster, namespace, "too-wide") == []
