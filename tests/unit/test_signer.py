"""Signing by the operator (signer/, contracts/sign_request.py, artifacts/remote_sign.py): the
key stays in the operator; a tuning pod asks with a token only its publish step mounts, and the
operator signs only a manifest it can vouch for, read against the pod, its Job and the profile
as the API server has them."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from dataclasses import replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from testbed.builders.signing import api_server_deps, profile_object
from testbed.builders.signing import job_and_pod as built_job_and_pod
from testbed.builders.wrappers import make_profile
from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.artifacts import sigbundle, signing
from tunefleet.artifacts.remote_sign import RemoteSigner, RemoteSignError
from tunefleet.builders.job import Child, build_merge_job, build_tuning_job
from tunefleet.config import Config
from tunefleet.contracts import sign_request as sr
from tunefleet.reconciler.gather import parse_spec
from tunefleet.runtime.pod_tokens import Caller, Denied
from tunefleet.signer.judge import Seen, judge
from tunefleet.signer.route import Deps, Endpoint, Signer
from tuner_job.manifest import Manifest

IMAGE = "ghcr.io/tunefleet/tunefleet:test"
DIGEST = "sha256:" + "ab" * 32
MODEL = "NVIDIA-H100"
NS, NAME, PUID = "ml", "llama", "uid-profile-1"
CONFIG = Config(
    image=IMAGE,
    signing_key_dir="/etc/tunefleet/signing",
    capture_url="https://tunefleet-webhook.tunefleet-system.svc:8443",
    capture_ca="-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    fleet_cluster="cluster-a",
)
KEY = ec.generate_private_key(ec.SECP256R1())
PUBLIC = (
    KEY.public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode()
)
SPEC = (
    make_profile(NAME)
    .image(f"registry.example.com/serve@{DIGEST}")
    .gpu("nvidia", MODEL)
    .command("python3", "serve.py")
    .storage(
        "s3://bucket/prefix",
        credentialsSecret={"name": "s3"},
        signing={"secret": {"name": "tenant-key"}, "publicKey": PUBLIC},
    )
    .spec_model()
)
CHILD = Child(SPEC, NS, NAME, PUID, MODEL, CONFIG)
NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)


def profile(spec: Any = SPEC) -> dict[str, Any]:
    return profile_object(spec, NS, NAME, PUID)


def job_and_pod(child: Child = CHILD, merge: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    return built_job_and_pod(build_merge_job(child) if merge else build_tuning_job(child))


def caller_of(pod: dict[str, Any]) -> Caller:
    return Caller(NS, "default", pod["metadata"]["name"], pod["metadata"]["uid"])


def manifest(**over: Any) -> bytes:
    m = Manifest(
        namespace=NS,
        profile=NAME,
        revision=naming.revision(SPEC),
        gpu_model=MODEL,
        results_sha256="cd" * 32,
        gemms=3,
        recorded=3,
        validators={"PT_VERSION": "2.11.0"},
        identity={"torch": "2.11.0"},
        tuning_seconds=1.0,
        tuned_at="2026-12-07T07:59:00Z",
        tool_version="0.2.0",
        fleet_identity=naming.identity_document(SPEC, MODEL),
    )
    return replace(m, **over).to_json()


def judged(
    pod: dict[str, Any], job: dict[str, Any] | None, prof: dict[str, Any] | None, data: bytes
) -> sr.Attestation:
    return judge(Seen(caller_of(pod), pod, job, prof), data, IMAGE, "cluster-a", NOW)


# --- what the builders make -----------------------------------------------------------------


def test_a_tuning_pod_holds_no_key_and_only_publish_mounts_the_signing_token() -> None:
    job, _ = job_and_pod()
    pod = job["spec"]["template"]["spec"]
    secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert "tenant-key" not in secrets  # the profile's key pair is mounted nowhere
    steps = pod["initContainers"] + pod["containers"]
    assert not any("--signing-key-dir" in c["command"] for c in steps)
    holders = [
        c["name"]
        for c in steps
        if any(m["name"] == sr.TOKEN_VOLUME for m in c.get("volumeMounts") or [])
    ]
    assert holders == ["publish"]
    (token,) = [v for v in pod["volumes"] if v["name"] == sr.TOKEN_VOLUME]
    (source,) = token["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == sr.AUDIENCE
    publish = next(c for c in steps if c["name"] == "publish")
    assert "--sign-url" in publish["command"] and CONFIG.capture_url in publish["command"]
    env = {e["name"]: e.get("value") for e in publish["env"]}
    assert PUBLIC in env.values() and CONFIG.capture_ca in env.values()
    assert pod["automountServiceAccountToken"] is False


def test_without_the_operators_key_the_profiles_key_pair_signs_in_the_publish_step() -> None:
    job = build_tuning_job(replace(CHILD, config=replace(CONFIG, signing_key_dir="")))
    pod = job["spec"]["template"]["spec"]
    assert "tenant-key" in [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert all(v["name"] != sr.TOKEN_VOLUME for v in pod["volumes"])


def test_the_merge_job_of_a_sharded_profile_is_signed_by_the_operator_too() -> None:
    job, _ = job_and_pod(replace(CHILD, spec=SPEC.model_copy(deep=True)), merge=True)
    pod = job["spec"]["template"]["spec"]
    (merge,) = pod["containers"]
    assert "--sign-url" in merge["command"]
    assert [m["name"] for m in merge["volumeMounts"] if m["name"] == sr.TOKEN_VOLUME]


# --- what the operator signs ------------------------------------------------------------------


def test_a_manifest_of_the_jobs_own_profile_model_and_identity_is_signed_with_what_it_knows() -> (
    None
):
    job, pod = job_and_pod()
    data = manifest()
    got = judged(pod, job, profile(), data)
    assert got.cluster == "cluster-a" and got.job_uid == "uid-job-1"
    assert (got.namespace, got.profile, got.profile_uid, got.gpu_model) == (NS, NAME, PUID, MODEL)
    assert got.manifest_sha256 == hashlib.sha256(data).hexdigest()
    assert got.identity_sha256 == sr.identity_sha256(naming.identity_document(SPEC, MODEL))
    assert got.signed_at == "2026-12-07T08:00:00Z"


def _refused(pod: Any, job: Any, prof: Any, data: bytes) -> str:
    with pytest.raises(Denied) as e:
        judged(pod, job, prof, data)
    return str(e.value)


def test_a_pod_where_another_container_mounts_the_token_is_refused() -> None:
    job, pod = job_and_pod()
    tune = next(c for c in pod["spec"]["initContainers"] if c["name"] == "tune")
    tune["volumeMounts"].append({"name": sr.TOKEN_VOLUME, "mountPath": "/stolen"})
    assert "mounted by at most 1 of tunefleet's steps (got: tune, publish)" in _refused(
        pod, job, profile(), manifest()
    )


def test_a_pod_that_shares_its_processes_or_mounts_its_service_account_token_is_refused() -> None:
    job, pod = job_and_pod()
    pod["spec"]["shareProcessNamespace"] = True
    assert "shares its processes" in _refused(pod, job, profile(), manifest())
    job, pod = job_and_pod()
    del pod["spec"]["automountServiceAccountToken"]
    assert "mounts its ServiceAccount's token" in _refused(pod, job, profile(), manifest())


def test_a_second_volume_with_a_signing_token_for_the_users_container_is_refused() -> None:
    """spec.template may add volumes and mount them in the tune step: one more projected token
    of the signing audience would hand user code a token the operator accepts."""
    job, pod = job_and_pod()
    (ours,) = [v for v in pod["spec"]["volumes"] if v["name"] == sr.TOKEN_VOLUME]
    pod["spec"]["volumes"].append({**ours, "name": "mine"})
    tune = next(c for c in pod["spec"]["initContainers"] if c["name"] == "tune")
    tune["volumeMounts"].append({"name": "mine", "mountPath": "/mine"})
    assert "volume mine holds a signing token too" in _refused(pod, job, profile(), manifest())


def test_a_publish_step_in_another_image_is_refused() -> None:
    job, pod = job_and_pod()
    publish = pod["spec"]["containers"][0]
    publish["image"] = "attacker/tunefleet:latest"
    assert "not tunefleet's image" in _refused(pod, job, profile(), manifest())


def test_a_job_made_by_someone_else_with_our_labels_is_not_ours() -> None:
    job, pod = job_and_pod()
    job["metadata"]["ownerReferences"] = []
    assert "is not owned by TuningProfile llama" in _refused(pod, job, profile(), manifest())
    job, pod = job_and_pod()
    job["metadata"]["name"] = pod["metadata"]["ownerReferences"][0]["name"] = "tune-forged"
    assert "not named as the operator names its own" in _refused(pod, job, profile(), manifest())


def test_a_deleted_pod_or_job_gets_nothing() -> None:
    job, pod = job_and_pod()
    with pytest.raises(Denied, match="no longer exists"):
        gone = replace(caller_of(pod), pod_uid="uid-pod-gone")
        judge(Seen(gone, pod, job, profile()), manifest(), IMAGE, "c", NOW)
    assert "no longer exists" in _refused(pod, None, profile(), manifest())
    other = {**profile(), "metadata": {**profile()["metadata"], "uid": "uid-profile-2"}}
    assert "names no TuningProfile that exists" in _refused(pod, job, other, manifest())


def test_a_manifest_of_another_profile_model_or_revision_is_refused() -> None:
    job, pod = job_and_pod()
    assert "the manifest is of ml/other" in _refused(pod, job, profile(), manifest(profile="other"))
    assert "NVIDIA-H200" in _refused(pod, job, profile(), manifest(gpu_model="NVIDIA-H200"))


def test_a_manifest_claiming_another_identity_is_refused_naming_the_field() -> None:
    job, pod = job_and_pod()
    ours = naming.identity_document(SPEC, MODEL)
    assert ours is not None
    forged = {**ours, "tuning": {**ours.get("tuning", {}), "numericalCheck": True}}
    said = _refused(pod, job, profile(), manifest(fleet_identity=forged))
    assert "identity differs at tuning.numericalCheck: true in it" in said


def test_a_profile_changed_since_the_job_was_made_gets_no_signature_for_the_old_output() -> None:
    job, pod = job_and_pod()
    changed = SPEC.model_copy(update={"image": f"registry.example.com/serve@sha256:{'ef' * 32}"})
    said = _refused(pod, job, profile(changed), manifest())
    assert "changed since Job" in said


# --- the endpoint and the publish step's client ---------------------------------------------


def _deps(pod: dict[str, Any], job: dict[str, Any], prof: dict[str, Any]) -> Deps:
    return api_server_deps(pod, job, prof, sr.AUDIENCE)


async def _post(endpoint: Endpoint, body: bytes, token: str) -> tuple[int, sr.Reply]:
    app = web.Application(client_max_size=sr.MAX_BODY_BYTES)
    app.add_routes(endpoint.routes())
    async with TestClient(TestServer(app)) as client:
        resp = await client.post(sr.PATH, data=body, headers={"Authorization": f"Bearer {token}"})
        return resp.status, sr.Reply.decode(await resp.read())


def test_the_endpoint_signs_what_the_profiles_public_key_verifies_and_refuses_a_bad_token() -> None:
    job, pod = job_and_pod()
    endpoint = Endpoint(
        _deps(pod, job, profile()), Signer(KEY, IMAGE, "cluster-a"), now=lambda: NOW
    )
    data = manifest()
    status, reply = asyncio.run(_post(endpoint, sr.Request(data).encode(), "good"))
    assert status == 200, reply.message
    assert signing.verify_blob(data, reply.signature, KEY.public_key()).ok
    signed, sig = sr.open_envelope(reply.attestation)
    assert signing.verify_blob(signed, sig, KEY.public_key()).ok
    assert sr.payload_of(reply.attestation).job_uid == "uid-job-1"
    status, reply = asyncio.run(_post(endpoint, sr.Request(data).encode(), "bad"))
    assert status == 401 and "bad token" in reply.message


class _Operator:
    """The signing endpoint's answers from a thread, for the publish step's client."""

    def __init__(self, answer: Any) -> None:
        self.answer, self.seen = answer, []

        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.seen.append((self.path, self.headers["Authorization"], body))
                status, reply = outer.answer(body)
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def _signed_reply(key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
    att = sr.Attestation("c", NS, NAME, PUID, MODEL, "j", "ju", "r",
                         hashlib.sha256(data).hexdigest(), "", "2026-12-07T08:00:00Z")  # fmt: skip
    payload = att.to_json()
    env = sr.envelope(payload, signing.sign_blob(sr.pae(sr.ATTESTATION_TYPE, payload), key))
    return sr.Reply(signing.sign_blob(data, key), env).encode()


def test_the_publish_step_checks_the_operators_answer_with_the_profiles_public_key(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text("good\n")
    data = manifest()
    op = _Operator(lambda body: (200, _signed_reply(KEY, sr.Request.decode(body).manifest)))
    try:
        got = RemoteSigner(op.url, token, public_key=PUBLIC, timeout_s=5).sign(data)
        assert signing.verify_blob(data, got.signature, KEY.public_key()).ok
        assert op.seen[0][0] == sr.PATH and op.seen[0][1] == "Bearer good"
        other = ec.generate_private_key(ec.SECP256R1())
        op.answer = lambda body: (200, _signed_reply(other, sr.Request.decode(body).manifest))
        with pytest.raises(RemoteSignError, match="another key pair than the profile names"):
            RemoteSigner(op.url, token, public_key=PUBLIC, timeout_s=5).sign(data)
        op.answer = lambda body: (403, sr.Reply(message="not ours").encode())
        with pytest.raises(RemoteSignError, match="refused to sign: 403 not ours"):
            RemoteSigner(op.url, token, public_key=PUBLIC, timeout_s=5).sign(data)
    finally:
        op.server.shutdown()


def test_publish_stores_the_operators_signature_and_attestation_that_fetch_then_verifies(
    tmp_path: Path,
) -> None:
    """publish's sign step with the operator signing: manifest.json.sig is what every reader
    verifies (fetch's own check, with the profile's public key), and manifest.json.att the
    operator's attestation of that very manifest."""
    from tests.support.artifacts import tuner_output
    from tunefleet.artifacts.fetch import Pinned, Signature, download_verified
    from tunefleet.artifacts.publish import sign_manifest, upload_artifact
    from tunefleet.storage.filesystem import DirStore
    from tunefleet.storage.registry import parse_uri
    from tuner_job.output import MANIFEST_NAME

    location = parse_uri("s3://bkt/p")
    store = DirStore(location, tmp_path / "bkt")
    m = tuner_output(tmp_path / "out", gpu_model="AMD_Instinct_MI300X_OAM")
    pub = upload_artifact(store, location, (tmp_path / "out" / "results.csv").read_bytes(), m)
    token = tmp_path / "token"
    token.write_text("good")
    op = _Operator(lambda body: (200, _signed_reply(KEY, sr.Request.decode(body).manifest)))
    try:
        remote = RemoteSigner(op.url, token, public_key=PUBLIC, timeout_s=5)
        signed = sign_manifest(store, location, pub, None, remote)
        # The same results published again keep that manifest, signed already: not asked.
        op.answer = lambda body: (403, sr.Reply(message="another revision").encode())
        assert sign_manifest(store, location, pub, None, remote).signed
        assert len(op.seen) == 1
    finally:
        op.server.shutdown()
    assert signed.signed
    base = location.key(m.namespace, m.profile, m.gpu_model, pub.sha256)
    stored = store.get(f"{base}/{MANIFEST_NAME}", 1 << 20)
    envelope = json.loads(store.get(f"{base}/{MANIFEST_NAME}{sr.ATTESTATION_SUFFIX}", 1 << 16))
    assert sr.payload_of(envelope).manifest_sha256 == hashlib.sha256(stored).hexdigest()
    from tunefleet.artifacts import fit

    pinned = Pinned(pub.uri, pub.sha256, pub.manifest_sha256, m.gpu_model,
                    fit.Target(m.gpu_model, "amd", False))  # fmt: skip
    got = download_verified(
        pinned, store=store, signature=Signature(key_pem=PUBLIC.encode(), required=True)
    )
    assert got is not None


def test_a_profile_the_operator_signs_for_needs_no_signing_secret_and_may_shard() -> None:
    doc = SPEC.model_dump(by_alias=True, exclude_none=True)
    doc["storage"]["signing"].pop("secret")
    keyless = TuningProfileSpec.model_validate(doc)
    sharded = TuningProfileSpec.model_validate({**doc, "gpu": {**doc["gpu"], "parallelism": 2}})
    assert naming.spec_problems(keyless, operator_signs=True) == []
    assert naming.spec_problems(sharded, operator_signs=True) == []
    # Without the operator's key, the publish step would have nothing to sign with.
    (problem,) = naming.spec_problems(keyless)
    assert problem.startswith("storage.signing.secret:") and "signing.secret" in problem
    assert parse_spec(doc, CONFIG)[1] == []
    assert parse_spec(doc, replace(CONFIG, signing_key_dir=""))[1] == [problem]


# --- oci:// artifacts: the operator signs the images it has read ------------------------------

OCI_SPEC = (
    make_profile(NAME)
    .image(f"registry.example.com/serve@{DIGEST}")
    .gpu("nvidia", MODEL)
    .command("python3", "serve.py")
    .storage("oci://registry.example.com/ml/tunefleet", signing={"publicKey": PUBLIC})
    .spec_model()
)
OCI_CHILD = Child(OCI_SPEC, NS, NAME, PUID, MODEL, replace(CONFIG, oci_config="/etc/oci"))
OCI_ALONE = Child(OCI_SPEC, NS, NAME, PUID, MODEL, CONFIG)
IMAGES = ("sha256:" + "11" * 32, "sha256:" + "22" * 32)


def _oci_endpoint(data: bytes, seen: list[str]) -> Endpoint:
    job, pod = job_and_pod(OCI_CHILD)

    async def check_oci(uri: str, digest: str, manifest_bytes: bytes) -> str:
        seen.append(f"{uri}@{digest}")
        ours = digest in IMAGES and manifest_bytes == data
        return "" if ours else f"{digest} is a bundle of another manifest"

    deps = replace(_deps(pod, job, profile(OCI_SPEC)), check_oci=check_oci)
    return Endpoint(deps, Signer(KEY, IMAGE, "cluster-a"), now=lambda: NOW)


def test_the_operator_signs_an_oci_artifacts_images_once_it_has_read_them_as_its_own() -> None:
    """An oci:// tuning pod holds no key either (the operator holds a registry read identity):
    publish asks for its bundle's and volume image's signatures; the operator reads each
    image as the artifact of the very manifest it vouches for, then signs both of cosign's
    formats, which verify with the profile's key. An image of another manifest is refused."""
    data = manifest(
        revision=naming.revision(OCI_SPEC),
        fleet_identity=naming.identity_document(OCI_SPEC, MODEL),
    )
    seen: list[str] = []
    endpoint = _oci_endpoint(data, seen)
    status, reply = asyncio.run(_post(endpoint, sr.Request(data, IMAGES).encode(), "good"))
    assert status == 200, reply.message
    assert seen == [f"oci://registry.example.com/ml/tunefleet@{d}" for d in IMAGES]
    assert [o.digest for o in reply.oci] == list(IMAGES)
    for o in reply.oci:
        body = signing.payload("registry.example.com/ml/tunefleet", o.digest)
        KEY.public_key().verify(o.legacy, body, ec.ECDSA(hashes.SHA256()))
        assert sigbundle.check_bundle(o.bundle, o.digest, KEY.public_key()) == ""
    other = ("sha256:" + "33" * 32,)
    status, reply = asyncio.run(_post(endpoint, sr.Request(data, other).encode(), "good"))
    assert status == 403 and "not this artifact's image" in reply.message, reply.message
    # An s3:// profile's Job asks for images: there are none to sign.
    job, pod = job_and_pod()
    plain = Endpoint(_deps(pod, job, profile()), Signer(KEY, IMAGE, "cluster-a"), now=lambda: NOW)
    status, reply = asyncio.run(_post(plain, sr.Request(manifest(), IMAGES).encode(), "good"))
    assert status == 409


def test_an_oci_tuning_pod_mounts_no_key_where_the_operator_can_read_the_registry() -> None:
    job, _ = job_and_pod(OCI_CHILD)
    assert "signing" not in json.dumps(job["spec"]["template"]["spec"]["volumes"])
    assert "--sign-url" in json.dumps(job)
    # Without a registry read identity the operator cannot check what it signs: as before.
    assert "--sign-url" not in json.dumps(build_tuning_job(OCI_ALONE))
