"""Every pod step for real, on the real node: the operator as the chart's Deployment (image
from `make images`), a tuning Job (bootstrap, sync, tune in the stand-in inference image,
publish to S3), the same Job where torch sees no GPU, model pods whose injected fetch runs,
corrupted artifacts under fail open and fail closed, a missing credentials Secret.

The stand-in image's torch follows TunableOp's formats and offline API but computes nothing;
everything it writes says so (PT_VERSION ...+standin). The real node has no GPU: its 8
nvidia.com/gpu are a fake resource, shared with whatever else runs there (each test waits
for the 3 it takes at most, or names what holds them).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from testbed.cluster import (
    REAL_NODE,
    STANDIN_IMAGE,
    STANDIN_NOGPU_IMAGE,
    wait_for_real_node_gpus,
)
from testbed.operator import SYSTEM_NS, InCluster, helm
from testbed.poll import eventually
from testbed.real_node import SHAPES, model_pod, real_profile
from tests.support.kube import (
    apply,
    condition,
    create,
    ended,
    get_json,
    jobs_of,
    pod_of,
    ready,
    statuses,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def _real_node_gpus(cluster: Any) -> None:
    """A tuning Job's pod (1 GPU) and a model pod (2) at once, at most."""
    wait_for_real_node_gpus(cluster, 3)


def test_the_operator_runs_as_the_charts_deployment_and_elects_one_leader(
    cluster: Any, in_cluster: InCluster
) -> None:
    pods = in_cluster.pods()
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeName"] == REAL_NODE
        assert pod["status"]["phase"] == "Running"
        (c,) = pod["spec"]["containers"]
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert any(v["name"].startswith("kube-api-access") for v in pod["spec"]["volumes"])
    holder = eventually(in_cluster.leader, bool, "a Lease holder", timeout=30)
    assert holder.split("_")[0] in {p["metadata"]["name"] for p in pods}
    leaders = 0
    for pod in pods:
        name = pod["metadata"]["name"]
        text = cluster.kubectl(
            "get", "--raw", f"/api/v1/namespaces/{SYSTEM_NS}/pods/{name}:8081/proxy/metrics"
        ).stdout
        leaders += int(
            float(
                next(
                    line for line in text.splitlines() if line.startswith("tunefleet_leader ")
                ).split()[1]
            )
        )
    assert leaders == 1
    # Under jemalloc, as the image is built for (tunefleet/__main__.py): the library is mapped
    # into the operator's process (PID 1, exec'd in place) and the start says so.
    for pod in pods:
        name = pod["metadata"]["name"]
        maps = cluster.kubectl("exec", "-n", SYSTEM_NS, name, "--", "cat", "/proc/1/maps").stdout
        assert "libjemalloc.so.2" in maps, name
        log = cluster.kubectl("logs", "-n", SYSTEM_NS, name, "--limit-bytes", "200000").stdout
        assert "allocator: jemalloc" in log, log[-3000:]
    # helm test: a probe admission through each webhook Service, checked against its CA.
    out = helm(
        cluster.bin_dir,
        cluster.kubeconfig,
        "test",
        "tunefleet",
        "-n",
        SYSTEM_NS,
        "--logs",
        "--timeout",
        "120s",
    )
    # The shared Service and each replica slot's (one webhook entry each): all answered.
    assert out.stdout.count("admitted the probe pod untuned") == 1 + in_cluster.replicas, out.stdout


def test_a_tuning_job_runs_every_step_for_real_and_a_model_pod_gets_its_files(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    started = time.monotonic()
    apply(cluster, namespace, real_profile("real", s3, s3_secret))
    prof = ready(cluster, namespace, "real")
    took = time.monotonic() - started
    assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"], indent=2)[:4000]
    (job,) = jobs_of(cluster, namespace, "real")
    (pod,) = get_json(
        cluster,
        "pods",
        "-n",
        namespace,
        "-l",
        f"batch.kubernetes.io/job-name={job['metadata']['name']}",
    )["items"]
    assert pod["spec"]["nodeName"] == REAL_NODE
    steps = statuses(pod)
    for step in ("bootstrap", "tune", "publish"):
        term = steps[step]["state"].get("terminated") or steps[step].get("lastState", {}).get(
            "terminated"
        )
        assert term and term["exitCode"] == 0, (step, steps[step])
    # No ServiceAccount token where none is needed; hardened steps ran as they were told.
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert not any(v["name"].startswith("kube-api-access") for v in pod["spec"]["volumes"])
    for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
        if c["name"] != "tune":
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["securityContext"]["runAsUser"] == 65532
    (art,) = prof["status"]["artifacts"]
    # The publish step's own termination message made the artifact; the imageID came through
    # the ConfigMap; outcomes and reuse figures are counted.
    assert art["image"]["reference"] == STANDIN_IMAGE and "sha256:" in art["image"]["id"]
    assert art["outcomes"]["tuned"] > 0 and art["recorded"] == len(SHAPES)
    # torch's offline tuner leaves some GEMMs (e.g. M=1) untuned: gemms may be < recorded.
    assert art["newlyTuned"] + art["reused"] + art.get("resumed", 0) == art["gemms"]
    assert art["gemms"] <= art["recorded"]
    bucket, key = art["uri"][len("s3://") :].split("/", 1)
    manifest = json.loads(
        s3.client().get_object(Bucket=bucket, Key=f"{key}/manifest.json")["Body"].read()
    )
    assert manifest["image"]["id"] == art["image"]["id"]
    assert manifest["validators"]["PT_VERSION"].endswith("+standin")
    print(f"tuning Job on the real node: profile applied -> Ready in {took:.1f}s")

    # The operator delivered it as an immutable ConfigMap, read with its read-only identity.
    assert art["delivery"] == "ConfigMap", art
    cm = get_json(cluster, "configmap", "-n", namespace, art["configMap"]["name"])
    assert cm["immutable"] is True and cm["metadata"]["uid"] == art["configMap"]["uid"]
    assert cm["metadata"]["ownerReferences"][0]["uid"] == prof["metadata"]["uid"]
    # A model pod mounts it: no init container, no credentials; one file per GPU.
    create(cluster, namespace, model_pod("model", "real", gpus=2))
    done = ended(cluster, namespace, "model", "the model pod to run")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert not done["spec"].get("initContainers")
    assert not any(
        e.get("valueFrom") for c in done["spec"]["containers"] for e in c.get("env") or []
    )
    log = cluster.kubectl("logs", "-n", namespace, "model", "-c", "server").stdout
    assert all(line.startswith("[stand-in") for line in log.splitlines() if line.strip())
    assert "PYTORCH_TUNABLEOP_TUNING=0" in log
    assert "tunableop_results0.csv" in log and "tunableop_results1.csv" in log
    assert "+standin" in log


def test_the_same_job_where_torch_sees_no_gpu_fails_with_its_refusal(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    apply(cluster, namespace, real_profile("nogpu", s3, s3_secret, image=STANDIN_NOGPU_IMAGE))
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "nogpu"),
        lambda p: condition(p, "Failed").get("status") == "True",
        "nogpu Failed",
        timeout=180,
        interval=1,
    )
    message = condition(prof, "Failed")["message"]
    assert "container tune exited 3" in message
    assert "TunableOp needs a ROCm or CUDA GPU" in message
    assert "kubectl delete job" in message


def test_corrupted_artifacts_fail_open_with_the_reason_and_fail_closed_refuse(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    # From the store: the fetch init container, with read-only credentials.
    apply(cluster, namespace, real_profile("corrupt", s3, s3_secret, serving={"delivery": "Store"}))
    prof = ready(cluster, namespace, "corrupt")
    (art,) = prof["status"]["artifacts"]
    bucket, key = art["uri"][len("s3://") :].split("/", 1)
    # Someone overwrites the object behind tunefleet's back (no If-None-Match here).
    s3.client().put_object(
        Bucket=bucket, Key=f"{key}/results.csv", Body=b"Validator,PT_VERSION,x\n"
    )
    create(cluster, namespace, model_pod("open", "corrupt"))
    opened = ended(cluster, namespace, "open", "the fail-open pod to run")
    assert opened["status"]["phase"] == "Succeeded"
    fetch = statuses(opened)["tunefleet-fetch"]["state"]["terminated"]
    assert (
        fetch["exitCode"] == 0 and "starting untuned: results.csv has SHA-256" in fetch["message"]
    )
    described = cluster.kubectl("describe", "pod", "-n", namespace, "open").stdout
    assert "starting untuned" in described
    # Fail closed: the same artifact keeps the pod from starting.
    closed = real_profile(
        "corrupt", s3, s3_secret, serving={"failClosed": True, "delivery": "Store"}
    )
    apply(cluster, namespace, closed)
    eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "corrupt")["status"]["observedGeneration"],
        lambda g: g == 2,
        "the fail-closed spec observed",
    )
    create(cluster, namespace, model_pod("closed", "corrupt"))
    shut = ended(cluster, namespace, "closed", "the fail-closed pod to end")
    assert shut["status"]["phase"] == "Failed"
    fetch = statuses(shut)["tunefleet-fetch"]["state"]["terminated"]
    assert fetch["exitCode"] == 1 and "refusing to start" in fetch["message"]
    assert statuses(shut)["server"]["state"].get("running") is None


def test_a_missing_credentials_secret_is_named_with_the_fix(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str
) -> None:
    apply(cluster, namespace, real_profile("nosecret", s3, "no-such-secret"))
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "nosecret"),
        lambda p: condition(p, "Ready").get("reason") == "SecretMissing",
        "SecretMissing",
        timeout=120,
        interval=1,
    )
    message = condition(prof, "Ready")["message"]
    assert (
        f"Secret no-such-secret (S3 credentials for publishing) does not exist in namespace {namespace}"
        in message
    )
    assert f"kubectl create secret generic no-such-secret -n {namespace}" in message
    assert prof["status"]["phase"] == "Pending"


def events_of(cluster: Any, namespace: str, profile: str, reason: str) -> list[str]:
    found = get_json(
        cluster, "events", "-n", namespace, "--field-selector",
        f"involvedObject.name={profile},reason={reason}",
    )  # fmt: skip
    return [str(e.get("message") or "") for e in found["items"]]


def served_the_artifact(cluster: Any, namespace: str, pod: str, forged: str = "") -> None:
    """The model pod ran with the published artifact, never from `forged` (a ConfigMap name)."""
    done = ended(cluster, namespace, pod, f"model pod {pod} to run")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    anns = done["metadata"]["annotations"]
    assert anns["tunefleet.io/status"] == "injected", anns
    if forged:
        mounted = json.dumps(done["spec"].get("volumes") or [])
        assert f'"{forged}"' not in mounted, mounted
    fetch = statuses(done).get("tunefleet-fetch")
    if fetch is not None:  # from the store: fetch verified it against the pinned SHA-256
        term = fetch["state"]["terminated"]
        assert term["exitCode"] == 0 and "wrote 2 results file(s)" in term["message"], term
    log = cluster.kubectl("logs", "-n", namespace, pod, "-c", "server").stdout
    assert "tunableop_results0.csv" in log and "tunableop_results1.csv" in log, log
    assert "+standin" in log and "Evil" not in log, log


def test_a_deleted_or_replaced_artifact_config_map_is_made_again_and_never_mounted(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    """Issue 27: a namespace clean-up deletes the artifact's ConfigMap, then someone puts
    another under its name (copied labels and ownerReference, other results). New model pods
    are served the verified artifact throughout (from the store while the ConfigMap is being
    made again), the foreign object is never mounted, and the profile says what happened."""
    apply(cluster, namespace, real_profile("heal", s3, s3_secret))
    prof = ready(cluster, namespace, "heal")
    (art,) = prof["status"]["artifacts"]
    name, uid = art["configMap"]["name"], art["configMap"]["uid"]

    cluster.kubectl("delete", "configmap", "-n", namespace, name)
    create(cluster, namespace, model_pod("after-delete", "heal"))
    remade = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "heal")["status"]["artifacts"][0],
        lambda a: (a.get("configMap") or {}).get("uid") not in (None, uid),
        "the deleted ConfigMap made again",
        timeout=30,
        interval=0.5,
    )
    assert remade["configMap"]["name"] == name and remade["sha256"] == art["sha256"]
    cm = get_json(cluster, "configmap", "-n", namespace, name)
    assert cm["metadata"]["uid"] == remade["configMap"]["uid"] and cm["immutable"] is True
    served_the_artifact(cluster, namespace, "after-delete")
    said = events_of(cluster, namespace, "heal", "ArtifactConfigMapRemade")
    assert any("was deleted" in m for m in said), said

    # Replaced: deleted, and a forgery with the same name, labels and ownerReference.
    cluster.kubectl("delete", "configmap", "-n", namespace, name)
    forged = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": cm["metadata"]["labels"],
            "annotations": cm["metadata"]["annotations"],
            "ownerReferences": cm["metadata"]["ownerReferences"],
        },
        "immutable": True,
        "data": {
            "results.csv": "Validator,PT_VERSION,2.11.0\n"
            "GemmTunableOp_Half_TN,tn_8_8_8_ld_8_8_8,Evil,0.1\n",
            "manifest.json": cm["data"]["manifest.json"],
        },
    }
    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(forged))
    forged_uid = get_json(cluster, "configmap", "-n", namespace, name)["metadata"]["uid"]
    create(cluster, namespace, model_pod("after-forgery", "heal"))
    healed = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "heal"),
        lambda p: (p["status"]["artifacts"][0].get("configMap") or {}).get("name", name) != name,
        "the artifact delivered under another name",
        timeout=30,
        interval=0.5,
    )
    other = healed["status"]["artifacts"][0]["configMap"]
    held = get_json(cluster, "configmap", "-n", namespace, other["name"])
    assert held["metadata"]["uid"] == other["uid"]
    assert held["data"]["results.csv"] != forged["data"]["results.csv"]
    # The forgery is left where it is, named in an Event, and mounted by no pod.
    assert get_json(cluster, "configmap", "-n", namespace, name)["metadata"]["uid"] == forged_uid
    untrusted = events_of(cluster, namespace, "heal", "UntrustedObject")
    assert any(forged_uid in m and "never mounted" in m for m in untrusted), untrusted
    served_the_artifact(cluster, namespace, "after-forgery", forged=name)
    create(cluster, namespace, model_pod("healed", "heal"))
    served_the_artifact(cluster, namespace, "healed", forged=name)
    assert not pod_of(cluster, namespace, "healed")["spec"].get("initContainers")
    # And the status recovered: Ready, nothing degraded.
    final = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "heal")["status"],
        lambda st: (
            st["phase"] == "Ready"
            and any(c["type"] == "Degraded" and c["status"] == "False" for c in st["conditions"])
        ),
        "the profile Ready and not Degraded",
        timeout=30,
        interval=1,
    )
    assert final["artifacts"][0]["sha256"] == art["sha256"]


def test_a_config_map_whose_labels_were_removed_still_serves_and_is_labelled_again(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    """Issue 40: the role label removed from a Ready profile's artifact ConfigMap. The watch
    that admission reads selects by that label, so new pods fell back to the store (and, where
    the namespace had no serving Secret, hung in CreateContainerConfigError for good) while the
    reconcile saw the same uid and did nothing. Now: the next pod mounts the very object made,
    recognised by its uid, and runs within 60 s; the labels are put back and said."""
    apply(cluster, namespace, real_profile("unlabelled", s3, s3_secret))
    prof = ready(cluster, namespace, "unlabelled")
    (art,) = prof["status"]["artifacts"]
    name, uid = art["configMap"]["name"], art["configMap"]["uid"]
    cluster.kubectl("label", "configmap", "-n", namespace, name, "tunefleet.io/role-")
    started = time.monotonic()
    create(cluster, namespace, model_pod("after-unlabel", "unlabelled"))
    served_the_artifact(cluster, namespace, "after-unlabel")
    took = time.monotonic() - started
    pod = pod_of(cluster, namespace, "after-unlabel")
    assert not pod["spec"].get("initContainers"), pod["spec"]  # mounted, not fetched
    assert pod["metadata"]["annotations"]["tunefleet.io/artifact-configmap"] == name
    assert took < 60, took
    relabelled = eventually(
        lambda: get_json(cluster, "configmap", "-n", namespace, name)["metadata"],
        lambda m: (m.get("labels") or {}).get("tunefleet.io/role") == "artifact",
        "the ConfigMap labelled again",
        timeout=30,
        interval=0.5,
    )
    assert relabelled["uid"] == uid  # the same object: nothing made again
    said = events_of(cluster, namespace, "unlabelled", "ArtifactConfigMapRemade")
    assert any("had lost its labels" in m for m in said), said
    print(
        f"label removed: a new pod ran with the artifact {took:.1f}s after, from the same ConfigMap"
    )


def test_a_serving_secret_missing_from_the_namespace_never_holds_a_model_pod(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    """Issue 40: a pod whose fetch referenced a Secret the namespace lacks waited in
    CreateContainerConfigError for good, counted nowhere. Now the reference is optional: the
    pod starts, fetch names the Secret and the pod runs untuned (fail open; a pod that keeps
    running so is what Degraded counts, served.py)."""
    spec = {"delivery": "Store", "credentialsSecret": {"name": "no-such-reader"}}
    apply(cluster, namespace, real_profile("no-reader", s3, s3_secret, serving=spec))
    ready(cluster, namespace, "no-reader")
    started = time.monotonic()
    create(cluster, namespace, model_pod("without-secret", "no-reader"))
    done = ended(cluster, namespace, "without-secret", "the model pod without its Secret")
    took = time.monotonic() - started
    fetch = statuses(done)["tunefleet-fetch"]["state"]["terminated"]
    assert fetch["exitCode"] == 0, fetch  # fail open: the model ran, untuned
    assert "starting untuned: the Secret no-such-reader" in fetch["message"], fetch
    assert "spec.serving.credentialsSecret" in fetch["message"], fetch
    assert done["status"]["phase"] == "Succeeded" and took < 60, (done["status"], took)
    print(f"missing serving Secret: the pod ran untuned {took:.1f}s after it was created")


def test_model_pods_credentials_cannot_write_to_the_bucket(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    """The fetch path's credentials are the read-only Secret: they read, they cannot write."""
    import boto3
    from botocore.exceptions import ClientError

    apply(cluster, namespace, real_profile("ro", s3, s3_secret, serving={"delivery": "Store"}))
    prof = ready(cluster, namespace, "ro")
    create(cluster, namespace, model_pod("model", "ro"))
    pod = pod_of(cluster, namespace, "model")
    (fetch,) = pod["spec"]["initContainers"]
    refs = {
        e["valueFrom"]["secretKeyRef"]["name"] for e in fetch.get("env") or [] if "valueFrom" in e
    }
    assert refs == {"s3-reader"} and s3_secret not in refs  # never the publish Secret
    secret = get_json(cluster, "secret", "-n", namespace, "s3-reader")["data"]
    import base64

    reader = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id=base64.b64decode(secret["AWS_ACCESS_KEY_ID"]).decode(),
        aws_secret_access_key=base64.b64decode(secret["AWS_SECRET_ACCESS_KEY"]).decode(),
        region_name=s3.region,
    )
    bucket, key = prof["status"]["artifacts"][0]["uri"][len("s3://") :].split("/", 1)
    assert reader.get_object(Bucket=bucket, Key=f"{key}/manifest.json")["Body"].read()
    for attempt in (
        lambda: reader.put_object(Bucket=bucket, Key=f"{key}/evil.csv", Body=b"x"),
        lambda: reader.delete_object(Bucket=bucket, Key=f"{key}/results.csv"),
    ):
        with pytest.raises(ClientError) as refused:
            attempt()
        assert refused.value.response["Error"]["Code"] == "AccessDenied"
    done = ended(cluster, namespace, "model", "the model pod to run")
    fetched = statuses(done)["tunefleet-fetch"]["state"]["terminated"]
    assert fetched["exitCode"] == 0 and "wrote 2 results file(s)" in fetched["message"], fetched
