"""The registry proxy (signer/registry_route.py, signer/registry_rules.py): oci:// tuning pods
push and read through the operator and hold no registry credential. The rules, the built
pod, and round trips of the real pod-side registry client through the real route to the
test bed's real registry (Distribution, with its TLS and htpasswd)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from testbed.builders.signing import api_server_deps, credential_refs, profile_object
from testbed.builders.signing import job_and_pod as built_job_and_pod
from testbed.builders.signing import tuning_job as built_tuning_job
from testbed.builders.wrappers import make_profile
from testbed.registry import Registry
from tests.support.routes import RouteThread
from tunefleet import naming
from tunefleet.artifacts.brokered import Broker
from tunefleet.artifacts.ocibundle import ARTIFACT_TYPE, VOLUME_ARTIFACT_TYPE
from tunefleet.config import Config
from tunefleet.contracts import store_broker as sb
from tunefleet.runtime.pod_tokens import Denied
from tunefleet.signer import registry_rules as rules
from tunefleet.signer.registry_route import Identity, RegistryProxy, _relative
from tunefleet.signer.store_rules import Scope
from tunefleet.storage import oci
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import StoreError

IMAGE = "ghcr.io/tunefleet/tunefleet:test"
MODEL = "NVIDIA-H100"
NS, NAME, PUID = "ml", "llama", "uid-profile-1"
SHA, OTHER_SHA = "ab" * 32, "cd" * 32
HOST, REPO = "registry.example.com:5000", "team/tf"
PUBLIC = (
    ec.generate_private_key(ec.SECP256R1())
    .public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode()
)


def config(*hosts: str) -> Config:
    return Config(
        image=IMAGE,
        signing_key_dir="/etc/tunefleet/signing",
        oci_config="/etc/tunefleet/oci",
        registry_broker_config="/etc/tunefleet/registry-broker",
        registry_broker_hosts=hosts,
        capture_url="https://tunefleet-webhook.tunefleet-system.svc:8443",
        capture_ca="-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )


def spec(uri: str = f"oci://{HOST}/{REPO}") -> Any:
    return (
        make_profile(NAME)
        .image("registry.example.com/serve:1")
        .gpu("nvidia", MODEL)
        .command("python3", "serve.py")
        .storage(uri, credentialsSecret={"name": "regcred"}, signing={"publicKey": PUBLIC})
        .spec_model()
    )


OWN = f"{NS}/{NAME}/{MODEL}"
SCOPE = Scope(own=OWN, library=f"{NS}/_library/{MODEL}", revision="r1")


def _object(key: str) -> bytes:
    """An object's manifest as OciStore writes it: one layer, the key annotated."""
    doc = {
        "schemaVersion": 2,
        "mediaType": oci.MANIFEST_MEDIA_TYPE,
        "artifactType": oci.OBJECT_ARTIFACT_TYPE,
        "layers": [{"mediaType": "text/csv", "digest": "sha256:" + "0" * 64, "size": 3}],
        "annotations": {oci.KEY_ANNOTATION: key},
    }
    return oci.manifest_body(doc)


def _bundle(*keys: str) -> bytes:
    layers = [
        {"mediaType": "x", "digest": "sha256:" + "1" * 64, "size": 1,
         "annotations": {oci.KEY_ANNOTATION: k}}
        for k in keys
    ]  # fmt: skip
    return oci.manifest_body({"schemaVersion": 2, "artifactType": ARTIFACT_TYPE, "layers": layers})


def _volume(title: str) -> bytes:
    doc = {
        "schemaVersion": 2,
        "artifactType": VOLUME_ARTIFACT_TYPE,
        "layers": [],
        "annotations": {oci.TITLE_ANNOTATION: title},
    }
    return oci.manifest_body(doc)


# --- the rules --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "tail", "query", "kind"),
    [
        ("GET", f"{REPO}/manifests/k-abc", {}, "manifest"),
        ("HEAD", f"{REPO}/blobs/sha256:{SHA}", {}, "blob"),
        ("POST", f"{REPO}/blobs/uploads/", {}, "upload"),
        ("POST", f"{REPO}/blobs/uploads/", {"digest": f"sha256:{SHA}"}, "upload"),
        ("PUT", f"{REPO}/blobs/uploads/1f2e-3d", {"_state": "x", "digest": "y"}, "upload"),
        ("GET", f"{REPO}/tags/list", {"n": "1000"}, "tags"),
        ("GET", f"{REPO}/referrers/sha256:{SHA}", {}, "referrers"),
        ("PUT", f"{REPO}/manifests/sha256:{SHA}", {}, "manifest"),
    ],
)
def test_a_pod_may_read_its_repository_and_upload(
    method: str, tail: str, query: dict[str, str], kind: str
) -> None:
    assert rules.step(method, tail, query, REPO).kind == kind


@pytest.mark.parametrize(
    ("method", "tail", "query", "said"),
    [
        ("GET", "team/other/manifests/k-abc", {}, "its profile's repository team/tf only"),
        ("GET", "team/tf2/manifests/k-abc", {}, "its profile's repository"),
        ("DELETE", f"{REPO}/manifests/sha256:{SHA}", {}, "deletes nothing"),
        ("DELETE", f"{REPO}/blobs/sha256:{SHA}", {}, "deletes nothing"),
        ("POST", f"{REPO}/blobs/uploads/", {"mount": f"sha256:{SHA}", "from": "x"}, "mounted"),
        ("GET", "_catalog", {}, "its profile's repository"),
        ("PUT", f"{REPO}/manifests/../../x", {}, "not a request a tuning pod makes"),
    ],
)
def test_a_pod_may_not_delete_mount_or_leave_its_repository(
    method: str, tail: str, query: dict[str, str], said: str
) -> None:
    with pytest.raises(Denied) as e:
        rules.step(method, tail, query, REPO)
    assert e.value.status == 403 and said in str(e.value)


@pytest.mark.parametrize(
    ("reference", "body", "write"),
    [
        (oci.tag_of(f"{OWN}/{SHA}/results.csv"), _object(f"{OWN}/{SHA}/results.csv"), rules.Write(create=True)),
        (oci.tag_of(f"{NS}/_library/{MODEL}/k/{SHA}.json"), _object(f"{NS}/_library/{MODEL}/k/{SHA}.json"), rules.Write(create=True)),
        (oci.tag_of(f"{OWN}/_checkpoints/r1/0.json"), _object(f"{OWN}/_checkpoints/r1/0.json"), rules.Write()),
        (oci.bundle_tag(f"{OWN}/{SHA}"), _bundle(f"{OWN}/{SHA}/manifest.json", f"{OWN}/{SHA}/results.csv"), rules.Write(create=True)),
        (oci.volume_tag(f"{OWN}/{SHA}"), _volume(SHA), rules.Write(create=True)),
        (f"sha256-{SHA}.sig", b"{}", rules.Write(subject=f"sha256:{SHA}")),
        (f"sha256-{SHA}", b"{}", rules.Write(subject=f"sha256:{SHA}")),
        (oci.digest_of(b'{"subject":{"digest":"sha256:' + SHA.encode() + b'"}}'),
         b'{"subject":{"digest":"sha256:' + SHA.encode() + b'"}}', rules.Write(subject=f"sha256:{SHA}")),
        (oci.digest_of(_volume(SHA)), _volume(SHA), rules.Write()),
    ],
)  # fmt: skip
def test_a_pod_pushes_its_own_artifacts_tags(
    reference: str, body: bytes, write: rules.Write
) -> None:
    assert rules.manifest_write(reference, body, SCOPE) == write


@pytest.mark.parametrize(
    ("reference", "body", "said"),
    [
        # Another profile's object, or an artifact's object replaced under its tag's name.
        (oci.tag_of(f"{NS}/other/{MODEL}/{SHA}/results.csv"), _object(f"{NS}/other/{MODEL}/{SHA}/results.csv"), "may not create"),
        (oci.tag_of(f"{OWN}/{SHA}/a"), _object(f"{OWN}/{SHA}/b"), "not the tag of the key"),
        (oci.tag_of(f"{OWN}/_checkpoints/r0/0.json"), _object(f"{OWN}/_checkpoints/r0/0.json"), "may not create"),
        # A bundle of two artifacts, of another profile's, or under another base's tag.
        (oci.bundle_tag(f"{OWN}/{SHA}"), _bundle(f"{OWN}/{SHA}/a", f"{OWN}/{OTHER_SHA}/b"), "may not push the tag"),
        (oci.bundle_tag(f"{NS}/other/{MODEL}/{SHA}"), _bundle(f"{NS}/other/{MODEL}/{SHA}/a"), "may not push"),
        (oci.bundle_tag(f"{OWN}/{OTHER_SHA}"), _bundle(f"{OWN}/{SHA}/a"), "may not push"),
        (oci.volume_tag(f"{OWN}/{SHA}"), _volume("../x"), "may not push"),
        (oci.volume_tag(f"{OWN}/{SHA}"), _volume(OTHER_SHA), "may not push"),
        # Any other tag (a fleet note, latest), and a digest that is not the body's.
        (oci.note_tag("g", "m"), _object(f"{OWN}/{SHA}/x"), "may not push the tag"),
        ("latest", _bundle(f"{OWN}/{SHA}/a"), "may not push the tag"),
        (f"sha256:{SHA}", b"{}", "is not sha256:"),
        (oci.tag_of(f"{OWN}/{SHA}/a"), b"[1]", "not a JSON object"),
    ],
)  # fmt: skip
def test_a_pod_may_not_push_what_is_not_its_own(reference: str, body: bytes, said: str) -> None:
    with pytest.raises(Denied) as e:
        rules.manifest_write(reference, body, SCOPE)
    assert said in str(e.value)


def test_an_image_is_the_jobs_own_only_at_its_own_bundle_or_volume_tag() -> None:
    bundle = json.loads(_bundle(f"{OWN}/{SHA}/manifest.json"))
    assert rules.own_image_tags(bundle, SCOPE) == (oci.bundle_tag(f"{OWN}/{SHA}"),)
    assert rules.own_image_tags(json.loads(_volume(SHA)), SCOPE) == (
        oci.volume_tag(f"{OWN}/{SHA}"),
    )
    other = json.loads(_bundle(f"{NS}/other/{MODEL}/{SHA}/manifest.json"))
    assert rules.own_image_tags(other, SCOPE) == ()


# --- the tuning pod ---------------------------------------------------------------------------


def test_an_oci_tuning_pod_through_the_proxy_holds_no_registry_credential() -> None:
    job = built_tuning_job(spec(), NS, NAME, PUID, MODEL, config(HOST))
    pod = job["spec"]["template"]["spec"]
    assert sorted(credential_refs(pod)) == [
        "volume tunefleet-sign-token: token tunefleet.io/sign",
        f"volume {sb.TOKEN_VOLUME}: token {sb.AUDIENCE}",
    ]
    sync = next(c for c in pod["initContainers"] if c["name"] == "sync")
    assert "--broker-url" in sync["command"] and "--oci-config" not in sync["command"]
    # A registry the operator holds no push identity for: the profile's Secret, as before.
    elsewhere = built_tuning_job(spec(), NS, NAME, PUID, MODEL, config("other.example.com"))
    assert "--broker-url" not in json.dumps(elsewhere)
    refs = credential_refs(elsewhere["spec"]["template"]["spec"])
    assert "volume tunefleet-oci: a Secret" in refs


def test_the_push_identity_is_read_per_host_from_a_docker_config(tmp_path: Path) -> None:
    import base64

    auth = base64.b64encode(b"u:p").decode()
    doc = {
        "auths": {
            "reg.example.com:5000": {"auth": auth},
            "https://ghcr.io/v1/": {"username": "u", "password": "p"},
            "bad": "not an entry",
        }
    }
    (tmp_path / ".dockerconfigjson").write_text(json.dumps(doc))
    assert oci.auth_headers(tmp_path) == {
        "reg.example.com:5000": f"Basic {auth}",
        "ghcr.io": f"Basic {auth}",
    }
    assert Identity.load(str(tmp_path)).ca is True
    with pytest.raises(ValueError, match=r"holds no \.dockerconfigjson"):
        oci.auth_headers(tmp_path / "nothing")


# --- round trips through the real route, against the real registry ------------------------------


@dataclass
class Proxied:
    store: oci.OciStore  # the pod's: through the proxy, no credential
    direct: oci.OciStore  # the test bed's writer, straight to the registry
    location: Any
    own: str


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[Proxied]:
    try:
        reg = Registry.from_state()
    except (OSError, KeyError):
        pytest.fail("the test bed's registry is not up (make cluster-up)", pytrace=False)
    repo = f"proxy/{os.urandom(4).hex()}"
    uri = f"oci://{reg.host}/{repo}"
    s = spec(uri)
    job, pod = built_job_and_pod(built_tuning_job(s, NS, NAME, PUID, MODEL, config(reg.host)))
    deps = api_server_deps(pod, job, profile_object(s, NS, NAME, PUID), sb.AUDIENCE)
    identity = Identity(oci.auth_headers(reg.writer), str(reg.ca))
    operator = RouteThread(RegistryProxy(deps, identity, IMAGE, "namespace").routes())
    token = tmp_path / "token"
    token.write_text("good")
    location = parse_uri(uri)
    store = Broker(operator.url, str(token)).open(location, 120)
    direct = oci.OciStore(location, timeout_s=60, config=_writer_with_ca(reg, tmp_path))
    try:
        yield Proxied(store, direct, location, location.key(NS, NAME, MODEL))
    finally:
        operator.stop()


def _writer_with_ca(reg: Registry, tmp_path: Path) -> Path:
    where = tmp_path / "writer"
    where.mkdir()
    (where / oci.DOCKER_CONFIG_KEY).write_bytes((reg.writer / oci.DOCKER_CONFIG_KEY).read_bytes())
    (where / oci.CA_KEY).write_bytes(reg.ca.read_bytes())
    return where


def test_a_proxied_pod_adds_its_objects_once_and_streams_a_file_both_ways(
    proxied: Proxied, tmp_path: Path
) -> None:
    store, own = proxied.store, proxied.own
    assert store.put_if_absent(f"{own}/{SHA}/results.csv", b"rows\n", "text/csv") is True
    assert store.put_if_absent(f"{own}/{SHA}/results.csv", b"rows\n", "text/csv") is False
    assert store.get(f"{own}/{SHA}/results.csv", 100) == b"rows\n"
    # The registry holds it as the writer sees it: the proxy stored what the pod sent.
    assert proxied.direct.get(f"{own}/{SHA}/results.csv", 100) == b"rows\n"
    checkpoint = f"{own}/_checkpoints/{naming.revision(spec(proxied.location.uri()))}/0.json"
    store.put(checkpoint, b"{}", "application/json")
    store.put(checkpoint, b"{ }", "application/json")
    assert store.get(checkpoint, 10) == b"{ }"
    big = tmp_path / "big"
    big.write_bytes(os.urandom(24 << 20))
    key = f"{own}/{SHA}/caches/{SHA}.tar.zst"
    assert store.put_file_if_absent(key, big, "application/zstd") is True
    with open(tmp_path / "back", "wb") as f:
        got = store.get_file(key, f, 32 << 20)
    assert got.sha256 == hashlib.sha256(big.read_bytes()).hexdigest()
    assert [o.key for o in store.list(f"{own}/{SHA}/caches", 10)] == [key]


def test_a_proxied_pod_may_not_write_another_profiles_key_replace_an_object_or_delete(
    proxied: Proxied,
) -> None:
    store, own = proxied.store, proxied.own
    other = proxied.location.key(NS, "other", MODEL, SHA, "results.csv")
    with pytest.raises(StoreError, match=r"DENIED.*may not create"):
        store.put_if_absent(other, b"x", "text/csv")
    # An object the writer stored first is never replaced through the proxy.
    proxied.direct.put_if_absent(f"{own}/{SHA}/manifest.json", b"{}", "application/json")
    with pytest.raises(StoreError, match="holds another manifest"):
        store._write(f"{own}/{SHA}/manifest.json", b"[]", "application/json")
    assert proxied.direct.get(f"{own}/{SHA}/manifest.json", 10) == b"{}"
    digest = proxied.direct.object_digest(f"{own}/{SHA}/manifest.json")
    with pytest.raises(StoreError, match="deletes nothing"):
        store.delete_manifest(digest)


def test_a_proxied_pod_signs_only_its_own_images(proxied: Proxied) -> None:
    """A signature tag (cosign's legacy `.sig`) or a referrer is pushed only on an image at
    the Job's own bundle tag; one on an image of another profile is refused."""
    from tunefleet.artifacts import signing

    store, direct, own = proxied.store, proxied.direct, proxied.own
    key = ec.generate_private_key(ec.SECP256R1())
    store.put_if_absent(f"{own}/{SHA}/manifest.json", b"{}", "application/json")
    mine = store.push_bundle(
        [oci.Part(f"{own}/{SHA}/manifest.json", "application/json", {})], {}, ARTIFACT_TYPE,
        oci.bundle_tag(f"{own}/{SHA}"),
    )  # fmt: skip
    signing.sign(store, mine, key)
    assert direct.manifest(signing.signature_tag(mine)) is not None
    theirs_base = proxied.location.key(NS, "other", MODEL, SHA)
    direct.put_if_absent(f"{theirs_base}/manifest.json", b"{}", "application/json")
    theirs = direct.push_bundle(
        [oci.Part(f"{theirs_base}/manifest.json", "application/json", {})], {}, ARTIFACT_TYPE,
        oci.bundle_tag(theirs_base),
    )  # fmt: skip
    with pytest.raises(StoreError, match="not an image of this Job's own artifacts"):
        signing.sign(store, theirs, key)
    assert direct.manifest(signing.signature_tag(theirs)) is None


def _answer(status: int, **headers: str) -> requests.Response:
    resp = requests.Response()
    resp.status_code = status
    resp.headers.update(headers)
    return resp


def test_a_throttled_request_is_tried_again_after_its_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = oci._Registry("broker.example:8443", True, time.monotonic() + 30)
    answers = [_answer(429, **{"Retry-After": "0"}), _answer(200)]
    monkeypatch.setattr(client.session, "request", lambda *a, **k: answers.pop(0))
    assert client.do_request("https://broker.example:8443/v2/x/tags/list").status_code == 200
    assert answers == []


def test_the_pods_token_goes_to_the_broker_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("tok\n")
    via = oci.Via("https://broker.example:8443", "", Broker("", str(token)).token)
    client = oci._Registry(via.host, True, time.monotonic() + 30, via)
    sent: list[dict[str, str]] = []
    monkeypatch.setattr(
        client.session, "request", lambda *a, **k: (sent.append(k["headers"]), _answer(200))[1]
    )
    client.do_request("https://broker.example:8443/v2/x/blobs/uploads/", "POST")
    client.do_request("https://blobs.elsewhere.example/upload/1", "PUT")
    assert sent[0]["Authorization"] == "Bearer tok" and "Authorization" not in sent[1]


def test_the_registrys_own_addresses_come_back_as_the_proxys_paths() -> None:
    host = "10.0.0.1:5000"
    assert _relative(f"https://{host}/v2/r/blobs/uploads/u?_state=s", host) == (
        "/v2/r/blobs/uploads/u?_state=s"
    )
    assert _relative(f'<https://{host}/v2/r/tags/list?n=2&last=b>; rel="next"', host) == (
        '</v2/r/tags/list?n=2&last=b>; rel="next"'
    )
    assert _relative("https://storage.example/blob?sig=x", host) == (
        "https://storage.example/blob?sig=x"
    )


def _ask(proxy: RegistryProxy, path: str, token: str = "good") -> tuple[int, str]:
    """`GET path` of the proxy's route, as a pod with `token`: the status and the message."""

    async def go() -> tuple[int, str]:
        app = web.Application()
        app.add_routes(proxy.routes())
        async with TestClient(TestServer(app)) as client:
            resp = await client.get(path, headers={"Authorization": f"Bearer {token}"})
            body = await resp.json()
            return resp.status, str(body["errors"][0]["message"])

    return asyncio.run(go())


def test_the_proxy_refuses_a_stranger_a_bad_token_and_a_registry_it_holds_no_identity_for() -> None:
    job, pod = built_job_and_pod(built_tuning_job(spec(), NS, NAME, PUID, MODEL, config(HOST)))
    prof = profile_object(spec(), NS, NAME, PUID)
    tags = f"/v2/{REPO}/tags/list"
    stranger = json.loads(json.dumps(pod))
    stranger["metadata"]["ownerReferences"] = []
    deps = api_server_deps(stranger, job, prof, sb.AUDIENCE)
    status, said = _ask(RegistryProxy(deps, Identity({HOST: "Basic x"}), IMAGE, "namespace"), tags)
    assert status == 403 and "not controlled by a Job" in said, said
    deps = api_server_deps(pod, job, prof, sb.AUDIENCE)
    proxy = RegistryProxy(deps, Identity({HOST: "Basic x"}), IMAGE, "namespace")
    status, said = _ask(proxy, tags, token="stolen")
    assert status == 401, said
    other = RegistryProxy(deps, Identity({"other.example:5000": "Basic x"}), IMAGE, "namespace")
    status, said = _ask(other, tags)
    assert status == 409 and f"pushes to other.example:5000, and the profile names {HOST}" in said
    status, said = _ask(proxy, "/v2/team/other/tags/list")
    assert status == 403 and "repository team/tf only" in said


def test_a_look_the_registry_fails_is_never_taken_for_an_empty_tag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A create is forwarded only where the tag holds nothing: a HEAD that errs (a 500, a 401)
    must refuse it (503, to retry), never let it replace what is there."""
    job, pod = built_job_and_pod(built_tuning_job(spec(), NS, NAME, PUID, MODEL, config(HOST)))
    deps = api_server_deps(pod, job, profile_object(spec(), NS, NAME, PUID), sb.AUDIENCE)
    proxy = RegistryProxy(deps, Identity({HOST: "Basic x"}), IMAGE, "namespace")
    answers = {
        "k-absent": _answer(404),
        "k-there": _answer(200, **{"Docker-Content-Digest": f"sha256:{SHA}"}),
        "k-broken": _answer(500),
        "k-refused": _answer(401),
    }
    monkeypatch.setattr(
        proxy, "_upstream", lambda m, h, path, hd, **kw: answers[path.rsplit("/", 1)[1]]
    )
    assert proxy._head(HOST, REPO, "k-absent") == ""
    assert proxy._head(HOST, REPO, "k-there") == f"sha256:{SHA}"
    for tag in ("k-broken", "k-refused"):
        with pytest.raises(Denied) as e:
            proxy._head(HOST, REPO, tag)
        assert e.value.status == 503 and f"a look at {tag}" in str(e.value)
