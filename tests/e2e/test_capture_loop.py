"""The production loop, closed on the real node (issue 18, "Done when"):

a profile tuned for shapes S1, with capture on; a model Deployment whose pods serve S1 and S2
(the stand-in server runs those GEMMs through the stand-in torch, TunableOp on, record-untuned
on, the results loaded by tunefleet's hook); the capture sidecar uploads S2 only; the operator
retunes S2 only (the retune's artifact: reused = |S1|, newly tuned = |S2|); a new pod starts
with S1 and S2 and records no miss; the running pod keeps its artifact; no model pod holds a
credential that can write an artifact, and the sidecar's token is good for nothing but the
capture endpoint.

Everything real but the GPU: the API server, S3, kubelet and containers; the stand-in torch
computes nothing (its "tuning" is not a measurement, and says so).
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

import pytest
import yaml

from testbed.builders.wrappers import make_deployment, make_pod
from testbed.cluster import REAL_NODE_GPU_MODEL, STANDIN_IMAGE, wait_for_real_node_gpus
from testbed.operator import SERVING_SECRET, InCluster
from testbed.poll import eventually
from testbed.real_node import KEY, real_profile
from tests.support.kube import apply, create, get_json, jobs_of, pod_of, ready
from tuner_job.results import parse_param_signature, parse_results

pytestmark = pytest.mark.e2e

S1 = [
    {"mnk": [64, 128, 256], "dtype": "bfloat16", "transB": True},
    {"mnk": [256, 1024, 1024], "dtype": "float16", "transB": True},
    {"mnk": [128, 128, 64], "batch": 8, "dtype": "bfloat16"},
]
S2 = [
    {"mnk": [96, 4096, 512], "dtype": "bfloat16", "transB": True},
    {"mnk": [48, 2048, 1024], "dtype": "float16", "transB": True},
]
ROCM = [{"name": "FAKE_TORCH_BACKEND", "value": "rocm"}]


@pytest.fixture(autouse=True)
def _real_node_gpus(cluster: Any) -> None:
    """The tuning Job's pod and two model pods (1 GPU each), at most, at once."""
    wait_for_real_node_gpus(cluster, 3)


# The model server: a Deployment's pod on the real node, recording the shapes it runs.
SERVER = (
    make_pod()
    .without("metadata", "name")
    .without("metadata", "namespace")
    .selector({KEY: REAL_NODE_GPU_MODEL})
    .toleration("nvidia.com/gpu")
    .spec(terminationGracePeriodSeconds=10)
    .container(
        "server",
        STANDIN_IMAGE,
        gpus=1,
        imagePullPolicy="Never",
        command=["standin-server"],
        env=[
            *ROCM,
            {"name": "STANDIN_GEMMS", "value": json.dumps(S1 + S2)},
            {"name": "STANDIN_GEMMS_EVERY", "value": "3"},
        ],
    )
)


def dims(row: str) -> tuple[int, ...]:
    _, params = row.split(",", 1)
    p = parse_param_signature(params)
    return tuple(sorted(d for d in (p.m, p.n, p.k) if d is not None))


def shape_dims(shapes: list[dict[str, Any]]) -> list[tuple[int, ...]]:
    return sorted(tuple(sorted(s["mnk"])) for s in shapes)


def model_pods(cluster: Any, namespace: str, app: str) -> list[dict[str, Any]]:
    pods = get_json(cluster, "pods", "-n", namespace, "-l", f"app={app}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def running(cluster: Any, namespace: str, app: str, n: int) -> list[dict[str, Any]]:
    return list(
        eventually(
            lambda: model_pods(cluster, namespace, app),
            lambda ps: (
                len(ps) == n
                and all(
                    p["status"].get("phase") == "Running"
                    and all(c.get("ready") for c in p["status"].get("containerStatuses") or [])
                    for p in ps
                )
            ),
            f"{n} model pod(s) running",
            timeout=180,
            interval=1,
        )
    )


def capture_stores(cluster: Any, namespace: str) -> list[dict[str, Any]]:
    return list(
        get_json(cluster, "configmaps", "-n", namespace, "-l", "tunefleet.io/role=capture")["items"]
    )


def store_rows(cm: dict[str, Any]) -> list[str]:
    return [line.split(" ", 1)[1] for line in (cm["data"].get("rows") or "").splitlines()]


def artifact_keys(s3: Any, uri: str) -> set[str]:
    bucket_path = uri.removeprefix(f"s3://{s3.bucket}/")
    body = s3.client().get_object(Bucket=s3.bucket, Key=f"{bucket_path}/results.csv")["Body"]
    results = parse_results(body.read().decode())
    return {f"{r.op},{r.params}" for r in results.rows}


def logs(cluster: Any, namespace: str, pod: str, container: str) -> str:
    return str(cluster.kubectl("logs", "-n", namespace, pod, "-c", container, check=False).stdout)


def test_capture_closes_the_loop(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    spec_over = {
        "workload": {"shapes": S1, "env": ROCM},
        # Three stand-in GEMMs may all come out Default: serve the artifact anyway.
        "serving": {"serveDefaultOnly": True},
        "capture": {
            "enabled": True,
            "retune": {"misses": len(S2), "minIntervalSeconds": 60},
            "limits": {"uploadIntervalSeconds": 2},
        },
    }
    apply(cluster, namespace, real_profile("loop", s3, s3_secret, **spec_over))
    first = ready(cluster, namespace, "loop")
    assert first["status"]["phase"] == "Ready", json.dumps(first["status"], indent=2)[:3000]
    (a1,) = first["status"]["artifacts"]
    s1_keys = artifact_keys(s3, a1["uri"])
    assert sorted(dims(k) for k in s1_keys) == shape_dims(S1)

    # A model Deployment serving S1 and S2: one pod, pinned to A1.
    create(cluster, namespace, make_deployment("serve", SERVER.profile("loop")).obj())
    (old,) = running(cluster, namespace, "serve", 1)
    old_name, old_uid = old["metadata"]["name"], old["metadata"]["uid"]
    anns = old["metadata"]["annotations"]
    assert anns["tunefleet.io/artifact-sha256"] == a1["sha256"]
    inits = {c["name"]: c for c in old["spec"].get("initContainers") or []}
    assert inits["tunefleet-capture"]["restartPolicy"] == "Always"  # a native sidecar
    server = old["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["PYTORCH_TUNABLEOP_RECORD_UNTUNED"] == "1"
    assert env["PYTHONPATH"].startswith("/tunefleet/capture/hook")

    # The sidecar uploads S2, and only S2: the hook loaded A1, so S1 are hits, never recorded.
    (store,) = eventually(
        lambda: capture_stores(cluster, namespace),
        lambda cms: len(cms) == 1 and len(store_rows(cms[0])) >= len(S2),
        "the capture store with S2",
        timeout=120,
        interval=1,
    )
    # From the serving container's start (it runs its GEMMs at once) to the rows' first-seen
    # time in the store: a miss to its upload, through the real endpoint (1 s resolution).
    (server_status,) = [
        c for c in pod_of(cluster, namespace, old_name)["status"]["containerStatuses"]
        if c["name"] == "server"
    ]  # fmt: skip
    began = datetime.datetime.fromisoformat(server_status["state"]["running"]["startedAt"])
    seen_at = min(int(line.split(" ", 1)[0]) for line in store["data"]["rows"].splitlines())
    uploaded = max(seen_at - began.timestamp(), 0.0)
    rows = store_rows(store)
    assert sorted(dims(r) for r in rows) == shape_dims(S2), rows
    assert not set(rows) & s1_keys
    server_log = logs(cluster, namespace, old_name, "server")
    assert "loaded TunableOp results from" in server_log, server_log[-2000:]

    # The threshold (|S2| new misses) starts a retune of S2 under a revision of its own.
    def retuned() -> dict[str, Any]:
        return dict(get_json(cluster, "tp", "-n", namespace, "loop"))

    threshold_at = time.monotonic()
    second = eventually(
        retuned,
        lambda p: (
            any(
                a.get("sha256") != a1["sha256"]
                for a in (p.get("status") or {}).get("artifacts") or []
            )
            and p["status"].get("phase") in ("Ready", "Failed")
        ),
        "the retune's artifact",
        timeout=300,
        interval=1,
    )
    to_artifact = time.monotonic() - threshold_at
    st = second["status"]
    assert st["phase"] == "Ready", json.dumps(st, indent=2)[:4000]
    (a2,) = st["artifacts"]
    (entry,) = st["capture"]
    retune = entry["retune"]
    assert retune["reason"] == "Threshold" and retune["shapes"] == len(S2)
    assert a2["revision"] == retune["revision"] != st["revision"]
    assert retune["state"] == "Published"
    assert a2["reused"] == len(S1), a2
    assert a2["newlyTuned"] == len(S2), a2
    assert artifact_keys(s3, a2["uri"]) == s1_keys | set(rows)
    assert (entry["seen"], entry["tuned"], entry["untuned"], entry["coverage"]) == (2, 2, 0, 100)
    assert st["coverage"] == "2/2 100%"
    assert any(h["sha256"] == a1["sha256"] for h in st.get("history") or [])
    wide = cluster.kubectl("get", "tp", "-n", namespace, "loop", "-o", "wide").stdout
    assert "COVERAGE" in wide and "2/2 100%" in wide
    jobs = jobs_of(cluster, namespace, "loop")
    assert [j["metadata"]["labels"]["tunefleet.io/revision"] for j in jobs] == [a2["revision"]]

    # A new pod gets S1 and S2 and records no miss; the running one keeps A1.
    cluster.kubectl("scale", "deployment", "-n", namespace, "serve", "--replicas=2")
    pods = running(cluster, namespace, "serve", 2)
    (new,) = [p for p in pods if p["metadata"]["uid"] != old_uid]
    (kept,) = [p for p in pods if p["metadata"]["uid"] == old_uid]
    assert new["metadata"]["annotations"]["tunefleet.io/artifact-sha256"] == a2["sha256"]
    assert kept["metadata"]["annotations"]["tunefleet.io/artifact-sha256"] == a1["sha256"]
    assert all(c.get("restartCount", 0) == 0 for c in kept["status"]["containerStatuses"])
    new_name = new["metadata"]["name"]
    line = eventually(
        lambda: logs(cluster, namespace, new_name, "server"),
        lambda text: "ran 5 GEMM(s)" in text,
        "the new pod's first round of GEMMs",
        timeout=60,
        interval=1,
    )
    assert "TunableOp holds 5 result(s)" in line and ": 0 row(s)" in line, line[-2000:]
    time.sleep(5)  # more rounds and upload intervals: still nothing new
    (store,) = capture_stores(cluster, namespace)
    assert sorted(store_rows(store)) == sorted(rows)
    assert "uploaded" not in logs(cluster, namespace, new_name, "tunefleet-capture")

    # No model pod holds a credential that can write an artifact: the only Secret any of them
    # names is the read-only serving one (none at all with ConfigMap delivery), and the
    # sidecar's token is for the capture audience: the API server refuses it.
    for pod in model_pods(cluster, namespace, "serve"):
        text = yaml.safe_dump(pod["spec"])
        assert s3_secret not in text, f"{pod['metadata']['name']} names the publish Secret"
        for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            for e in c.get("env") or []:
                ref = (e.get("valueFrom") or {}).get("secretKeyRef") or {}
                assert ref.get("name") in (None, SERVING_SECRET), (c["name"], e)
        (token,) = [v for v in pod["spec"]["volumes"] if v["name"] == "tunefleet-capture-token"]
        source = token["projected"]["sources"][0]["serviceAccountToken"]
        assert source["audience"] == "tunefleet.io/capture"
    probe = (
        "import json, ssl, urllib.request, urllib.error\n"
        "t = open('/var/run/secrets/tunefleet.io/capture/token').read().strip()\n"
        "r = urllib.request.Request('https://10.96.0.1/api', headers={'Authorization': 'Bearer ' + t})\n"
        "try:\n"
        "    urllib.request.urlopen(r, context=ssl._create_unverified_context(), timeout=10)\n"
        "    print('ACCEPTED')\n"
        "except urllib.error.HTTPError as e:\n"
        "    print('STATUS', e.code)\n"
    )
    out = cluster.kubectl(
        "exec", "-n", namespace, new_name, "-c", "tunefleet-capture", "--",
        "python3", "-c", probe,
    ).stdout  # fmt: skip
    assert "STATUS 401" in out, out
    print(
        f"\ncapture loop (stand-in): miss to upload {uploaded:.1f}s, threshold to new artifact "
        f"{to_artifact:.1f}s, coverage after one loop {entry['coverage']}%"
    )
