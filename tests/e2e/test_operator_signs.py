"""Signing and the store broker by the operator on the real node (issue 54, docs/trust.md):
the chart's signing.secret holds the key pair, and signing.storeCredentialsSecret the store's
publish identity, both in the operator's namespace; an s3:// profile that signs gets its
manifest signed through the operator's endpoint, and its tuning pod reaches the store through
URLs the operator presigns for the Job's own keys; an oci:// one's pushes and reads through
the operator's registry proxy (signing.registryCredentialsSecret): no tuning pod holds a key
or a credential.

What is checked, each against real parts: the tuning pod's volumes, env and projected tokens
(no Secret at all, though the profile names its publish Secret; the signing token mounted by
publish alone, the store token by sync and publish);
the stored signature with cosign itself (`cosign verify-blob`); the attestation's Job uid and
cluster against the API server's; the artifact delivered (the operator verifies it with the
profile's public key first) and served; and a pod of anyone's making, with a token of the
signing and store audiences, asking the real endpoint (real TokenReview) for a signature and
a presigned URL: refused.
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.signing import credential_refs
from testbed.builders.wrappers import make_pod
from testbed.cluster import wait_for_real_node_gpus
from testbed.oci_volumes import delivery, volume_profile
from testbed.oci_volumes import secrets as oci_secrets
from testbed.operator import InCluster, operator_signing
from testbed.real_node import model_pod, real_profile
from testbed.registry import Registry, cosign
from tests.support.kube import apply, create, ended, get_json, jobs_of, ready
from tunefleet.contracts import sign_request as sr
from tunefleet.contracts import store_broker as sb

pytestmark = pytest.mark.e2e


def secrets_read(pod: dict[str, Any]) -> list[str]:
    """Every Secret the pod reads: volumes, projected sources, env, envFrom."""
    spec = pod["spec"]
    names = set()
    for v in spec.get("volumes") or []:
        if "secret" in v:
            names.add(v["secret"]["secretName"])
        for s in (v.get("projected") or {}).get("sources") or []:
            if "secret" in s:
                names.add(s["secret"]["name"])
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
        for e in c.get("envFrom") or []:
            if "secretRef" in e:
                names.add(e["secretRef"]["name"])
    return sorted(names)


def secrets_with_a_private_key(cluster: Any, namespace: str, pod: dict[str, Any]) -> list[str]:
    """Every Secret the pod reads that holds a private key (a key named like cosign's, or a
    PEM private key in its values)."""
    names = secrets_read(pod)
    holding = []
    for name in sorted(names):
        data = get_json(cluster, "secret", "-n", namespace, name).get("data") or {}
        text = " ".join(base64.b64decode(v).decode("latin-1") for v in data.values())
        if "cosign.key" in data or "PRIVATE KEY" in text:
            holding.append(name)
    return holding


def _token_volume(name: str, audience: str) -> dict[str, Any]:
    token = {"audience": audience, "expirationSeconds": 600, "path": "token"}
    return {"name": name, "projected": {"sources": [{"serviceAccountToken": token}]}}


def ask_as_anyone(cluster: Any, namespace: str, tuning_pod: dict[str, Any], key: str) -> str:
    """A pod of the test's making (tunefleet's image, projected tokens of the signing and store
    audiences in volumes named as the tuning pod's, no Job) asks the operator's endpoint for a
    signature and for a URL to read `key`, as publish would: what the endpoint answered, a
    line each."""
    steps = tuning_pod["spec"]["initContainers"] + tuning_pod["spec"]["containers"]
    publish = next(c for c in steps if c["name"] == "publish")
    command = publish["command"]
    url = command[command.index("--sign-url") + 1]
    address = command[command.index("--sign-address") + 1] if "--sign-address" in command else ""
    ca = next(e["value"] for e in publish["env"] if e["name"] == "TUNEFLEET_SIGN_CA")
    script = (
        "import os;from tunefleet import pod_https;from tunefleet.contracts import "
        "sign_request as sr, store_broker as sb;e=pod_https.Endpoint(os.environ['URL'],"
        "os.environ['CA'],os.environ['ADDRESS']);t=open(sr.TOKEN_DIR+'/token').read().strip();"
        "a=e.post(sr.PATH,sr.Request(b'{}').encode(),t,65536);"
        "print(a.status,sr.Reply.decode(a.body).message);"
        "t=open(sb.TOKEN_DIR+'/token').read().strip();"
        "a=e.post(sb.PATH,sb.Request('get',os.environ['KEY']).encode(),t,65536);"
        "print(a.status,sb.Reply.decode(a.body).message)"
    )
    env = [{"name": "URL", "value": url}, {"name": "CA", "value": ca}]
    env += [{"name": "ADDRESS", "value": address}, {"name": "KEY", "value": key}]
    pod = (
        make_pod("asks-anyway", "")
        .spec(
            restartPolicy="Never",
            automountServiceAccountToken=False,
            # Where the tuning pod ran (the real node), as it was let: a real container.
            nodeSelector=tuning_pod["spec"]["nodeSelector"],
            tolerations=tuning_pod["spec"].get("tolerations") or [],
            volumes=[
                _token_volume(sr.TOKEN_VOLUME, sr.AUDIENCE),
                _token_volume(sb.TOKEN_VOLUME, sb.AUDIENCE),
            ],
        )
        .container(
            "ask",
            publish["image"],
            env=env,
            imagePullPolicy="Never",
            command=["python3", "-c", script],
            volumeMounts=[
                {"name": sr.TOKEN_VOLUME, "mountPath": sr.TOKEN_DIR},
                {"name": sb.TOKEN_VOLUME, "mountPath": sb.TOKEN_DIR},
            ],
        )
        .obj()
    )
    create(cluster, namespace, pod)
    done = ended(cluster, namespace, "asks-anyway", "the pod that asks anyway to run")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    return str(cluster.kubectl("logs", "-n", namespace, "asks-anyway").stdout)


def test_the_operator_signs_what_its_own_job_tuned_and_no_tuning_pod_holds_a_key(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str, tmp_path: Path
) -> None:
    wait_for_real_node_gpus(cluster, 3)
    with operator_signing(cluster, s3) as public:
        signing = {"policy": "Required", "publicKey": public}
        profile = real_profile("signed", s3, s3_secret)
        profile["spec"]["storage"]["signing"] = signing
        apply(cluster, namespace, profile)
        try:
            prof = ready(cluster, namespace, "signed", timeout=240)
        except AssertionError:
            prof = get_json(cluster, "tp", "-n", namespace, "signed")
        if prof.get("status", {}).get("phase") != "Ready":
            logs = cluster.kubectl(
                "logs", "-n", namespace, "-l", "tunefleet.io/tuning-profile=signed",
                "-c", "publish", "--tail=30", check=False,
            ).stdout  # fmt: skip
            raise AssertionError(json.dumps(prof.get("status"), indent=2)[:3000] + "\n" + logs)
        (job,) = jobs_of(cluster, namespace, "signed")
        (pod,) = get_json(
            cluster, "pods", "-n", namespace, "-l",
            f"batch.kubernetes.io/job-name={job['metadata']['name']}",
        )["items"]  # fmt: skip

        # The tuning pod: no Secret at all (the profile names its publish Secret: brokered, it
        # is not mounted), so no private key and no credential of the store; two projected
        # tokens, the signing one mounted by publish alone, the store one by sync and publish.
        assert secrets_read(pod) == [] and s3_secret in json.dumps(profile)
        assert secrets_with_a_private_key(cluster, namespace, pod) == []
        tokens = sorted(
            (v["name"], s["serviceAccountToken"]["audience"])
            for v in pod["spec"]["volumes"]
            for s in (v.get("projected") or {}).get("sources") or []
            if "serviceAccountToken" in s
        )
        assert tokens == [(sr.TOKEN_VOLUME, sr.AUDIENCE), (sb.TOKEN_VOLUME, sb.AUDIENCE)], tokens
        steps = pod["spec"]["initContainers"] + pod["spec"]["containers"]

        def holders(volume: str) -> list[str]:
            return [
                c["name"]
                for c in steps
                if any(m["name"] == volume for m in c.get("volumeMounts") or [])
            ]

        assert holders(sr.TOKEN_VOLUME) == ["publish"]
        assert holders(sb.TOKEN_VOLUME) == ["sync", "publish"]
        assert pod["spec"]["automountServiceAccountToken"] is False
        env = [e for c in steps for e in c.get("env") or []]
        assert not [e["name"] for e in env if e["name"].startswith("AWS_SECRET")], env

        # The stored signature verifies with cosign itself; the attestation names this Job.
        (art,) = prof["status"]["artifacts"]
        bucket, key = art["uri"][len("s3://") :].split("/", 1)
        client = s3.client()

        def body(name: str) -> bytes:
            got: bytes = client.get_object(Bucket=bucket, Key=f"{key}/{name}")["Body"].read()
            return got

        (tmp_path / "manifest.json").write_bytes(body("manifest.json"))
        (tmp_path / "manifest.json.sig").write_bytes(body("manifest.json.sig"))
        (tmp_path / "cosign.pub").write_text(public)
        checked = cosign(
            [
                "verify-blob",
                "--key",
                str(tmp_path / "cosign.pub"),
                "--signature",
                str(tmp_path / "manifest.json.sig"),
                "--insecure-ignore-tlog=true",
                str(tmp_path / "manifest.json"),
            ],
            {**Registry.from_state().tool_env(Registry.from_state().reader)},
        )
        assert checked.returncode == 0, checked.stderr
        attestation = sr.payload_of(json.loads(body("manifest.json" + sr.ATTESTATION_SUFFIX)))
        cluster_uid = get_json(cluster, "namespace", "kube-system")["metadata"]["uid"]
        assert attestation.job_uid == job["metadata"]["uid"]
        assert attestation.cluster == cluster_uid
        assert (attestation.namespace, attestation.profile) == (namespace, "signed")

        # Delivered (the operator verified the signature with the profile's key) and served.
        assert art["delivery"] == "ConfigMap", art
        create(cluster, namespace, model_pod("model", "signed", gpus=2))
        done = ended(cluster, namespace, "model", "the model pod to run")
        assert done["status"]["phase"] == "Succeeded", done["status"]

        # The tuning pod's sync and publish wrote through the broker: the artifact and its
        # library entry (the publish step's log says so).
        published = cluster.kubectl(
            "logs", "-n", namespace, pod["metadata"]["name"], "-c", "publish"
        ).stdout
        assert "the GEMM library" in published and "warning" not in published, published

        # Anyone else's pod with tokens of the signing and store audiences is refused, by the
        # real TokenReview and the real pod read back.
        said = ask_as_anyone(cluster, namespace, pod, f"{key}/manifest.json").splitlines()
        # Past the real TokenReview (a 401 otherwise): the pod read back is no Job's.
        assert len(said) == 2, said
        for line in said:
            assert line.startswith("403 ") and "not controlled by a Job" in line, said


def test_an_oci_profiles_tuning_pod_holds_no_key_and_the_operator_signs_its_images(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, tmp_path: Path
) -> None:
    """oci:// with the operator signing (it reads the registry with delivery.oci's identity):
    the tuning pod mounts no key pair (the profile names a `signing` Secret: not mounted);
    publish asks the operator, which reads the bundle and the volume image as this manifest's
    and signs both formats; cosign verifies both images with the operator's public key, and
    the volume is mounted by a model pod. The pod mounts no Secret at all: sync and publish
    push and read through the operator's registry proxy, which holds the push identity."""
    registry = Registry.from_state()
    wait_for_real_node_gpus(cluster, 1)
    oci_secrets(cluster, namespace, registry)
    repository = f"e2e/{namespace}-{uuid.uuid4().hex[:6]}"
    with operator_signing(cluster, s3) as public:
        apply(cluster, namespace, volume_profile("ocisigned", s3, registry, repository, public))
        try:
            prof = ready(cluster, namespace, "ocisigned", timeout=300)
        except AssertionError:
            prof = get_json(cluster, "tp", "-n", namespace, "ocisigned")
        st = prof.get("status") or {}
        assert st.get("phase") == "Ready", json.dumps(st, indent=2)[:3000]
        (job,) = jobs_of(cluster, namespace, "ocisigned")
        (pod,) = get_json(
            cluster, "pods", "-n", namespace, "-l",
            f"batch.kubernetes.io/job-name={job['metadata']['name']}",
        )["items"]  # fmt: skip
        assert secrets_with_a_private_key(cluster, namespace, pod) == []
        assert secrets_read(pod) == [], secrets_read(pod)
        assert sorted(credential_refs(pod["spec"])) == [
            f"volume {sr.TOKEN_VOLUME}: token {sr.AUDIENCE}",
            f"volume {sb.TOKEN_VOLUME}: token {sb.AUDIENCE}",
        ]
        (art,) = st["artifacts"]
        assert art["bundle"]["signed"] is True, art
        (tmp_path / "operator.pub").write_text(public)
        for digest in (art["bundle"]["digest"], art["bundle"]["volume"]):
            check = [
                "verify", "--key", str(tmp_path / "operator.pub"), "--insecure-ignore-tlog=true",
                f"{registry.host}/{repository}@{digest}",
            ]  # fmt: skip
            done = cosign(check, registry.tool_env(registry.reader))
            assert done.returncode == 0, done.stderr
        delivered = delivery(cluster, namespace, "ocisigned", "ImageVolume")
        assert delivered["bundle"]["volume"] == art["bundle"]["volume"]
        create(cluster, namespace, model_pod("mounted", "ocisigned", gpus=1))
        done_pod = ended(cluster, namespace, "mounted", "the image-volume pod to finish")
        assert done_pod["status"]["phase"] == "Succeeded", done_pod["status"]
