"""The operator on the local control plane: profiles to Jobs to Ready artifacts, as users see it.

Real kube-apiserver, scheduler, Job and GC controllers, kwok nodes, real S3. Containers don't
run on kwok nodes, so each tuning pod's publish step is carried out by the test (see
testbed/operator.py), with a stand-in results file since there is no GPU here.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from testbed.builders.fleet import profile_doc
from testbed.operator import (
    ROOT,
    STAND_IN_NOTE,
    SYSTEM_NS,
    Operator,
    carry_out_publish,
    helm,
    set_pod_outcome,
)
from testbed.poll import eventually
from tests.support.fleet import publish_first_revision, publish_next_revision
from tests.support.kube import apply, condition, events_about, get_json, jobs_of, tuning_pods

pytestmark = pytest.mark.e2e

EXAMPLES = ROOT / "examples"
MODEL_LABELS = ("amd.com/gpu.product-name", "nvidia.com/gpu.product")


def test_chart_lints_and_renders_objects_the_api_server_accepts(cluster: Any) -> None:
    chart = str(ROOT / "charts" / "tunefleet")
    helm(cluster.bin_dir, cluster.kubeconfig, "lint", chart)
    # Another release name, so the dry run does not merge into the installed release.
    cluster.kubectl("create", "namespace", "tunefleet-dryrun", check=False)
    for extra in (
        [],
        ["--set", "operator.watchNamespaces={default,kube-public}"],
        ["--set", "webhook.enabled=false"],
    ):
        rendered = helm(
            cluster.bin_dir,
            cluster.kubeconfig,
            "template",
            "dryrun",
            chart,
            "-n",
            "tunefleet-dryrun",
            "--kube-version",
            "1.36.3",
            *extra,
        ).stdout
        # Server-side dry run: validated against the real API server's schemas (and the CRD's).
        out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
        assert "MutatingWebhookConfiguration" in rendered or "webhook.enabled=false" in extra
        assert (
            "created (server dry run)" in out.stdout or "configured (server dry run)" in out.stdout
        )


def test_operator_runs_with_the_charts_least_privilege(cluster: Any, operator: Operator) -> None:
    sa = f"system:serviceaccount:{SYSTEM_NS}:tunefleet"

    def can(*args: str) -> bool:
        out = cluster.kubectl("auth", "can-i", f"--as={sa}", *args, check=False)
        return out.stdout.strip() == "yes"

    assert can("create", "jobs", "-n", "default")
    # Status is replaced whole over its resourceVersion; Jobs of superseded revisions go.
    status = ("tuningprofiles.tunefleet.io", "--subresource=status", "-n", "default")
    assert can("update", *status) and not can("patch", *status)
    assert can("delete", "jobs", "-n", "default")
    assert not can("delete", "pods", "-n", "default")
    assert not can("get", "secrets", "-n", "default")
    assert not can("create", "clusterrolebindings")
    assert "users" in yaml.safe_load(operator.kubeconfig.read_text())
    assert yaml.safe_load(operator.kubeconfig.read_text())["users"][0]["user"].get("token")


def test_examples_tune_one_job_per_model_and_turn_ready(
    cluster: Any, operator: Operator, s3: Any, namespace: str, s3_secret: str
) -> None:
    print(STAND_IN_NOTE)
    for path in ("tuningprofile-amd.yaml", "tuningprofile-nvidia.yaml"):
        cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / path))
    fleet = {
        n["metadata"]["name"]: n["metadata"]["labels"] for n in get_json(cluster, "nodes")["items"]
    }
    expected = {"llama-8b-rocm": 2, "mistral-7b-cuda": 1}
    published: dict[str, list[str]] = {}
    for name, count in expected.items():
        pods = eventually(
            lambda name=name: tuning_pods(cluster, namespace, name),
            lambda ps, count=count: len(ps) == count and all(p["spec"].get("nodeName") for p in ps),
            f"{count} scheduled tuning pods for {name}",
        )
        assert len(jobs_of(cluster, namespace, name)) == count
        for pod in pods:
            model = pod["metadata"]["labels"]["tunefleet.io/gpu-model"]
            node_labels = fleet[pod["spec"]["nodeName"]]
            assert model in [node_labels.get(k) for k in MODEL_LABELS], (
                pod["spec"]["nodeName"],
                model,
            )
            result = carry_out_publish(cluster.kubectl, pod, s3.env())
            published.setdefault(name, []).append(result["sha256"])

    for name, count in expected.items():
        prof = eventually(
            lambda name=name: get_json(cluster, "tp", "-n", namespace, name),
            lambda p: (p.get("status") or {}).get("phase") == "Ready",
            f"{name} Ready",
        )
        assert condition(prof, "Ready")["status"] == "True"
        assert condition(prof, "Ready")["observedGeneration"] == prof["metadata"]["generation"]
        arts = prof["status"]["artifacts"]
        assert len(arts) == count
        assert sorted(a["sha256"] for a in arts) == sorted(published[name])
        for art in arts:  # the recorded artifact is really in S3, under its content address
            bucket, key = art["uri"][len("s3://") :].split("/", 1)
            head = s3.client().head_object(Bucket=bucket, Key=f"{key}/results.csv")
            assert head["ContentLength"] > 0
            assert art["uri"].endswith(art["sha256"])

    table = cluster.kubectl("get", "tuningprofiles", "-n", namespace).stdout
    header = table.splitlines()[0].split()
    assert header == ["NAME", "MODELS", "PHASE", "GEMMS", "PROGRESS", "AGE"], table
    assert "llama-8b-rocm" in table and "Ready" in table and "AMD_Instinct_MI325X_OAM" in table
    row = next(line for line in table.splitlines() if line.startswith("llama-8b-rocm"))
    assert row.split()[3] == "4/4"  # tuned/total: in the sample every GEMM beat Default
    wide = cluster.kubectl("get", "tuningprofiles", "-n", namespace, "-o", "wide").stdout
    assert wide.splitlines()[0].split()[6:] == [
        "SHA256",
        "TUNED",
        "REUSED",
        "KINDS",
        "NOTE",
        "GAIN",
        "SOURCE",
        "COVERAGE",
        "MESSAGE",
    ], wide
    assert published["mistral-7b-cuda"][0][:12] in wide
    row = next(line for line in wide.splitlines() if line.startswith("mistral-7b-cuda"))
    assert "tunableop" in row.split()  # KINDS: TunableOp results alone, no caches

    # Deleting a profile deletes its Jobs (garbage collection), never the artifacts.
    cluster.kubectl("delete", "tp", "-n", namespace, "llama-8b-rocm")
    eventually(
        lambda: jobs_of(cluster, namespace, "llama-8b-rocm"),
        lambda js: js == [],
        "Jobs of a deleted profile to be collected",
        timeout=90,
    )
    bucket, key = arts[0]["uri"][len("s3://") :].split("/", 1)
    assert s3.client().head_object(Bucket=bucket, Key=f"{key}/results.csv")


def test_restarts_never_duplicate_jobs(cluster: Any, operator: Operator, namespace: str) -> None:
    models = ["AMD_Instinct_MI300X_OAM", "AMD_Instinct_MI325X_OAM"]
    apply(cluster, namespace, profile_doc("restart-a", gpu={"vendor": "amd", "models": models}))
    eventually(
        lambda: jobs_of(cluster, namespace, "restart-a"), lambda js: len(js) >= 1, "first Job"
    )
    operator.kill()
    # Changes while the operator is down are picked up once it is back.
    apply(cluster, namespace, profile_doc("restart-b", gpu={"vendor": "amd", "models": models}))
    operator.start()
    for name in ("restart-a", "restart-b"):
        eventually(
            lambda name=name: jobs_of(cluster, namespace, name),
            lambda js: len(js) == 2,
            f"two Jobs for {name}",
        )
    operator.kill()
    operator.start()
    # A second restart with everything in place: still exactly one Job per model.
    eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "restart-b"),
        lambda p: (p.get("status") or {}).get("jobs") and len(p["status"]["jobs"]) == 2,
        "status listing both Jobs",
    )
    for name in ("restart-a", "restart-b"):
        jobs = jobs_of(cluster, namespace, name)
        assert sorted(j["metadata"]["labels"]["tunefleet.io/gpu-model"] for j in jobs) == models


INVALID = [
    ("missing-image", {"image": None}, "spec.image: Required value"),
    ("no-models", {"gpu": {"vendor": "amd", "models": []}}, "spec.gpu.models: Invalid value"),
    (
        "unknown-vendor",
        {"gpu": {"vendor": "intel", "models": ["X"]}},
        'supported values: "amd", "nvidia"',
    ),
    ("negative-limit", {"tuning": {"maxIterations": -1}}, "spec.tuning.maxIterations"),
    ("bad-uri", {"storage": {"uri": "https://bucket/x"}}, "spec.storage.uri"),
    ("no-workload", {"workload": {}}, "workload needs a command"),
    (
        "deadline-before-budget",
        {"tuning": {"budgetSeconds": 3600, "activeDeadlineSeconds": 600}},
        "must be greater than tuning.budgetSeconds",
    ),
    (
        "tunableop-env",
        {
            "workload": {
                "command": ["x"],
                "env": [{"name": "PYTORCH_TUNABLEOP_TUNING", "value": "1"}],
            }
        },
        "PYTORCH_TUNABLEOP_* variables are set by the tuner",
    ),
    ("shape-not-mnk", {"workload": {"shapes": [{"mnk": [1, 2]}]}}, "spec.workload.shapes[0].mnk"),
    ("x" * 64, {}, "at most 63 characters"),
    (
        "image-with-space",
        {"image": "registry.example.com/serve 1"},
        "spec.image must be a container image reference",
    ),
    (
        "image-uppercase",
        {"image": "Serve/Model:1"},
        "spec.image must be a container image reference",
    ),
    (
        "env-both",
        {
            "workload": {
                "command": ["x"],
                "env": [
                    {
                        "name": "A",
                        "value": "1",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                    }
                ],
            }
        },
        "either value or valueFrom",
    ),
    (
        "bias-batched",
        {"workload": {"shapes": [{"mnk": [8, 8, 8], "batch": 2, "bias": True, "transB": True}]}},
        "cannot be batched",
    ),
]


@pytest.mark.parametrize(("name", "override", "message"), INVALID, ids=[c[0][:20] for c in INVALID])
def test_invalid_profiles_are_rejected_by_the_api_server(
    cluster: Any, namespace: str, name: str, override: dict[str, Any], message: str
) -> None:
    doc = profile_doc(name)
    for key, value in override.items():
        if value is None:
            del doc["spec"][key]
        else:
            doc["spec"][key] = value
    out = apply(cluster, namespace, doc, check=False)
    assert out.returncode != 0, f"{name} was accepted"
    assert message in out.stderr, out.stderr


def test_what_the_schema_cannot_judge_is_a_condition_and_the_operator_keeps_serving(
    cluster: Any, operator: Operator, namespace: str
) -> None:
    bad = profile_doc("bad-model", gpu={"vendor": "nvidia", "models": ["NVIDIA H200 (SXM)"]})
    apply(cluster, namespace, bad, profile_doc("good-after-bad"))
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "bad-model"),
        lambda p: (p.get("status") or {}).get("phase") == "Invalid",
        "bad-model Invalid",
    )
    ready = condition(prof, "Ready")
    assert ready["reason"] == "InvalidSpec" and "can't be a node label value" in ready["message"]
    assert jobs_of(cluster, namespace, "bad-model") == []
    eventually(
        lambda: jobs_of(cluster, namespace, "good-after-bad"),
        lambda js: len(js) == 1,
        "a Job for the valid profile next to the invalid one",
    )
    assert operator.proc is not None and operator.proc.poll() is None


def test_failed_job_becomes_failed_condition_with_the_pods_message(
    cluster: Any, operator: Operator, namespace: str
) -> None:
    apply(cluster, namespace, profile_doc("fails"))
    (pod,) = eventually(
        lambda: tuning_pods(cluster, namespace, "fails"),
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "a scheduled tuning pod",
    )
    why = "tuner_job: error: TunableOp needs a ROCm or CUDA GPU: torch reports no GPU device"
    set_pod_outcome(cluster.kubectl, pod, succeeded=False, container_name="tune", message=why)
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "fails"),
        lambda p: condition(p, "Failed").get("status") == "True",
        "Failed condition",
    )
    failed = condition(prof, "Failed")
    assert why in failed["message"] and "kubectl delete job" in failed["message"]
    assert prof["status"]["phase"] == "Failed"
    events = eventually(
        lambda: events_about(cluster, namespace, "fails", reason="TuningFailed"),
        lambda items: len(items) >= 1,
        "a TuningFailed Event",
    )
    assert why in events[0]["message"]


def test_a_spec_change_retunes_keeps_serving_and_keeps_history(
    cluster: Any, operator: Operator, s3: Any, namespace: str
) -> None:
    first, old, v1 = publish_first_revision(cluster, s3, namespace, "retune")
    # The image shapes tuning: a new revision, a new Job; the old artifact keeps serving.
    apply(cluster, namespace, profile_doc("retune", image="registry.example.com/serve:2"))
    v2 = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "retune"),
        lambda p: (p.get("status") or {}).get("revision") not in (None, v1["status"]["revision"]),
        "a new revision",
    )
    assert condition(v2, "Ready")["status"] == "True"
    assert "Serving earlier artifacts" in condition(v2, "Ready")["message"]
    assert v2["status"]["artifacts"][0]["sha256"] == old["sha256"]
    # The first revision's Job goes (its artifact is served from status meanwhile).
    (job,) = eventually(
        lambda: jobs_of(cluster, namespace, "retune"), lambda js: len(js) == 1, "one Job left"
    )
    assert job["metadata"]["labels"]["tunefleet.io/revision"] == v2["status"]["revision"]
    v3 = publish_next_revision(cluster, s3, namespace, "retune", first)
    assert [h["sha256"] for h in v3["status"]["history"]] == [old["sha256"]]
    assert v3["status"]["artifacts"][0]["revision"] == v3["status"]["revision"]
