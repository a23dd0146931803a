"""The local control plane is the real thing: version, fake GPU fleet, scheduler, Job and GC
controllers, admission webhooks, RBAC, and the S3 server's checksums and conditional puts.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import ssl
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from botocore.exceptions import ClientError
from kubernetes.client import ApiClient, Configuration, CoreV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from testbed.builders.wrappers import make_object, make_pod
from testbed.cluster import (
    Cluster,
    S3Settings,
    condition,
    fleet,
    get_config_map,
    get_job,
    get_pod,
    list_pods,
    wait_for,
    wait_for_condition,
)

pytestmark = pytest.mark.e2e

MI300X = "AMD_Instinct_MI300X_OAM"
AMD_LABEL = "amd.com/gpu.product-name"


@pytest.fixture
def api(cluster: Cluster) -> Iterator[ApiClient]:
    client = cluster.api_client()
    yield client
    client.close()


def apply(cluster: Cluster, namespace: str, *docs: dict[str, Any]) -> None:
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs)
    )


def nodes_by_label(key: str, value: str) -> set[str]:
    return {n["metadata"]["name"] for n in fleet() if n["metadata"]["labels"].get(key) == value}


# --- version and fleet --------------------------------------------------------------------


def test_api_server_is_v1_36_3(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("get", "--raw", "/version").stdout)
    assert version["gitVersion"] == "v1.36.3", version


def test_fake_gpu_nodes_are_ready_with_the_fleets_labels_and_capacity(cluster: Cluster) -> None:
    want = {n["metadata"]["name"]: n for n in fleet()}
    models = {
        n["metadata"]["labels"].get(AMD_LABEL)
        or n["metadata"]["labels"].get("nvidia.com/gpu.product")
        for n in want.values()
    }
    # The fleet itself is what the tests and the demo rely on: both vendors, several models.
    assert {MI300X, "AMD_Instinct_MI325X_OAM", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"} <= models
    assert len(nodes_by_label(AMD_LABEL, MI300X)) == 2

    live = {n["metadata"]["name"]: n for n in cluster.kubectl_json("get", "nodes")["items"]}
    assert set(want) <= set(live), f"missing nodes: {set(want) - set(live)}"
    for name, node in want.items():
        got = live[name]
        ready = condition(got, "Ready")
        assert ready and ready["status"] == "True", (name, got["status"].get("conditions"))
        for key, value in node["metadata"]["labels"].items():
            assert got["metadata"]["labels"].get(key) == value, (name, key)
        for field in ("capacity", "allocatable"):
            for res, qty in node["status"][field].items():
                assert parse_quantity(got["status"][field][res]) == parse_quantity(qty), (
                    name,
                    field,
                    res,
                )
        gpus = {k: v for k, v in got["status"]["capacity"].items() if k.endswith("/gpu")}
        expected = {k: v for k, v in node["status"]["capacity"].items() if k.endswith("/gpu")}
        assert gpus == expected, name
        # Tainted as real GPU pools are (<vendor>.com/gpu=present:NoSchedule), the CPU node
        # with kwok's own taint: nothing lands where no container runs by accident.
        (resource,) = expected or {"kwok.x-k8s.io/node": None}
        value = "fake" if resource.startswith("kwok") else "present"
        want_taint = {"key": resource, "value": value, "effect": "NoSchedule"}
        assert got["spec"].get("taints") == [want_taint], (name, got["spec"].get("taints"))
        assert node["spec"]["taints"] == [want_taint], name


# --- scheduler and Job controller ---------------------------------------------------------


def test_gpu_job_runs_on_the_requested_model_and_completes(
    cluster: Cluster, api: ApiClient, namespace: str
) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "mi300x"},
        "spec": {
            "completions": 4,
            "parallelism": 4,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {AMD_LABEL: MI300X},
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.invalid/never-pulled:1",
                            "resources": {"limits": {"amd.com/gpu": "1"}},
                        }
                    ],
                }
            },
        },
    }
    apply(cluster, namespace, job)
    done = wait_for_condition(
        lambda: get_job(api, namespace, "mi300x"), "Complete", timeout=90, describe="Job Complete"
    )
    assert done["status"]["succeeded"] == 4
    pods = list_pods(api, namespace, "batch.kubernetes.io/job-name=mi300x")
    assert len(pods) == 4
    mi300x = nodes_by_label(AMD_LABEL, MI300X)
    for pod in pods:
        assert pod["spec"]["nodeName"] in mi300x, pod["spec"]["nodeName"]
        assert pod["status"]["phase"] == "Succeeded"
        assert (condition(pod, "PodScheduled") or {}).get("status") == "True"


def test_unsatisfiable_gpu_requests_stay_pending_with_the_schedulers_reason(
    cluster: Cluster, api: ApiClient, namespace: str
) -> None:
    def pod(name: str, model: str, gpus: int) -> dict[str, Any]:
        image = "registry.invalid/never-pulled:1"
        return (
            make_pod(name, "").selector({AMD_LABEL: model})
            .container("main", image, gpus=gpus, gpu_resource="amd.com/gpu").obj()
        )  # fmt: skip

    apply(cluster, namespace, pod("no-such-model", "AMD_Instinct_MI355X_OAM", 1))
    apply(cluster, namespace, pod("too-many-gpus", MI300X, 9))

    for name, why in (
        ("no-such-model", "didn't match Pod's node affinity/selector"),
        ("too-many-gpus", "Insufficient amd.com/gpu"),
    ):
        got = wait_for_condition(
            functools.partial(get_pod, api, namespace, name),
            "PodScheduled",
            "False",
            reason="Unschedulable",
            timeout=60,
        )
        message = (condition(got, "PodScheduled") or {}).get("message", "")
        assert why in message, message
        assert got["status"]["phase"] == "Pending"
        assert not got["spec"].get("nodeName")


# --- garbage collector --------------------------------------------------------------------


def test_deleting_an_owner_deletes_what_it_owns(
    cluster: Cluster, api: ApiClient, namespace: str
) -> None:
    core = CoreV1Api(api)
    parent = core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "parent"}, "data": {"role": "owner"}}
    )
    owner_ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "parent",
        "uid": parent.metadata.uid,
        "blockOwnerDeletion": True,
    }
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "child", "ownerReferences": [owner_ref]}}
    )
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "bystander"}})
    assert get_config_map(api, namespace, "child") is not None

    core.delete_namespaced_config_map("parent", namespace)
    wait_for(
        lambda: get_config_map(api, namespace, "child") is None,
        timeout=60,
        describe="the garbage collector to delete the owned ConfigMap",
    )
    assert get_config_map(api, namespace, "bystander") is not None


# --- admission webhooks -------------------------------------------------------------------


def _serving_cert(tmp: Path) -> tuple[bytes, Path, Path]:
    """A throwaway CA and a serving certificate for 127.0.0.1 (openssl CLI)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=webhook-test-ca")  # fmt: skip
    openssl("req", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=127.0.0.1")
    (tmp / "ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-extfile", "ext", "-out", "tls.crt")  # fmt: skip
    return (tmp / "ca.crt").read_bytes(), tmp / "tls.crt", tmp / "tls.key"


class _Webhook:
    """A mutating webhook on https://127.0.0.1:<port>/mutate that labels and annotates pods
    and records every AdmissionReview it receives."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                req = review["request"]
                outer.requests.append(req)
                patch = [
                    {"op": "add", "path": "/metadata/labels/webhook.test~1mutated", "value": "yes"},
                    {
                        "op": "add",
                        "path": "/metadata/annotations",
                        "value": {
                            "webhook.test/uid": req["uid"],
                            "webhook.test/path": urlsplit(self.path).path,
                        },
                    },
                ]
                response = {
                    "uid": req["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                }
                review = make_object("admission.k8s.io/v1", "AdmissionReview")
                body = json.dumps(review.fields(response=response).obj()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_api_server_calls_a_mutating_webhook_by_url_and_stores_its_patch(
    cluster: Cluster, api: ApiClient, namespace: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ca, cert, key = _serving_cert(Path(tmp))
        hook = _Webhook(cert, key)
    name = f"control-plane-test-{namespace}"
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "mutate.control-plane.test.tunefleet.io",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{hook.port}/mutate",
                    "caBundle": base64.b64encode(ca).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                # Only this test's namespace and labelled pods: other tests never see it.
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "objectSelector": {"matchLabels": {"webhook.test/opt-in": "yes"}},
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
            }
        ],
    }

    def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
        return make_pod(name, "").labels(labels).container("main", "registry.invalid/x:1").obj()

    try:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(config))
        # The API server picks up webhook configurations asynchronously: probe with dry runs
        # (called too, as the webhook declares no side effects) until it is in effect.
        wait_for(
            lambda: json.loads(
                cluster.kubectl(
                    "create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-",
                    input=json.dumps(pod("probe", {"webhook.test/opt-in": "yes"})),
                ).stdout
            )["metadata"]["labels"].get("webhook.test/mutated"),
            timeout=30,
            describe="the webhook configuration to take effect",
        )  # fmt: skip
        calls_before = len(hook.requests)
        for p in (pod("opted-in", {"webhook.test/opt-in": "yes"}), pod("not-opted-in", {})):
            cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(p))

        stored = get_pod(api, namespace, "opted-in")
        assert stored is not None
        assert stored["metadata"]["labels"]["webhook.test/mutated"] == "yes"
        assert stored["metadata"]["annotations"]["webhook.test/path"] == "/mutate"
        calls = hook.requests[calls_before:]
        assert [c["name"] for c in calls] == ["opted-in"], calls
        assert calls[0]["operation"] == "CREATE" and calls[0]["namespace"] == namespace
        assert stored["metadata"]["annotations"]["webhook.test/uid"] == calls[0]["uid"]

        other = get_pod(api, namespace, "not-opted-in")
        assert other is not None
        assert "webhook.test/mutated" not in (other["metadata"].get("labels") or {})
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found")
        hook.close()


# --- RBAC ---------------------------------------------------------------------------------


def test_service_account_token_is_refused_until_rbac_allows_it(
    cluster: Cluster, api: ApiClient, namespace: str
) -> None:
    cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    token = cluster.kubectl(
        "create", "token", "reader", "-n", namespace, "--duration", "10m"
    ).stdout.strip()

    admin = api.configuration
    conf = Configuration()
    conf.host = admin.host
    conf.ssl_ca_cert = admin.ssl_ca_cert
    conf.api_key = {"authorization": f"Bearer {token}"}
    with ApiClient(conf) as as_reader:
        reader = CoreV1Api(as_reader)
        with pytest.raises(ApiException) as refused:
            reader.list_namespaced_pod(namespace)
        assert refused.value.status == 403
        assert f"system:serviceaccount:{namespace}:reader" in str(refused.value.body)

        cluster.kubectl(
            "create", "role", "pod-reader", "-n", namespace, "--verb=get,list", "--resource=pods"
        )
        cluster.kubectl(
            "create", "rolebinding", "reader-reads-pods", "-n", namespace,
            "--role=pod-reader", f"--serviceaccount={namespace}:reader",
        )  # fmt: skip
        pods = wait_for(
            lambda: reader.list_namespaced_pod(namespace),
            timeout=30,
            describe="the RoleBinding to let the token list pods",
        )
        assert pods.items == []
        # Only in its namespace, and only what the Role says.
        calls: list[Callable[[], object]] = [
            lambda: reader.list_namespaced_pod("default"),
            lambda: reader.list_namespaced_config_map(namespace),
        ]
        for call in calls:
            with pytest.raises(ApiException) as still_refused:
                call()
            assert still_refused.value.status == 403


# --- S3 -----------------------------------------------------------------------------------


def test_s3_sha256_checksums_and_if_none_match(s3: S3Settings) -> None:
    client = s3.client()
    key = f"tests/control-plane/{uuid.uuid4()}/results.csv"
    body = os.urandom(1 << 20) + b"\nOpSig,ParamSig,Solution,ms\n"
    sha = base64.b64encode(hashlib.sha256(body).digest()).decode()
    try:
        put = client.put_object(
            Bucket=s3.bucket, Key=key, Body=body, ChecksumAlgorithm="SHA256", IfNoneMatch="*"
        )
        assert put["ChecksumSHA256"] == sha

        got = client.get_object(Bucket=s3.bucket, Key=key, ChecksumMode="ENABLED")
        assert got["Body"].read() == body
        assert got["ChecksumSHA256"] == sha
        head = client.head_object(Bucket=s3.bucket, Key=key, ChecksumMode="ENABLED")
        assert head["ChecksumSHA256"] == sha

        # Content-addressed keys are never overwritten: the second put is refused.
        with pytest.raises(ClientError) as conflict:
            client.put_object(
                Bucket=s3.bucket, Key=key, Body=b"other", ChecksumAlgorithm="SHA256",
                IfNoneMatch="*",
            )  # fmt: skip
        err = conflict.value.response
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 412, err
        assert err["Error"]["Code"] == "PreconditionFailed", err
        assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == body

        # A body that does not match its declared checksum is refused, not stored.
        bad_key = key + ".bad"
        with pytest.raises(ClientError) as mismatch:
            client.put_object(
                Bucket=s3.bucket, Key=bad_key, Body=b"corrupted in flight",
                ChecksumSHA256=base64.b64encode(hashlib.sha256(b"sent").digest()).decode(),
            )  # fmt: skip
        assert mismatch.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        listed = client.list_objects_v2(Bucket=s3.bucket, Prefix=bad_key)
        assert listed.get("KeyCount", 0) == 0
    finally:
        client.delete_object(Bucket=s3.bucket, Key=key)
