"""The serving path on the local control plane: labelled pods get the artifact, others never
reach the webhook, and every fail-open / fail-closed case says what to do.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.builders.fleet import pod_doc, profile_doc
from testbed.operator import (
    SERVING_SECRET,
    STAND_IN_NOTE,
    Operator,
    tool_env,
)
from testbed.poll import eventually
from tests.support.fleet import ready_profile
from tests.support.kube import apply, condition, create, get_json
from tests.support.kube import pod_of as stored

pytestmark = pytest.mark.e2e

H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"
KEY = "nvidia.com/gpu.product"


def ours(containers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Containers without the per-pod ServiceAccount token mount the API server adds."""
    out = []
    for c in containers:
        mounts = [
            m for m in c.get("volumeMounts", []) if not m["name"].startswith("kube-api-access-")
        ]
        out.append({**c, "volumeMounts": mounts})
    return out


def webhook_calls(cluster: Any) -> float:
    """How often the API server has called our webhook (its own admission metric)."""
    metrics = cluster.kubectl("get", "--raw", "/metrics").stdout
    total = 0.0
    for line in metrics.splitlines():
        if (
            line.startswith("apiserver_admission_webhook_admission_duration_seconds_count")
            and 'name="pods.tunefleet.io"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_labelled_deployment_pods_are_injected_and_pinned_to_the_artifact(
    cluster: Any, operator: Operator, s3: Any, namespace: str, s3_secret: str
) -> None:
    print(STAND_IN_NOTE)
    prof = ready_profile(
        cluster,
        s3,
        namespace,
        "serve",
        [H200],
        storage={"uri": "s3://tunefleet/e2e", "credentialsSecret": {"name": s3_secret}},
    )
    sha = prof["status"]["artifacts"][0]["sha256"]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "model"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "model"}},
            "template": {
                "metadata": {"labels": {"app": "model", "tunefleet.io/profile": "serve"}},
                "spec": pod_doc("x", "serve")["spec"],
            },
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(deployment))
    pods = eventually(
        lambda: get_json(cluster, "pods", "-n", namespace, "-l", "app=model")["items"],
        lambda ps: len(ps) == 2,
        "two model pods",
    )
    for pod in pods:
        spec = pod["spec"]
        init = spec["initContainers"][0]
        assert init["name"] == "tunefleet-fetch"
        assert init["command"][init["command"].index("--sha256") + 1] == sha
        assert init["command"][init["command"].index("--devices") + 1] == "2"
        refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in init["env"] if "valueFrom" in e]
        assert refs == [SERVING_SECRET, SERVING_SECRET] and s3_secret not in refs  # read-only
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["PYTORCH_TUNABLEOP_ENABLED"] == "1" and env["PYTORCH_TUNABLEOP_TUNING"] == "0"
        assert env["PYTORCH_TUNABLEOP_FILENAME"] == "/tunefleet/results/tunableop_results%d.csv"
        assert {"name": "tunefleet-results", "emptyDir": {"sizeLimit": "256Mi"}} in spec["volumes"]
        assert spec["nodeSelector"] == {KEY: H200}  # the profile's only model, pinned
        assert pod["metadata"]["annotations"]["tunefleet.io/artifact-sha256"] == sha

    # The injected fetch, run for real against the S3 server: one verified file per ordinal.
    init = pods[0]["spec"]["initContainers"][0]
    cmd = list(init["command"])
    dest = Path(tempfile.mkdtemp(prefix="tunefleet-fetch-"))
    cmd[cmd.index("--dest") + 1] = str(dest)
    done = subprocess.run(cmd, env=tool_env(s3.env()), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in dest.iterdir() if p.suffix == ".csv")
    assert files == ["tunableop_results0.csv", "tunableop_results1.csv"]
    bucket, key = prof["status"]["artifacts"][0]["uri"][len("s3://") :].split("/", 1)
    original = s3.client().get_object(Bucket=bucket, Key=f"{key}/results.csv")["Body"].read()
    assert (dest / "tunableop_results1.csv").read_bytes() == original


def test_unlabelled_pods_never_reach_the_webhook_and_labelled_ones_do(
    cluster: Any, operator: Operator, s3: Any, namespace: str
) -> None:
    before = webhook_calls(cluster)
    create(cluster, namespace, pod_doc("plain", None))
    assert webhook_calls(cluster) == before
    assert "initContainers" not in stored(cluster, namespace, "plain")["spec"]
    create(cluster, namespace, pod_doc("labelled", "nothing-here"))
    assert webhook_calls(cluster) >= before + 1


def test_same_spec_same_result_and_reinjection_changes_nothing(
    cluster: Any, operator: Operator, s3: Any, namespace: str
) -> None:
    ready_profile(cluster, s3, namespace, "idem", [H100])
    create(cluster, namespace, pod_doc("a", "idem"))
    create(cluster, namespace, pod_doc("b", "idem"))
    a, b = stored(cluster, namespace, "a"), stored(cluster, namespace, "b")
    assert ours(a["spec"]["initContainers"]) == ours(b["spec"]["initContainers"])
    assert a["spec"]["containers"][0]["env"] == b["spec"]["containers"][0]["env"]
    # A spec that already carries the injection goes through unchanged (no second init container).
    again = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "c",
            "labels": a["metadata"]["labels"],
            "annotations": a["metadata"]["annotations"],
        },
        "spec": {
            k: a["spec"][k] for k in ("initContainers", "containers", "volumes", "nodeSelector")
        },
    }
    create(cluster, namespace, again)
    c = stored(cluster, namespace, "c")
    assert [i["name"] for i in c["spec"]["initContainers"]] == ["tunefleet-fetch"]
    assert c["spec"]["containers"][0]["env"] == a["spec"]["containers"][0]["env"]


def test_with_the_webhook_down_labelled_pods_are_still_created(
    cluster: Any, operator: Operator, namespace: str
) -> None:
    operator.kill()
    try:
        out = create(cluster, namespace, pod_doc("while-down", "anything"), check=False)
        assert out.returncode == 0, out.stderr
        assert "initContainers" not in stored(cluster, namespace, "while-down")["spec"]
    finally:
        operator.start()


def test_fail_open_cases_admit_untouched_with_a_reason(
    cluster: Any, operator: Operator, s3: Any, namespace: str
) -> None:
    ready_profile(cluster, s3, namespace, "two", [H100, H200])
    apply(cluster, namespace, profile_doc("pending", gpu={"vendor": "nvidia", "models": [H200]}))
    cases = {
        "missing": (pod_doc("missing", "no-such-profile"), "does not exist"),
        "no-selector": (
            pod_doc("no-selector", "two"),
            f"no nodeSelector or required node affinity on {KEY}",
        ),
        "other-model": (pod_doc("other-model", "two", {KEY: "NVIDIA-A100"}), "does not tune"),
        "not-ready": (pod_doc("not-ready", "pending"), "has no artifact"),
    }
    for name, (doc, words) in cases.items():
        create(cluster, namespace, doc)
        pod = stored(cluster, namespace, name)
        assert "initContainers" not in pod["spec"], name
        assert words in pod["metadata"]["annotations"]["tunefleet.io/status"], name
    events = eventually(
        lambda: get_json(
            cluster, "events", "-n", namespace, "--field-selector", "reason=PodUntuned"
        )["items"],
        lambda items: len(items) >= 2,
        "PodUntuned Events on the profiles",
    )
    assert any("no-selector" in e["message"] for e in events)


def test_fail_closed_denies_with_what_to_add(
    cluster: Any, operator: Operator, s3: Any, namespace: str
) -> None:
    ready_profile(cluster, s3, namespace, "strict", [H100, H200], serving={"failClosed": True})
    out = create(cluster, namespace, pod_doc("denied", "strict"), check=False)
    assert out.returncode != 0
    assert "nodeSelector" in out.stderr and H200 in out.stderr, out.stderr
    ok = create(cluster, namespace, pod_doc("allowed", "strict", {KEY: H200}))
    assert ok.returncode == 0
    init = stored(cluster, namespace, "allowed")["spec"]["initContainers"][0]
    assert "--fail-closed" in init["command"]


def test_image_mismatch_is_warned(
    cluster: Any, operator: Operator, s3: Any, namespace: str
) -> None:
    ready_profile(cluster, s3, namespace, "img", [H100])
    out = create(
        cluster, namespace, pod_doc("mismatch", "img", image="registry.example.com/other:9")
    )
    assert "TunableOp may reject" in out.stderr  # kubectl prints admission warnings
    pod = stored(cluster, namespace, "mismatch")
    assert (
        "registry.example.com/other:9"
        in pod["metadata"]["annotations"]["tunefleet.io/image-warning"]
    )
    assert pod["spec"]["initContainers"][0]["name"] == "tunefleet-fetch"
    prof_events = eventually(
        lambda: get_json(
            cluster, "events", "-n", namespace, "--field-selector", "reason=ImageMismatch"
        )["items"],
        lambda items: len(items) >= 1,
        "an ImageMismatch Event",
    )
    assert "other:9" in prof_events[0]["message"]
    assert condition(get_json(cluster, "tp", "-n", namespace, "img"), "Ready")["status"] == "True"
    # Warned, not changed: without spec.serving.pinImage the container keeps its own image.
    assert [c["image"] for c in pod["spec"]["containers"]] == ["registry.example.com/other:9"]
