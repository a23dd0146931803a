"""The local cluster's real node runs containers for real (docs/local-cluster.md).

Against the real node (kubelet + containerd + runc + CNI, kube-proxy; no GPU): it joins with its
own node credential, is labelled and tainted as documented, runs tunefleet's image as UID 65532
on a read-only root, its pods reach the API server through the `kubernetes` Service and the S3
server at the pod endpoint, the API server reaches a pod through a ClusterIP Service (a
webhook call, through kube-proxy's rules in this machine's network namespace), `kubectl logs`
and `exec` work, and the stand-in inference image reports what it was given. Pods that neither
request nvidia.com/gpu nor tolerate its taint never land there.
"""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.builders.wrappers import make_object, make_pod
from testbed.cluster import (
    REAL_NODE,
    REAL_NODE_GPU_MODEL,
    REAL_NODE_GPUS,
    REAL_NODE_IP,
    REAL_NODE_SELECTOR,
    REAL_NODE_TOLERATIONS,
    STANDIN_IMAGE,
    STANDIN_NOGPU_IMAGE,
    TUNEFLEET_IMAGE,
    Cluster,
    S3Settings,
    condition,
    ensure_images,
    fleet,
    images_on_node,
    wait_for,
    wait_for_real_node_gpus,
)

pytestmark = pytest.mark.e2e

UID = 65532
TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}
TMP_VOLUME = {"name": "tmp", "emptyDir": {}}
# A hardened pod like the ones tunefleet makes (UID 65532, read-only root, /tmp emptyDir): its
# one container is `{**MAIN, "image": ..., "command": [...]}` (and env, envFrom, ... to add).
MAIN: dict[str, Any] = {
    "name": "main",
    "imagePullPolicy": "Never",  # nothing can be pulled here: the image must be on the node
    "securityContext": {
        "runAsUser": UID,
        "runAsGroup": UID,
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    },
    "volumeMounts": [TMP_MOUNT],
    "env": [],
    "envFrom": [],
}
HARDENED = (
    make_pod()
    .without("metadata", "namespace")
    .spec(
        restartPolicy="Never",
        automountServiceAccountToken=False,
        terminationGracePeriodSeconds=1,
        volumes=[TMP_VOLUME],
    )
)
ON_REAL_NODE = HARDENED.selector(dict(REAL_NODE_SELECTOR)).spec(
    tolerations=list(REAL_NODE_TOLERATIONS)
)


@pytest.fixture(scope="module")
def node_images(cluster: Cluster) -> set[str]:
    """The images on the real node (built and imported if they are not: hack/images.sh)."""
    want = set(ensure_images())
    have = wait_for(
        lambda: images_on_node(cluster),
        timeout=60,
        describe=f"the kubelet to report {sorted(want)} on {REAL_NODE}",
        until=lambda names: want <= names,
    )
    return have


# --- helpers -------------------------------------------------------------------------------


def apply(cluster: Cluster, namespace: str, *docs: dict[str, Any]) -> None:
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs)
    )


def get_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = cluster.kubectl_json("get", "pod", "-n", namespace, name)
    return pod


def wait_phase(
    cluster: Cluster, namespace: str, name: str, phases: set[str], timeout: float = 120
) -> dict[str, Any]:
    """Wait for one of `phases`; fail at once (with the pod's container states) on another
    terminal phase."""

    def probe() -> dict[str, Any]:
        pod = get_pod(cluster, namespace, name)
        phase = pod.get("status", {}).get("phase")
        if phase in {"Succeeded", "Failed"} - phases:
            raise AssertionError(f"pod {name} ended {phase}: {pod.get('status')}")
        return pod

    try:
        return wait_for(
            probe,
            timeout=timeout,
            describe=f"pod {namespace}/{name} in {sorted(phases)}",
            until=lambda p: p.get("status", {}).get("phase") in phases,
        )
    except AssertionError:
        pod = get_pod(cluster, namespace, name)
        events = cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
        ).stdout
        raise AssertionError(f"pod {name}: {pod.get('status')}\nevents:\n{events}") from None


def logs(cluster: Cluster, namespace: str, name: str) -> str:
    return cluster.kubectl("logs", "-n", namespace, name).stdout


def run_to_completion(
    cluster: Cluster, namespace: str, doc: dict[str, Any], timeout: float = 120
) -> tuple[dict[str, Any], str]:
    apply(cluster, namespace, doc)
    name = doc["metadata"]["name"]
    pod = wait_phase(cluster, namespace, name, {"Succeeded", "Failed"}, timeout)
    out = logs(cluster, namespace, name)
    assert pod["status"]["phase"] == "Succeeded", f"{name} failed; its log:\n{out}"
    return pod, out


def kubelet_kubeconfig(cluster: Cluster) -> str:
    """The --kubeconfig the running kubelet was started with (from its command line)."""
    pid = (Path(cluster.state_dir) / "pids" / "kubelet.pid").read_text().strip()
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return args[args.index("--kubeconfig") + 1]


def whoami(cluster: Cluster, kubeconfig: str) -> dict[str, Any]:
    out = subprocess.run(
        [f"{cluster.bin_dir}/kubectl", "--kubeconfig", kubeconfig, "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    info: dict[str, Any] = json.loads(out)["status"]["userInfo"]
    return info


# --- the node ------------------------------------------------------------------------------


def test_real_node_is_ready_labelled_tainted_with_fake_gpus(cluster: Cluster) -> None:
    node = cluster.kubectl_json("get", "node", REAL_NODE)
    ready = condition(node, "Ready")
    assert ready and ready["status"] == "True", node["status"].get("conditions")
    labels = node["metadata"]["labels"]
    assert labels.get("nvidia.com/gpu.product") == REAL_NODE_GPU_MODEL
    assert labels.get("type") == "real"
    # kwok manages only nodes annotated kwok.x-k8s.io/node=fake: this one is the kubelet's.
    assert "kwok.x-k8s.io/node" not in (node["metadata"].get("annotations") or {})
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.3"
    assert {"type": "InternalIP", "address": REAL_NODE_IP} in node["status"]["addresses"]
    taints = node["spec"].get("taints") or []
    assert taints == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    for field in ("capacity", "allocatable"):
        assert node["status"][field].get("nvidia.com/gpu") == str(REAL_NODE_GPUS), field
    # One GPU model label only (no AMD one), and it is not one of the fleet's real models.
    assert "amd.com/gpu.product-name" not in labels
    fleet_models = {n["metadata"]["labels"].get("nvidia.com/gpu.product") for n in fleet()}
    assert REAL_NODE_GPU_MODEL not in fleet_models


def test_real_node_joined_with_its_own_node_credential(cluster: Cluster) -> None:
    kubeconfig = kubelet_kubeconfig(cluster)
    assert kubeconfig != cluster.kubeconfig
    user = whoami(cluster, kubeconfig)
    assert user["username"] == f"system:node:{REAL_NODE}", user
    assert "system:nodes" in user["groups"], user
    assert "system:masters" not in user["groups"], user
    # The Node authorizer and NodeRestriction hold it to its own node.
    denied = subprocess.run(
        [
            f"{cluster.bin_dir}/kubectl",
            "--kubeconfig",
            kubeconfig,
            "label",
            "node",
            "kwok-cpu-0",
            "tunefleet.io/touched-by-real-node=yes",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied
    can = subprocess.run(
        [
            f"{cluster.bin_dir}/kubectl",
            "--kubeconfig",
            kubeconfig,
            "auth",
            "can-i",
            "list",
            "secrets",
            "-A",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert can.returncode != 0 and can.stdout.startswith("no"), can
    # kube-proxy has its own identity too.
    proxy = whoami(cluster, str(Path(cluster.state_dir) / "kubeconfigs" / "kube-proxy.kubeconfig"))
    assert proxy["username"] == "system:kube-proxy", proxy


# --- pods on it ----------------------------------------------------------------------------


def test_tunefleet_image_runs_as_65532_on_a_read_only_root(
    cluster: Cluster, namespace: str, node_images: set[str]
) -> None:
    assert TUNEFLEET_IMAGE in node_images
    script = textwrap.dedent(
        """
        set -e
        echo "uid=$(id -u) gid=$(id -g) home=$HOME"
        if touch /probe 2>/dev/null; then echo "root: writable"; else echo "root: read-only"; fi
        touch /tmp/probe && echo "tmp: writable"
        test ! -e /var/run/secrets/kubernetes.io/serviceaccount/token && echo "token: none"
        for c in tunefleet-operator tunefleet-publish tunefleet-fetch tunefleet-bootstrap; do
          command -v "$c"
        done
        tunefleet-fetch --help
        """
    )
    doc = ON_REAL_NODE.name("fetch-help").containers(
        {**MAIN, "image": TUNEFLEET_IMAGE, "command": ["sh", "-c", script]}
    )
    pod, out = run_to_completion(cluster, namespace, doc.obj())
    assert pod["spec"]["nodeName"] == REAL_NODE
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert f"uid={UID} gid={UID} home=/tmp" in out, out
    assert "root: read-only" in out, out
    assert "tmp: writable" in out and "token: none" in out, out
    for c in ("tunefleet-operator", "tunefleet-publish", "tunefleet-fetch", "tunefleet-bootstrap"):
        assert f"/opt/tunefleet/bin/{c}" in out, out
    assert "usage: tunefleet-fetch" in out, out
    # The container really ran on this machine: containerd reports the image by digest.
    status = pod["status"]["containerStatuses"][0]
    assert status["imageID"].startswith("sha256:") or "@sha256:" in status["imageID"], status
    assert status["state"]["terminated"]["exitCode"] == 0


def test_pod_reaches_the_api_server_through_the_kubernetes_service(
    cluster: Cluster, namespace: str, node_images: set[str]
) -> None:
    script = textwrap.dedent(
        """
        import json, os
        from kubernetes import client, config
        config.load_incluster_config()  # KUBERNETES_SERVICE_HOST/PORT + the ServiceAccount token
        review = client.AuthenticationV1Api().create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        print(json.dumps({
            "service": f"{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}",
            "username": review.status.user_info.username,
            "version": client.VersionApi().get_code().git_version,
        }))
        """
    )
    doc = (
        ON_REAL_NODE.name("in-cluster")
        .spec(automountServiceAccountToken=True)
        .containers({**MAIN, "image": TUNEFLEET_IMAGE, "command": ["python3", "-c", script]})
    )
    _, out = run_to_completion(cluster, namespace, doc.obj())
    result = json.loads(out.strip().splitlines()[-1])
    service = cluster.kubectl_json("get", "service", "-n", "default", "kubernetes")
    assert result["service"] == f"{service['spec']['clusterIP']}:443", result
    assert result["username"] == f"system:serviceaccount:{namespace}:default", result
    assert result["version"] == "v1.36.3", result


def test_pod_reaches_the_s3_server(
    cluster: Cluster, s3: S3Settings, namespace: str, node_images: set[str]
) -> None:
    assert s3.pod_endpoint.startswith("http://"), s3
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
    }
    key = f"real-node-e2e/{namespace}/{uuid.uuid4().hex}"
    script = textwrap.dedent(
        f"""
        import boto3, os
        s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL_S3"])
        s3.head_bucket(Bucket=os.environ["TUNEFLEET_S3_BUCKET"])
        s3.put_object(Bucket=os.environ["TUNEFLEET_S3_BUCKET"], Key="{key}", Body=b"from a pod")
        print("head_bucket ok, put", "{key}")
        """
    )
    env = [
        {"name": "AWS_ENDPOINT_URL_S3", "value": s3.pod_endpoint},
        {"name": "AWS_REGION", "value": s3.region},
        {"name": "TUNEFLEET_S3_BUCKET", "value": s3.bucket},
    ]
    doc = ON_REAL_NODE.name("s3-probe").containers(
        {
            **MAIN,
            "image": TUNEFLEET_IMAGE,
            "command": ["python3", "-c", script],
            "env": env,
            "envFrom": [{"secretRef": {"name": "s3"}}],
        }
    )
    apply(cluster, namespace, secret)
    _, out = run_to_completion(cluster, namespace, doc.obj())
    assert "head_bucket ok" in out, out
    client = s3.client()
    try:
        body = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        assert body == b"from a pod"
    finally:
        client.delete_object(Bucket=s3.bucket, Key=key)


WEBHOOK_SERVER = textwrap.dedent(
    """
    import base64, http.server, json, os, ssl

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            patch = [{"op": "add", "path": "/metadata/annotations", "value": {
                "e2e.tunefleet.io/webhook-pod": os.environ["POD_NAME"],
                "e2e.tunefleet.io/caller": self.client_address[0]}}]
            body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": review["request"]["uid"], "allowed": True,
                             "patchType": "JSONPatch",
                             "patch": base64.b64encode(json.dumps(patch).encode()).decode()}})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())
            print("admission call from", self.client_address[0], flush=True)

    server = http.server.HTTPServer(("", 8443), Hook)  # the pod's own network namespace
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain("/tls/tls.crt", "/tls/tls.key")
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    print("serving on :8443", flush=True)
    server.serve_forever()
    """
)


def _service_cert(tmp: Path, dns: str) -> tuple[bytes, bytes, bytes]:
    """A throwaway CA and a serving certificate for a Service's DNS name (openssl CLI)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=e2e-ca",
    )
    openssl("req", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={dns}")
    (tmp / "ext").write_text(f"subjectAltName=DNS:{dns}\nextendedKeyUsage=serverAuth\n")
    openssl(
        "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", "ext", "-out", "tls.crt",
    )  # fmt: skip
    return (
        (tmp / "ca.crt").read_bytes(),
        (tmp / "tls.crt").read_bytes(),
        (tmp / "tls.key").read_bytes(),
    )


@pytest.fixture
def service_webhook(
    cluster: Cluster, namespace: str, node_images: set[str]
) -> Iterator[dict[str, str]]:
    """A mutating webhook served by a pod on the real node, registered by Service reference:
    the API server calls the Service's ClusterIP, which only kube-proxy's iptables rules in
    this machine's network namespace turn into the pod's address."""
    svc = "hook"
    with tempfile.TemporaryDirectory() as tmp:
        ca, crt, key = _service_cert(Path(tmp), f"{svc}.{namespace}.svc")
    tls = (
        make_object("v1", "Secret", "hook-tls")
        .fields(
            type="kubernetes.io/tls",
            data={
                "tls.crt": base64.b64encode(crt).decode(),
                "tls.key": base64.b64encode(key).decode(),
            },
        )
        .obj()
    )
    pod = (
        ON_REAL_NODE.name("hook")
        .labels({"app": "hook"})
        .spec(
            restartPolicy="Always",
            volumes=[TMP_VOLUME, {"name": "tls", "secret": {"secretName": "hook-tls"}}],
        )
        .containers(
            {
                **MAIN,
                "image": TUNEFLEET_IMAGE,
                "command": ["python3", "-c", WEBHOOK_SERVER],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                ],
                "ports": [{"containerPort": 8443}],
                "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 1},
                "volumeMounts": [TMP_MOUNT, {"name": "tls", "mountPath": "/tls", "readOnly": True}],
            }
        )
        .obj()
    )
    service = (
        make_object("v1", "Service", svc)
        .spec(selector={"app": "hook"}, ports=[{"port": 443, "targetPort": 8443}])
        .obj()
    )
    apply(cluster, namespace, tls, pod, service)
    wait_for(
        lambda: condition(get_pod(cluster, namespace, "hook"), "Ready"),
        timeout=120,
        describe="the webhook pod Ready",
        until=lambda c: (c or {}).get("status") == "True",
    )
    name = f"e2e-real-node-{namespace}"
    hooks = [
        {
            "name": "hook.e2e.tunefleet.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            # Fail: an unreachable webhook makes the create fail, so the test can't pass
            # without the call.
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": {
                "service": {"namespace": namespace, "name": svc, "port": 443, "path": "/"},
                "caBundle": base64.b64encode(ca).decode(),
            },
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "objectSelector": {"matchLabels": {"e2e.tunefleet.io/hook": "yes"}},
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["configmaps"],
                }
            ],
        }
    ]
    config = (
        make_object("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", name)
        .fields(webhooks=hooks)
        .obj()
    )
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(config))
    try:
        yield {"service": svc, "pod": "hook"}
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found")


def test_api_server_reaches_a_pod_through_a_clusterip_service(
    cluster: Cluster, namespace: str, service_webhook: dict[str, str]
) -> None:
    svc = cluster.kubectl_json("get", "service", "-n", namespace, service_webhook["service"])
    cluster_ip = svc["spec"]["clusterIP"]
    assert cluster_ip.startswith("10.96."), svc["spec"]
    pod = get_pod(cluster, namespace, service_webhook["pod"])
    assert pod["spec"]["nodeName"] == REAL_NODE

    # kube-proxy programs the Service in this machine's nat table (iptables mode).
    def nat() -> str:
        return subprocess.run(
            ["iptables-save", "-t", "nat"], capture_output=True, text=True, check=True
        ).stdout

    wait_for(
        nat,
        timeout=30,
        describe=f"kube-proxy's rule for {cluster_ip}",
        until=lambda rules: (
            f"-d {cluster_ip}/32" in rules and f"{namespace}/{service_webhook['service']}" in rules
        ),
    )

    def create() -> dict[str, Any]:
        name = f"cm-{uuid.uuid4().hex[:6]}"
        doc = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"e2e.tunefleet.io/hook": "yes"}},
        }
        apply(cluster, namespace, doc)
        cm: dict[str, Any] = cluster.kubectl_json("get", "configmap", "-n", namespace, name)
        return cm

    # The first call can race kube-proxy's rule sync (minSyncPeriod 1s): retry briefly.
    cm = wait_for(create, timeout=30, interval=1, describe="a ConfigMap admitted by the webhook")
    annotations = cm["metadata"].get("annotations") or {}
    assert annotations.get("e2e.tunefleet.io/webhook-pod") == service_webhook["pod"], cm
    # The API server dialled the ClusterIP from this machine: the source is the host address.
    assert annotations.get("e2e.tunefleet.io/caller") == REAL_NODE_IP, cm
    assert "admission call from" in logs(cluster, namespace, service_webhook["pod"])


def test_kubectl_logs_and_exec_work(
    cluster: Cluster, namespace: str, node_images: set[str]
) -> None:
    doc = ON_REAL_NODE.name("sleeper").containers(
        {
            **MAIN,
            "image": TUNEFLEET_IMAGE,
            "command": ["sh", "-c", "echo hello from the real node; exec sleep 3600"],
        }
    )
    apply(cluster, namespace, doc.obj())
    wait_phase(cluster, namespace, "sleeper", {"Running"})
    wait_for(
        lambda: logs(cluster, namespace, "sleeper"),
        timeout=30,
        describe="the pod's log",
        until=lambda out: "hello from the real node" in out,
    )
    out = cluster.kubectl("exec", "-n", namespace, "sleeper", "--", "id", "-u").stdout
    assert out.strip() == str(UID)


def test_standin_inference_image_reports_tunableop_env_and_results(
    cluster: Cluster, namespace: str, node_images: set[str]
) -> None:
    assert {STANDIN_IMAGE, STANDIN_NOGPU_IMAGE} <= node_images
    results = {
        f"tunableop_results{i}.csv": (
            "Validator,PT_VERSION,2.11.0+standin\n"
            "Validator,ROCBLAS_VERSION,stand-in\n"
            f"GemmTunableOp_float_NT,nt_{i}_8_16,Default,0.0\n"
        )
        for i in range(2)
    }
    files = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "results"},
        "data": results,
    }

    # A model pod (its image given per pod) asks for GPUs: the scheduler sends it to the node
    # that has some (fake), and ExtendedResourceToleration adds the toleration for its taint.
    model = HARDENED.spec(
        restartPolicy="Always",
        volumes=[TMP_VOLUME, {"name": "results", "configMap": {"name": "results"}}],
    ).selector({"nvidia.com/gpu.product": REAL_NODE_GPU_MODEL})
    server = {
        **MAIN,
        "command": ["standin-server"],
        "env": [
            {"name": "PYTORCH_TUNABLEOP_ENABLED", "value": "1"},
            {"name": "PYTORCH_TUNABLEOP_TUNING", "value": "0"},
            {"name": "PYTORCH_TUNABLEOP_FILENAME", "value": "/results/tunableop_results%d.csv"},
        ],
        "resources": {"limits": {"nvidia.com/gpu": "2"}},
        "volumeMounts": [TMP_MOUNT, {"name": "results", "mountPath": "/results", "readOnly": True}],
    }

    # The node's fake GPUs are shared (the demo, a developer's pods): wait for 2 x 2 of them,
    # or fail naming what holds them.
    wait_for_real_node_gpus(cluster, 4)
    apply(
        cluster,
        namespace,
        files,
        model.name("model").containers({**server, "image": STANDIN_IMAGE}).obj(),
    )
    apply(
        cluster,
        namespace,
        model.name("model-nogpu").containers({**server, "image": STANDIN_NOGPU_IMAGE}).obj(),
    )
    for name in ("model", "model-nogpu"):
        pod = wait_phase(cluster, namespace, name, {"Running"})
        assert pod["spec"]["nodeName"] == REAL_NODE
        tolerations = pod["spec"].get("tolerations") or []
        assert any(t.get("key") == "nvidia.com/gpu" for t in tolerations), tolerations

    out = wait_for(
        lambda: logs(cluster, namespace, "model"),
        timeout=60,
        describe="the stand-in server's report",
        until=lambda text: "sleeping" in text,
    )
    lines = [line for line in out.splitlines() if line.strip()]
    assert all(line.startswith("[stand-in") for line in lines), out
    assert "[stand-in] env PYTORCH_TUNABLEOP_FILENAME=/results/tunableop_results%d.csv" in out
    assert "[stand-in] env PYTORCH_TUNABLEOP_TUNING=0" in out
    for i in range(2):
        size = len(results[f"tunableop_results{i}.csv"].encode())
        assert (
            f"[stand-in] results ordinal {i}: /results/tunableop_results{i}.csv ({size} bytes) "
            "Validator,PT_VERSION,2.11.0+standin"
        ) in out, out
    assert "results ordinal 2" not in out
    assert "GPU available: True" in out, out

    nogpu = wait_for(
        lambda: logs(cluster, namespace, "model-nogpu"),
        timeout=60,
        describe="the no-GPU stand-in server's report",
        until=lambda text: "sleeping" in text,
    )
    assert "FAKE_TORCH_MODE=no-device" in nogpu and "GPU available: False" in nogpu, nogpu


def test_pods_without_gpu_requests_never_land_on_the_real_node(
    cluster: Cluster, namespace: str
) -> None:
    # Asked for by name, without tolerating its taint: the scheduler says why not.
    never = HARDENED.containers(
        {**MAIN, "image": "registry.invalid/never-pulled:1", "command": ["true"]}
    )
    pinned = never.name("pinned").selector({"kubernetes.io/hostname": REAL_NODE}).obj()
    # Ordinary pods: all of them go to kwok-cpu-0, whose taint test namespaces tolerate by
    # default (testbed/cluster.py: create_namespace); the GPU nodes' taints keep them off
    # the rest of the fleet.
    plain = [never.name(f"plain-{i}").obj() for i in range(8)]
    apply(cluster, namespace, pinned, *plain)

    def scheduled() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
        return items

    pods = wait_for(
        scheduled,
        timeout=60,
        describe="every plain pod scheduled and the pinned one refused",
        until=lambda items: (
            all(
                p["spec"].get("nodeName")
                or (condition(p, "PodScheduled") or {}).get("reason") == "Unschedulable"
                for p in items
            )
            and len(items) == 9
        ),
    )
    by_name = {p["metadata"]["name"]: p for p in pods}
    refused = by_name.pop("pinned")
    assert not refused["spec"].get("nodeName")
    message = (condition(refused, "PodScheduled") or {}).get("message", "")
    # kwok-cpu-0 (its taint tolerated) is not the one asked for; the other six, the real node
    # among them, have a GPU taint the pod does not tolerate.
    assert "1 node(s) didn't match Pod's node affinity/selector" in message, message
    assert "6 node(s) had untolerated taint" in message, message
    tolerations = by_name["plain-0"]["spec"].get("tolerations") or []
    assert any(t.get("key") == "kwok.x-k8s.io/node" for t in tolerations), tolerations
    for name, pod in by_name.items():
        assert pod["spec"]["nodeName"] == "kwok-cpu-0", (name, pod["spec"]["nodeName"])


def test_pod_logs_are_not_readable_without_kubelet_rights(cluster: Cluster) -> None:
    """The kubelet checks who calls it: the API server's client certificate is allowed
    (logs and exec work above); an anonymous caller is not."""
    ca = str(Path(cluster.state_dir) / "pki" / "ca.crt")
    out = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", ca, "--max-time", "5",
         f"https://{REAL_NODE_IP}:20250/pods"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.stdout == "401", out
