"""oci:// stores without a registry: URIs, the spec's rules, cosign-format signatures (against
a key pair cosign itself made, tests/unit/data/cosign), what fetch serves under each signing
policy, and what the builders give the tuning Job and model pods. The registry and cosign
themselves are the e2e test's (tests/e2e/test_oci.py)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import re
import socket
import tarfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from testbed.builders.wrappers import make_artifact, make_model_pod, make_profile
from tests.support.artifacts import tuner_output
from tunefleet import naming
from tunefleet.api.models import STORAGE_URI
from tunefleet.artifacts import ocibundle, signing
from tunefleet.artifacts import publish as publish_mod
from tunefleet.artifacts.fetch import (
    FetchError,
    Pinned,
    Serving,
    Signature,
    from_volume,
    serving_store,
)
from tunefleet.artifacts.publish import Output
from tunefleet.artifacts.volumes import VolumeVerdict
from tunefleet.builders.job import Child, build_tuning_job
from tunefleet.builders.storage import pod_storage
from tunefleet.builders.webhook import volume_links
from tunefleet.config import Config
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.contracts.fetch_outcome import Candidate
from tunefleet.plugin.why_cmd import explain
from tunefleet.serving import delivery
from tunefleet.storage import oci
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import (
    ConflictError,
    Location,
    NotFoundError,
    Received,
    StoreError,
    write_hashed,
)
from tunefleet.webhook.admission import admit
from tuner_job import caches as cc
from tuner_job.manifest import loads

DATA = Path(__file__).parent / "data" / "cosign"
PASSWORD = b"tunefleet-test"  # of data/cosign/cosign.key, made by `cosign generate-key-pair`
HOST = "registry.example.com:5000"


# --- URIs and the spec ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "bucket", "prefix"),
    [
        (f"oci://{HOST}/team/tunefleet", f"{HOST}/team/tunefleet", ""),
        ("oci://ghcr.io/org/caches#prod/eu", "ghcr.io/org/caches", "prod/eu"),
        ("oci://10.0.0.1:5000/a_b/c--d", "10.0.0.1:5000/a_b/c--d", ""),
    ],
)
def test_an_oci_uri_is_a_repository_and_an_optional_key_prefix(
    uri: str, bucket: str, prefix: str
) -> None:
    loc = parse_uri(uri)
    assert (loc.scheme, loc.bucket, loc.prefix) == ("oci", bucket, prefix)
    assert re.match(STORAGE_URI, uri)
    # An artifact's URI parses back to the same repository and its full key.
    key = loc.key("ml", "llm", "MI300X", "a" * 64)
    back = parse_uri(loc.uri(key))
    assert (back.bucket, back.prefix) == (bucket, key)


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("oci://ghcr.io/Org/Caches", "is not a valid OCI name"),
        ("oci://ghcr.io", "names no repository"),
        ("oci://ghcr.io/org/caches:latest", "not a tag or digest"),
        ("oci://ghcr.io/org/caches@sha256:" + "a" * 64, "not a tag or digest"),
        ("oci://ghcr.io/" + "a" * 250, "over the 255 registries accept"),
        ("oci://ghcr.io/org/caches#../x", "unsafe key segment"),
    ],
)
def test_a_bad_oci_uri_says_what_to_fix(uri: str, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_uri(uri)


OCI_SPEC = (
    make_profile()
    .image("registry.example.com/serve:1")
    .gpu("amd", "MI300X")
    .command("python3", "serve.py")
)
OCI = {"uri": f"oci://{HOST}/team/tf", "credentialsSecret": {"name": "registry"}}
SIGNED = {**OCI, "signing": {"secret": {"name": "signing"}}}


def test_an_oci_store_requires_signing_by_default_and_says_how_to_get_a_key() -> None:
    (problem,) = naming.spec_problems(OCI_SPEC.spec(storage=OCI).spec_model())
    assert "storage.signing.secret" in problem and "cosign generate-key-pair" in problem
    assert naming.spec_problems(OCI_SPEC.spec(storage=SIGNED).spec_model()) == []
    optional = {**OCI, "signing": {"policy": "Optional"}}
    assert naming.spec_problems(OCI_SPEC.spec(storage=optional).spec_model()) == []
    assert OCI_SPEC.spec(storage=optional).spec_model().storage.signing_policy == "Optional"
    assert OCI_SPEC.spec(storage=SIGNED).spec_model().storage.signing_policy == "Required"


def test_an_object_store_signs_only_when_asked_and_sharding_is_refused_with_oci() -> None:
    # s3:// manifests are signed too (test_signed_manifests.py), only where storage.signing
    # says so: a profile of an earlier release stays unsigned.
    s3 = {"uri": "s3://bucket/p", "signing": {"policy": "Optional"}}
    assert naming.spec_problems(OCI_SPEC.spec(storage=s3).spec_model()) == []
    assert OCI_SPEC.spec(storage=s3).spec_model().storage.signing_policy == "Optional"
    assert OCI_SPEC.storage("s3://bucket/p").spec_model().storage.signing_policy is None
    sharded = OCI_SPEC.spec(storage=SIGNED).gpu("amd", "MI300X", parallelism=2).spec_model()
    (problem,) = naming.spec_problems(sharded)
    assert "gpu.parallelism" in problem


# --- keys and signatures -------------------------------------------------------------------


def test_cosigns_own_encrypted_key_is_read_with_its_password() -> None:
    key = signing.load_private_key((DATA / "cosign.key").read_bytes(), PASSWORD)
    pub = signing.load_public_key((DATA / "cosign.pub").read_bytes())
    assert key.public_key().public_numbers() == pub.public_numbers()
    with pytest.raises(signing.SigningError, match="password is wrong"):
        signing.load_private_key((DATA / "cosign.key").read_bytes(), b"not-it")


def test_a_plain_pem_key_is_read_too_and_other_keys_are_refused() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    assert signing.load_private_key(pem, b"").public_key().public_numbers() == (
        key.public_key().public_numbers()
    )
    with pytest.raises(signing.SigningError, match="not PEM"):
        signing.load_private_key(b"cosign.key", b"")


class FakeRegistry(oci.OciStore):
    """The registry calls signing and fetch make, in memory (no HTTP)."""

    def __init__(self) -> None:
        self.location = Location("oci", f"{HOST}/team/tf", "", separator="#")
        self.blobs: dict[str, bytes] = {}
        self.tags: dict[str, str] = {}  # tag -> digest
        self.manifests: dict[str, bytes] = {}

    def push_blob(self, data: bytes) -> str:
        digest = oci.digest_of(data)
        self.blobs[digest] = data
        return digest

    def push_blob_file(self, path: Path) -> tuple[str, int]:
        data = path.read_bytes()
        return self.push_blob(data), len(data)

    def blob_to(self, digest: str, dest: Any, max_bytes: int, what: str) -> Received:
        return write_hashed([self.blob(digest, max_bytes, what)], dest, max_bytes, what)

    def blob(self, digest: str, max_bytes: int, what: str) -> bytes:
        if digest not in self.blobs:
            raise NotFoundError(f"{what}: no blob {digest}")
        data = self.blobs[digest]
        if oci.digest_of(data) != digest:
            raise StoreError(f"{what} does not match its digest {digest}: refused")
        return data

    def push_manifest(self, manifest: dict[str, Any], reference: str) -> str:
        body = json.dumps(manifest, sort_keys=True).encode()
        digest = oci.digest_of(body)
        self.manifests[digest] = body
        if reference:
            self.tags[reference] = digest
        return digest

    def manifest(
        self, reference: str, accept: str = oci.MANIFEST_MEDIA_TYPE
    ) -> tuple[dict[str, Any], str] | None:
        digest = reference if reference.startswith("sha256:") else self.tags.get(reference, "")
        if digest not in self.manifests:
            return None
        return json.loads(self.manifests[digest]), digest

    def descriptor(self, digest: str) -> dict[str, Any]:
        return {"mediaType": oci.MANIFEST_MEDIA_TYPE, "digest": digest, "size": 1}

    def _referrers_api(self, digest: str) -> list[Any] | None:
        return None  # as Distribution 3: bundles are found through the tag schema's index


def _bundle(reg: FakeRegistry) -> str:
    results = b"Validator,PT_VERSION,2.11.0\n"
    layer = {
        "mediaType": ocibundle.PAYLOAD_LAYERS["results.csv"],
        "digest": reg.push_blob(results),
        "size": len(results),
        "annotations": {oci.KEY_ANNOTATION: "ml/llm/M/abc/results.csv"},
    }
    return reg.push_manifest({"artifactType": ocibundle.ARTIFACT_TYPE, "layers": [layer]}, "b-x")


def _key() -> ec.EllipticCurvePrivateKey:
    return signing.load_private_key((DATA / "cosign.key").read_bytes(), PASSWORD)


def test_a_signature_verifies_with_its_key_only() -> None:
    reg = FakeRegistry()
    digest = _bundle(reg)
    assert signing.verify(reg, digest, _key().public_key()).reason.endswith(
        f"is not signed (no {signing.signature_tag(digest)} in the registry, "
        "and no Sigstore bundle among its referrers)"
    )
    signing.sign(reg, digest, _key())
    assert signing.verify(reg, digest, _key().public_key()).ok
    other = ec.generate_private_key(ec.SECP256R1())
    verdict = signing.verify(reg, digest, other.public_key())
    assert not verdict.ok and "signed by another key, or altered" in verdict.reason


def test_the_signed_payload_is_cosigns_simple_signing_of_the_digest() -> None:
    reg = FakeRegistry()
    digest = _bundle(reg)
    signing.sign(reg, digest, _key())
    doc, _ = reg.manifest(signing.signature_tag(digest)) or ({}, "")
    (layer,) = doc["layers"]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    body = reg.blobs[layer["digest"]]
    payload = json.loads(body)
    assert payload["critical"]["image"]["docker-manifest-digest"] == digest
    assert payload["critical"]["type"] == "cosign container image signature"
    sig = base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"])
    pub = signing.load_public_key((DATA / "cosign.pub").read_bytes())
    pub.verify(sig, body, ec.ECDSA(hashes.SHA256()))  # raises if it does not verify


def test_a_signature_of_another_image_moved_beside_this_one_is_refused() -> None:
    reg = FakeRegistry()
    digest = _bundle(reg)
    other = reg.push_manifest({"artifactType": ocibundle.ARTIFACT_TYPE, "layers": []}, "b-y")
    signing.sign(reg, other, _key())
    # Its signature manifest copied under this bundle's signature tag.
    reg.tags[signing.signature_tag(digest)] = reg.tags[signing.signature_tag(other)]
    verdict = signing.verify(reg, digest, _key().public_key())
    assert not verdict.ok and "a signature of another image" in verdict.reason


def test_signing_keeps_other_signers_and_replaces_none_of_theirs() -> None:
    reg = FakeRegistry()
    digest = _bundle(reg)
    theirs = ec.generate_private_key(ec.SECP256R1())
    signing.sign(reg, digest, theirs)
    signing.sign(reg, digest, _key())
    signing.sign(reg, digest, _key())  # again: still one of ours
    doc, _ = reg.manifest(signing.signature_tag(digest)) or ({}, "")
    assert len(doc["layers"]) == 2
    assert signing.verify(reg, digest, theirs.public_key()).ok
    assert signing.verify(reg, digest, _key().public_key()).ok


# --- what fetch serves ---------------------------------------------------------------------


def test_fetch_serves_a_bundle_only_once_its_signature_verifies(tmp_path: Path) -> None:
    reg = FakeRegistry()
    digest = _bundle(reg)
    pub = tmp_path / "cosign.pub"
    pub.write_bytes((DATA / "cosign.pub").read_bytes())
    with pytest.raises(FetchError, match=r"bundle not served: .* is not signed"):
        serving_store(reg, Signature(digest, pub, required=True))
    # Optional: served unsigned, by digest.
    view = serving_store(reg, Signature(digest, pub, required=False))
    assert isinstance(view, ocibundle.BundleView)
    assert view.get("ml/llm/M/abc/results.csv", 1000).startswith(b"Validator")
    signing.sign(reg, digest, _key())
    view = serving_store(reg, Signature(digest, pub, required=True))
    assert isinstance(view, ocibundle.BundleView)
    with pytest.raises(StoreError, match="read-only"):
        view.put("x", b"", "text/plain")


def test_fetch_refuses_what_it_cannot_check_when_a_signature_is_required(tmp_path: Path) -> None:
    reg = FakeRegistry()
    with pytest.raises(FetchError, match="names no signed bundle"):
        serving_store(reg, Signature("", None, required=True))
    assert serving_store(reg, Signature("", None, required=False)) is reg
    digest = _bundle(reg)
    with pytest.raises(
        FetchError, match=r"no key to verify it: set spec\.storage\.signing\.publicKey"
    ):
        serving_store(reg, Signature(digest, None, required=True))
    with pytest.raises(FetchError, match="the verification key"):
        serving_store(reg, Signature(digest, tmp_path / "missing.pub", required=True))


def test_a_changed_layer_is_refused_by_its_digest() -> None:
    reg = FakeRegistry()
    digest = _bundle(reg)
    view = ocibundle.BundleView(reg, digest)
    layer = next(iter(view.layers.values()))
    reg.blobs[layer.digest] = b"Validator,PT_VERSION,2.99.0\n"
    with pytest.raises(StoreError, match="does not match its digest"):
        view.get("ml/llm/M/abc/results.csv", 1000)
    with pytest.raises(NotFoundError):
        view.get("ml/llm/M/abc/manifest.json", 1000)


class Listing(oci.OciStore):
    """Tags and their manifests in memory, for what is read by listing them (list, notes)."""

    def __init__(self) -> None:
        self.location = Location("oci", f"{HOST}/team/tf", "", separator="#")
        self.docs: dict[str, Any] = {}
        self.blobs: dict[str, bytes] = {}

    def put_doc(self, tag: str, annotations: Any, data: bytes, size: Any = None) -> None:
        digest = oci.digest_of(data)
        self.blobs[digest] = data
        layer = {"digest": digest, "size": len(data) if size is None else size}
        self.docs[tag] = {"annotations": annotations, "layers": [layer]}

    def tags(self, prefix: str = "") -> list[str]:
        return sorted(t for t in self.docs if t.startswith(prefix))

    def manifest(self, reference: str) -> tuple[dict[str, Any], str] | None:
        doc = self.docs.get(reference)
        return (doc, "sha256:" + "0" * 64) if doc is not None else None

    def blob(self, digest: str, max_bytes: int, what: str) -> bytes:
        return self.blobs[digest]


def test_forged_sizes_and_annotations_are_refused_or_skipped_never_raised_as_type_errors() -> None:
    reg = Listing()
    note = {oci.KEY_ANNOTATION: "g", oci.NOTE_MEMBER_ANNOTATION: "m1"}
    reg.put_doc(oci.note_tag("g", "m1"), note, b"bid")
    for i, size in enumerate(("big", -1, True, 1.5)):
        member = f"forged{i}"
        forged = {oci.KEY_ANNOTATION: "g", oci.NOTE_MEMBER_ANNOTATION: member}
        reg.put_doc(oci.note_tag("g", member), forged, b"x", size=size)
    reg.put_doc(oci.note_tag("g", "m9"), "not annotations", b"y")
    assert reg.notes("g", 100) == [b"bid"]

    reg.put_doc(oci.tag_of("a/obj"), {oci.KEY_ANNOTATION: "a/obj"}, b"object")
    reg.put_doc(oci.tag_of("a/big"), {oci.KEY_ANNOTATION: "a/big"}, b"object", size="big")
    reg.put_doc(oci.tag_of("a/odd"), ["not", "annotations"], b"object")
    assert [o.key for o in reg.list("a", 10)] == ["a/obj"]
    assert reg.get("a/obj", 100) == b"object"
    for key in ("a/big", "a/odd"):
        with pytest.raises(ConflictError, match="not this object"):
            reg.get(key, 100)


# --- what status and the webhook carry -----------------------------------------------------


def test_a_forged_bundle_reference_in_status_is_dropped() -> None:
    good = {"uri": "oci://r/x#a", "sha256": "a" * 64, "bundle": {"digest": "sha256:" + "b" * 64}}
    record = ArtifactRecord.from_status(good)
    assert record is not None and record.bundle == "sha256:" + "b" * 64 and not record.signed
    for forged in ("evil.example.com/x:latest", "sha256:zz", "sha512:" + "b" * 128):
        bad = ArtifactRecord.from_status({**good, "bundle": {"digest": forged, "signed": True}})
        assert bad is not None and bad.bundle == "" and not bad.signed


def test_a_candidate_carries_its_bundle() -> None:
    c = Candidate("M", "oci://r/x#a", "a" * 64, bundle="sha256:" + "c" * 64)
    assert Candidate.from_arg(c.to_arg()) == c


def test_model_pods_get_the_spec_public_key_by_value_and_the_job_the_key_pair() -> None:
    """One source for the public key: spec.storage.signing.publicKey, which the operator
    verifies volume images with, reaches model pods' fetch by value; the signing Secret (the
    publisher's key pair) is mounted in tuning Jobs alone. Before, pods read cosign.pub from
    the Secret and the operator the spec: two copies that could disagree."""
    pem = (DATA / "cosign.pub").read_text()
    signed = {**OCI, "signing": {"secret": {"name": "signing"}, "publicKey": pem}}
    s = (
        OCI_SPEC.spec(storage=signed)
        .serving(credentialsSecret={"name": "registry-reader"})
        .spec_model()
    )
    serving = pod_storage(s, Config(image="tf:1"), read_only=True, serving=True)
    args = serving.args
    assert args[args.index("--verify-key-env") + 1] == "TUNEFLEET_VERIFY_KEY"
    assert "--require-signature" in args
    assert {"name": "TUNEFLEET_VERIFY_KEY", "value": pem} in serving.env
    volumes = {v["name"]: v for v in serving.volumes}
    assert "tunefleet-signing" not in volumes
    assert volumes["tunefleet-oci"]["secret"]["secretName"] == "registry-reader"
    optional = OCI_SPEC.spec(
        storage={**signed, "signing": {**signed["signing"], "policy": "Optional"}}
    ).spec_model()
    args = pod_storage(optional, Config(image="tf:1"), serving=True).args
    assert "--verify-key-env" in args and "--require-signature" not in args
    # No key in the spec under Required: fetch is told to require one, and refuses, naming
    # the field (test_fetch_refuses_what_it_cannot_check_when_a_signature_is_required).
    keyless = pod_storage(
        OCI_SPEC.spec(storage=SIGNED).spec_model(), Config(image="tf:1"), serving=True
    )
    assert keyless.args == ["--require-signature"] and not keyless.env

    job = build_tuning_job(Child(s, "ml", "llm", "uid-1", "MI300X", Config(image="tf:1")))
    pod = job["spec"]["template"]["spec"]
    steps = {c["name"]: c for c in pod["initContainers"] + pod["containers"]}
    assert "--signing-key-dir" in steps["publish"]["command"]
    assert "--signing-key-dir" not in steps["sync"]["command"]
    (sv,) = [v for v in pod["volumes"] if v["name"] == "tunefleet-signing"]
    assert sorted(i["key"] for i in sv["secret"]["items"]) == ["cosign.key", "cosign.password"]


def test_gc_deletes_an_artifacts_bundle_and_its_signature_with_its_manifest() -> None:
    calls: list[tuple[str, str]] = []

    class Recording(FakeRegistry):
        def _head(self, reference: str, what: str) -> str:
            found = self.manifest(reference)
            return found[1] if found else ""

        def delete_manifest(self, digest: str) -> None:
            calls.append(("delete", digest))

    reg = Recording()
    base = "ml/llm/M/" + "a" * 64
    digest = reg.push_manifest({"layers": []}, oci.bundle_tag(base))
    signature = signing.sign(reg, digest, _key())
    obj = reg.push_manifest({"layers": []}, oci.tag_of(f"{base}/manifest.json"))
    # Both formats: the legacy .sig, then the bundle referrer and the tag-schema index.
    (bundle,) = reg.referrers(digest)
    index = reg.tags[oci.referrers_tag(digest)]
    reg.delete(f"{base}/manifest.json")
    assert calls == [
        ("delete", signature),
        ("delete", bundle["digest"]),
        ("delete", index),
        ("delete", digest),
        ("delete", obj),
    ]
    assert hashlib.sha256(base.encode()).hexdigest() in oci.bundle_tag(base)


# --- image volumes -----------------------------------------------------------------------------


def test_the_volume_layer_is_deterministic_and_holds_the_results_per_ordinal() -> None:
    results = b"Validator,PT_VERSION,2.11.0\nGemmTunableOp_float_NT,nt_8_8_8,Default,0.01\n"
    a = ocibundle.volume_layer(b'{"schema": 1}\n', "results.csv", results, True)
    assert a == ocibundle.volume_layer(b'{"schema": 1}\n', "results.csv", results, True)
    assert ocibundle.read_volume_layer(a, "results.csv", True) == (b'{"schema": 1}\n', results)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(a))) as tar:
        names = tar.getnames()
        last = tar.getmember(f"tunableop_results{ocibundle.VOLUME_DEVICES - 1}.csv")
    assert "tunableop_results0.csv" in names and last.islnk()
    assert last.linkname == "tunableop_results0.csv"


def _layer_with(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue(), mtime=0)


def test_every_gpu_ordinals_results_file_in_a_volume_is_checked_not_only_the_first() -> None:
    """A volume whose first results file is right and whose fourth is a regular file with other
    rows passed before: only tunableop_results0.csv was compared."""
    results = b"Validator,PT_VERSION,2.11.0\nGemmTunableOp_float_NT,nt_8_8_8,Default,0.01\n"
    forged = b"Validator,PT_VERSION,2.11.0\nGemmTunableOp_float_NT,nt_8_8_8,Gemm_Evil_1,0.01\n"
    meta = ocibundle.META_DIR
    layer = _layer_with([
        (f"{meta}/manifest.json", b"{}"), (f"{meta}/results.csv", results),
        ("tunableop_results0.csv", results), ("tunableop_results3.csv", forged),
    ])  # fmt: skip
    with pytest.raises(ocibundle.VolumeError, match=r"tunableop_results3.csv is not the artifact"):
        ocibundle.read_volume_layer(layer, "results.csv", True)
    honest = _layer_with([
        (f"{meta}/manifest.json", b"{}"), (f"{meta}/results.csv", results),
        ("tunableop_results0.csv", results), ("tunableop_results3.csv", results),
    ])  # fmt: skip
    assert ocibundle.read_volume_layer(honest, "results.csv", True) == (b"{}", results)


def test_a_volume_layer_that_unpacks_past_its_bound_is_refused_as_it_unpacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ocibundle, "MAX_VOLUME_UNPACKED", 1 << 20)
    bomb = gzip.compress(b"\0" * (8 << 20), mtime=0)  # 8 KB that unpacks to 8 MB
    assert len(bomb) < 64 << 10
    with pytest.raises(ocibundle.VolumeError, match=r"unpacks to more than 1048576 bytes"):
        ocibundle.read_volume_layer(bomb, "results.csv", True)


def test_bounded_gunzip_refuses_bombs_trailing_data_and_garbage() -> None:
    from tunefleet.artifacts import gz

    assert gz.gunzip(gzip.compress(b"abc"), 3, "x") == b"abc"
    with pytest.raises(gz.TooBig, match="x unpacks to more than 2 bytes"):
        gz.gunzip(gzip.compress(b"abc"), 2, "x")
    with pytest.raises(ValueError, match="not one whole gzip stream"):
        gz.gunzip(gzip.compress(b"abc") + b"junk", 10, "x")
    with pytest.raises(ValueError, match="not one whole gzip stream"):
        gz.gunzip(gzip.compress(b"abc")[:-4], 10, "x")
    with pytest.raises(ValueError, match="does not decompress"):
        gz.gunzip(b"not gzip at all", 10, "x")


MODEL = "AMD_Instinct_MI300X_OAM"
CACHE_FILES = {"inductor/fxgraph/a/entry": b"graph" * 50, "triton/K/kernel.so": b"\x7fELF"}


def _published(tmp: Path) -> tuple[Any, Path]:
    """Results and a torchCompile cache, published to a directory store (as publish leaves
    them): the record-to-be and the store."""
    root = tmp / "caches"
    for rel, data in CACHE_FILES.items():
        path = root / "tc" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / "tc" / "triton" / "K" / "kernel.so").chmod(0o755)
    out = tmp / "out"
    packed = cc.pack(cc.spec("torchCompile", "tc"), root, out)
    assert isinstance(packed, cc.Packed)
    tuner_output(out, caches=(packed,))
    store = tmp / "store"
    pub = publish_mod.publish(Output(out, f"file://{store}", "ml", "llama", MODEL))
    return pub, store


def _volume(reg: FakeRegistry, pub: Any, store: Path) -> tuple[str, bytes]:
    files = store / "ml" / "llama" / MODEL / pub.sha256
    manifest_bytes = (files / "manifest.json").read_bytes()
    manifest = loads(manifest_bytes)
    archives = {c.name: files / "caches" / f"{c.sha256}.tar.gz" for c in manifest.caches}
    payload = (files / "results.csv").read_bytes()
    return ocibundle.push_volume(
        reg, "ml/llama", manifest_bytes, manifest, payload, archives
    ), manifest_bytes


def _mount(reg: FakeRegistry, digest: str, root: Path) -> None:
    """What the runtime does with an image volume: every layer unpacked, in order."""
    doc, _ = reg.manifest(digest) or ({}, "")
    for layer in doc["layers"]:
        with tarfile.open(fileobj=io.BytesIO(reg.blobs[layer["digest"]]), mode="r:gz") as tar:
            tar.extractall(root, filter="tar")


def test_a_volume_image_is_checked_against_the_artifacts_pins(tmp_path: Path) -> None:
    reg = FakeRegistry()
    pub, store = _published(tmp_path)
    digest, manifest_bytes = _volume(reg, pub, store)
    msha = hashlib.sha256(manifest_bytes).hexdigest()
    ocibundle.check_volume(reg, digest, pub.sha256, msha, "tunableop", 1)
    with pytest.raises(ocibundle.VolumeError, match=r"results\.csv is not the artifact"):
        ocibundle.check_volume(reg, digest, "0" * 64, "", "tunableop", 1)
    with pytest.raises(ocibundle.VolumeError, match="manifest is not the artifact"):
        ocibundle.check_volume(reg, digest, pub.sha256, "1" * 64, "tunableop", 1)
    with pytest.raises(ocibundle.VolumeError, match="not this artifact's volume image"):
        ocibundle.check_volume(reg, digest, pub.sha256, msha, "tunableop", 0)
    bundle = _bundle(reg)  # not a volume image
    with pytest.raises(ocibundle.VolumeError, match="not this artifact's volume image"):
        ocibundle.check_volume(reg, bundle, pub.sha256, "", "tunableop", 0)


def test_a_mounted_volume_serves_its_results_in_place_and_caches_as_a_writable_copy(
    tmp_path: Path,
) -> None:
    reg = FakeRegistry()
    pub, store = _published(tmp_path)
    digest, manifest_bytes = _volume(reg, pub, store)
    assert digest == _volume(FakeRegistry(), pub, store)[0]  # deterministic
    root = tmp_path / "volume"
    _mount(reg, digest, root)
    pin = Pinned(pub.uri, pub.sha256, hashlib.sha256(manifest_bytes).hexdigest(), MODEL)
    got = from_volume(root, pin, Serving(2, tmp_path / "caches-dest"))
    assert got.caches == ("tc",) and not got.caches_failed
    assert [p.name for p in got.paths] == ["tunableop_results0.csv", "tunableop_results1.csv"]
    assert all(
        p.read_bytes() == (root / ".tunefleet" / "results.csv").read_bytes() for p in got.paths
    )
    copied = tmp_path / "caches-dest" / "tc"
    for rel, data in CACHE_FILES.items():
        assert (copied / rel).read_bytes() == data
    assert (copied / "triton" / "K" / "kernel.so").stat().st_mode & 0o777 == 0o777
    assert (copied / "inductor" / "fxgraph" / "a" / "entry").stat().st_mode & 0o777 == 0o666


def test_a_volume_whose_caches_the_pod_cannot_hold_serves_its_results_and_copies_none(
    tmp_path: Path,
) -> None:
    root, _, pin = _mounted_volume(tmp_path)
    got = from_volume(root, pin, Serving(2, tmp_path / "caches-dest", caches_room=16))
    assert got.caches == () and "this pod may hold" in got.caches_failed
    assert len(got.paths) == 2  # the results still serve
    assert not (tmp_path / "caches-dest" / "tc").exists()


def test_a_changed_cache_in_a_volume_is_not_copied_and_the_results_still_serve(
    tmp_path: Path,
) -> None:
    reg = FakeRegistry()
    pub, store = _published(tmp_path)
    digest, _ = _volume(reg, pub, store)
    root = tmp_path / "volume"
    _mount(reg, digest, root)
    entry = root / ".tunefleet" / "caches" / "tc" / "inductor" / "fxgraph" / "a" / "entry"
    entry.chmod(0o644)
    entry.write_bytes(b"graph")
    got = from_volume(root, Pinned(pub.uri, pub.sha256), Serving(1, tmp_path / "dest"))
    assert got.caches == () and "its manifest lists" in got.caches_failed
    assert not (tmp_path / "dest" / "tc").exists()
    with pytest.raises(FetchError, match="caches not served"):
        from_volume(
            root, Pinned(pub.uri, pub.sha256), Serving(1, tmp_path / "d2", fail_closed=True)
        )
    (root / ".tunefleet" / "results.csv").chmod(0o644)
    (root / ".tunefleet" / "results.csv").write_bytes(b"Validator,PT_VERSION,2.11.0\n")
    with pytest.raises(FetchError, match="corrupted or truncated"):
        from_volume(root, Pinned(pub.uri, pub.sha256), Serving(1))


@pytest.mark.parametrize(
    ("mode", "minor", "runtimes", "words"),
    [
        ("true", 30, {}, ""),
        ("false", 36, {"n": "containerd://2.4.2"}, "image volumes are off"),
        ("auto", 34, {"n": "containerd://2.4.2"}, "does not serve image volumes"),
        ("auto", 36, {"n": "containerd://2.4.2+unknown", "m": "cri-o://1.31.0"}, ""),
        ("auto", 36, {"n": "containerd://1.7.27"}, "node n runs containerd://1.7.27"),
        ("auto", 36, {"k": "kwok-0.8.0"}, "node k runs kwok-0.8.0"),
        ("auto", 36, {}, "no node of the GPU model"),
    ],
)
def test_image_volumes_are_used_only_where_the_cluster_mounts_them(
    mode: str, minor: int, runtimes: dict[str, str], words: str
) -> None:
    problem = delivery.image_volume_problem(mode, minor, runtimes)
    assert (words in problem) if words else problem == ""


OCI_PROFILE = (
    make_profile()
    .gpu("nvidia", "NVIDIA-H200")
    .spec(storage=SIGNED)
    .serving(credentialsSecret={"name": "registry-reader"})
    .phase("Ready")
)
OCI_ART = make_artifact("NVIDIA-H200").uri(f"oci://{HOST}/team/tf#ns/x/NVIDIA-H200/{'ab' * 32}")
BUNDLE = {"digest": "sha256:" + "c" * 64, "signed": True}
IN_VOLUME = OCI_PROFILE.artifacts(
    OCI_ART.fields(delivery="ImageVolume", bundle={**BUNDLE, "volume": "sha256:" + "d" * 64})
)
MODEL_POD = make_model_pod("x").generate_name("m-")


def _verified(digest: str, signed: bool = True, why: str = "") -> dict[str, VolumeVerdict]:
    return {digest: VolumeVerdict(True, signed, why)}


def test_a_verified_volume_image_is_mounted_by_digest_with_nothing_run_before() -> None:
    volume = "sha256:" + "d" * 64
    d = admit(
        MODEL_POD.obj(), "x", OCI_PROFILE.artifacts(OCI_ART.fields(delivery="ImageVolume", bundle={**BUNDLE, "volume": volume})).obj(), Config(image="tf:1"),
        volumes=_verified(volume),
    )  # fmt: skip
    spec = d.pod["spec"]
    (vol,) = [v for v in spec["volumes"] if "image" in v]
    assert vol["image"] == {"reference": f"{HOST}/team/tf@{volume}", "pullPolicy": "IfNotPresent"}
    assert spec["imagePullSecrets"] == [{"name": "registry-reader"}]
    assert not spec.get("initContainers")
    (server,) = spec["containers"]
    assert {"name": vol["name"], "mountPath": "/tunefleet/results", "readOnly": True} in server[
        "volumeMounts"
    ]


@pytest.mark.parametrize(
    ("delivery", "volume"),
    [
        ("Store: volume image not mounted: signed by another key", "sha256:" + "d" * 64),
        ("ImageVolume", "evil.example.com/x:latest"),  # a forged status names no digest
        ("ImageVolume", ""),
    ],
)
def test_anything_not_verified_is_fetched_and_checked_by_fetch(delivery: str, volume: str) -> None:
    d = admit(MODEL_POD.obj(), "x", OCI_PROFILE.artifacts(OCI_ART.fields(delivery=delivery, bundle={**BUNDLE, "volume": volume})).obj(), Config(image="tf:1"),
              volumes=_verified("sha256:" + "d" * 64))  # fmt: skip
    spec = d.pod["spec"]
    assert not [v for v in spec["volumes"] if "image" in v]
    (fetch,) = spec["initContainers"]
    cmd = fetch["command"]
    assert cmd[cmd.index("--bundle") + 1] == "sha256:" + "c" * 64
    assert "--require-signature" in cmd


@pytest.mark.parametrize(
    "verdicts",
    [
        {},  # none in time (the registry slow, or never asked)
        {"sha256:" + "d" * 64: VolumeVerdict(False, False, "no valid signature by the key")},
        {"sha256:" + "e" * 64: VolumeVerdict(True, True)},  # a verdict on another digest
    ],
    ids=["no-verdict", "refused", "other-digest"],
)
def test_a_status_saying_image_volume_mounts_nothing_without_a_verdict_on_that_digest(
    verdicts: dict[str, VolumeVerdict],
) -> None:
    """Status is shown, never trusted: one written by whoever can write it (naming any digest
    of the repository, delivery ImageVolume) mounts nothing unverified; the pod fetches the
    artifact and checks its signature itself. Before, the status's word was enough."""
    forged = IN_VOLUME.obj()
    d = admit(MODEL_POD.obj(), "x", forged, Config(image="tf:1"), volumes=verdicts)
    spec = d.pod["spec"]
    assert not [v for v in spec["volumes"] if "image" in v]
    (fetch,) = spec["initContainers"]
    assert "--require-signature" in fetch["command"]
    assert any("is not mounted" in n for n in d.notes), d.notes
    assert "tunefleet.io/artifact-volume" not in d.pod["metadata"]["annotations"]


def test_an_unsigned_volume_mounted_under_optional_says_so_on_the_pod() -> None:
    prof = IN_VOLUME.obj()
    prof["spec"]["storage"]["signing"]["policy"] = "Optional"
    why = "registry.example.com:5000/team/tf@sha256:ddd is not signed"
    d = admit(MODEL_POD.obj(), "x", prof, Config(image="tf:1"),
              volumes=_verified("sha256:" + "d" * 64, signed=False, why=why))  # fmt: skip
    anns = d.pod["metadata"]["annotations"]
    assert anns["tunefleet.io/artifact-signature"] == f"unsigned: {why}"
    assert [v for v in d.pod["spec"]["volumes"] if "image" in v]
    signed = admit(MODEL_POD.obj(), "x", prof, Config(image="tf:1"),
                   volumes=_verified("sha256:" + "d" * 64))  # fmt: skip
    assert "tunefleet.io/artifact-signature" not in signed.pod["metadata"]["annotations"]


# --- a registry that is down, or hangs ---------------------------------------------------------


def test_a_registry_that_refuses_connections_fails_the_operation_saying_so() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    loc = parse_uri(f"oci://127.0.0.1:{port}/team/tf")
    store = oci.OciStore(loc, timeout_s=5.0)
    t = time.monotonic()
    with pytest.raises(StoreError, match="ConnectionError"):
        store.put_if_absent("a/results.csv", b"x", "text/csv")
    assert time.monotonic() - t < 10


def test_a_registry_that_never_answers_is_given_up_on_at_the_deadline() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:  # takes connections, never answers
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    try:
        loc = parse_uri(f"oci://127.0.0.1:{server.getsockname()[1]}/team/tf")
        store = oci.OciStore(loc, timeout_s=2.0)
        t = time.monotonic()
        with pytest.raises(StoreError):
            store.get("a/results.csv", 100)
        assert time.monotonic() - t < 8  # the operation's deadline, not oras-py's retries
    finally:
        server.close()
        for conn in held:
            conn.close()


def test_caches_in_a_verified_volume_are_copied_by_fetch_from_the_mount_downloading_nothing() -> (
    None
):
    prof = IN_VOLUME.obj()
    prof["spec"]["artifacts"] = {"caches": [{"kind": "cache", "name": "stack", "env": "STACK_DIR"}]}
    prof["status"]["artifacts"][0]["caches"] = [
        {"kind": "cache", "name": "stack", "sha256": "e" * 64, "size": 10, "files": 1, "bytes": 5}
    ]
    d = admit(
        MODEL_POD.obj(), "x", prof, Config(image="tf:1"), volumes=_verified("sha256:" + "d" * 64)
    )
    spec = d.pod["spec"]
    (copy,) = spec["initContainers"]
    cmd = copy["command"]
    assert cmd[cmd.index("--from-volume") + 1] == "/tunefleet/volume"
    assert "--caches-dest" in cmd and "--verify-key" not in cmd and "--bundle" not in cmd
    assert {"name": "tunefleet-results", "mountPath": "/tunefleet/volume", "readOnly": True} in (
        copy["volumeMounts"]
    )
    assert not [e for e in copy.get("env") or [] if "AWS" in e["name"]]  # no store credentials
    names = {v["name"] for v in spec["volumes"]}
    assert {"tunefleet-results", "tunefleet-caches"} <= names
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env["STACK_DIR"].startswith("/tunefleet/caches/stack")


def _volume_pod(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod = MODEL_POD.obj()
    if annotations:
        pod.setdefault("metadata", {})["annotations"] = annotations
    prof = IN_VOLUME.obj()
    prof["spec"]["artifacts"] = {"caches": [{"kind": "cache", "name": "stack", "env": "STACK_DIR"}]}
    prof["status"]["artifacts"][0]["caches"] = [
        {"kind": "cache", "name": "stack", "sha256": "e" * 64, "size": 10, "files": 1, "bytes": 5}
    ]
    admitted: dict[str, Any] = admit(
        pod, "x", prof, Config(image="tf:1"), volumes=_verified("sha256:" + "d" * 64)
    ).pod
    return admitted


def test_the_serving_container_mounts_the_volume_where_fetch_links_its_caches_to() -> None:
    spec = _volume_pod()["spec"]
    cmd = spec["initContainers"][0]["command"]
    assert cmd[cmd.index("--volume-served-at") + 1] == "/tunefleet/volume"
    mounts = spec["containers"][0]["volumeMounts"]
    assert {"name": "tunefleet-results", "mountPath": "/tunefleet/volume", "readOnly": True} in (
        mounts
    )


def test_a_pod_that_asks_for_copies_gets_every_cache_file_copied() -> None:
    spec = _volume_pod({naming.CACHES_COPY_ANNOTATION: "True"})["spec"]
    cmd = spec["initContainers"][0]["command"]
    assert "--from-volume" in cmd and "--volume-served-at" not in cmd
    assert not [
        m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == "/tunefleet/volume"
    ]


def test_a_pod_holding_the_volumes_path_itself_gets_no_links() -> None:
    pod = MODEL_POD.obj()
    assert volume_links(pod)
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "own", "mountPath": "/tunefleet/volume/"}
    ]
    assert not volume_links(pod)


def _mounted_volume(tmp_path: Path) -> tuple[Path, Any, Pinned]:
    reg = FakeRegistry()
    pub, store = _published(tmp_path)
    digest, manifest_bytes = _volume(reg, pub, store)
    root = tmp_path / "volume"
    _mount(reg, digest, root)
    pin = Pinned(pub.uri, pub.sha256, hashlib.sha256(manifest_bytes).hexdigest(), MODEL)
    return root, loads(manifest_bytes), pin


def _mountinfo(tmp_path: Path, root: Path, options: str) -> Path:
    path = tmp_path / "mountinfo"
    path.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        f"90 22 0:50 / {root} {options} - overlay overlay ro\n"
    )
    return path


@pytest.mark.parametrize("noexec", [False, True])
def test_big_cache_files_in_a_volume_are_linked_where_the_serving_containers_see_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, noexec: bool
) -> None:
    """A file of LINK_MIN_BYTES or more becomes a link into the volume as the serving
    containers mount it (nothing copied); a smaller one is copied; a library is copied where
    the volume is mounted noexec (it could not be mapped to run)."""
    root, manifest, _ = _mounted_volume(tmp_path)
    monkeypatch.setattr(ocibundle, "LINK_MIN_BYTES", 4)  # entry (250 B) and kernel.so (4 B)
    opts = "ro,nosuid,nodev,noexec,relatime" if noexec else "ro,nosuid,nodev,relatime"
    info = _mountinfo(tmp_path, root, opts)
    real = ocibundle.mounted_noexec
    monkeypatch.setattr(ocibundle, "mounted_noexec", lambda p: real(p, info))
    dest = tmp_path / "dest"
    served = Path("/tunefleet/volume")
    got = ocibundle.copy_caches(root, manifest, dest, served)
    entry = dest / "tc" / "inductor" / "fxgraph" / "a" / "entry"
    kernel = dest / "tc" / "triton" / "K" / "kernel.so"
    assert entry.is_symlink()
    assert os.readlink(entry) == str(served / ".tunefleet/caches/tc/inductor/fxgraph/a/entry")
    assert kernel.is_symlink() is not noexec  # an ELF object, copied under noexec
    assert got.linked == 250 + (0 if noexec else 4) and got.copied == (4 if noexec else 0)
    # The directories stay the pod's own: the stack adds files and replaces a linked one by
    # renaming a new file over it, as stacks write their caches.
    (entry.parent / "new").write_bytes(b"added")
    (entry.parent / "tmp").write_bytes(b"newer graph")
    os.replace(entry.parent / "tmp", entry)
    assert not entry.is_symlink() and entry.read_bytes() == b"newer graph"


def test_without_a_serving_path_every_cache_file_is_copied(tmp_path: Path) -> None:
    root, manifest, _ = _mounted_volume(tmp_path)
    got = ocibundle.copy_caches(root, manifest, tmp_path / "dest")
    assert got.linked == 0 and got.copied == sum(len(v) for v in CACHE_FILES.values())
    assert not any(p.is_symlink() for p in (tmp_path / "dest").rglob("*"))


def test_noexec_is_read_from_the_mount_that_holds_the_path(tmp_path: Path) -> None:
    root = tmp_path / "volume"
    info = _mountinfo(tmp_path, root, "ro,noexec")
    assert ocibundle.mounted_noexec(root / "a" / "b", info)
    assert not ocibundle.mounted_noexec(tmp_path / "volumes", info)  # "/" holds that one
    assert ocibundle.mounted_noexec(root, tmp_path / "absent")  # unknown: the safe answer


def test_a_status_naming_another_repository_gets_no_image_volume() -> None:
    prof = IN_VOLUME.obj()
    art = prof["status"]["artifacts"][0]
    art["uri"] = art["uri"].replace("/team/tf#", "/elsewhere/tf#")
    d = admit(MODEL_POD.obj(), "x", prof, Config(image="tf:1"))
    assert not [v for v in d.pod["spec"]["volumes"] if "image" in v]


def test_why_says_a_pod_runs_from_its_image_volume() -> None:
    prof = IN_VOLUME.obj()
    pod = admit(MODEL_POD.obj(), "x", prof, Config(image="tf:1"),
                volumes=_verified("sha256:" + "d" * 64)).pod  # fmt: skip
    pod["metadata"]["name"] = "m-1"
    pod["status"] = {"phase": "Running"}
    report = explain(pod, {**prof, "metadata": {"name": "x", "namespace": "ml"}}, [])
    assert report["verdict"] == "injected" and report["tuned"] is True
    assert report["summary"].startswith("tuned: artifact abababababab mounted as image volume")
    assert f"{HOST}/team/tf@sha256:{'d' * 64}" in report["summary"]


def test_serving_delivery_store_keeps_oci_pods_fetching() -> None:
    from tunefleet.api.profile_status import records
    from tunefleet.reconciler import decide
    from tunefleet.reconciler.memory import ProfileMemory

    class _Inputs:
        spec = OCI_SPEC.spec(storage=SIGNED).serving(delivery="Store").spec_model()
        config = Config(image="tf:1")
        memory = ProfileMemory()
        at = 0.0

    served = records([{"uri": "oci://r/x#a", "sha256": "a" * 64}])
    said = decide.deliveries(_Inputs(), served)  # type: ignore[arg-type]
    assert [(d.act, d.record.delivery) for d in said] == [("", "Store (spec.serving.delivery)")]
    _Inputs.spec = OCI_SPEC.spec(storage=SIGNED).spec_model()
    said = decide.deliveries(_Inputs(), served)  # type: ignore[arg-type]
    assert [d.act for d in said] == ["volume"]


# --- the one check of a volume image, and its verdicts (artifacts/volumes.py) -----------------


def test_the_volume_check_takes_exactly_the_digest_the_key_and_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tunefleet.artifacts import volumes
    from tunefleet.storage import registry as registry_mod

    reg = FakeRegistry()
    pub, store = _published(tmp_path)
    digest, manifest_bytes = _volume(reg, pub, store)
    monkeypatch.setattr(registry_mod, "open_store", lambda location, options: reg)
    record = ArtifactRecord(
        f"oci://{HOST}/team/tf#ml/llama/{MODEL}/{pub.sha256}", pub.sha256, 1, gpu_model=MODEL,
        manifest_sha256=hashlib.sha256(manifest_bytes).hexdigest(), volume=digest,
        caches=tuple(loads(manifest_bytes).caches),
    )  # fmt: skip
    cfg = Config(image="tf:1", oci_config="/nonexistent")
    pem = (DATA / "cosign.pub").read_text()
    # Not signed yet: Required refuses; so does Optional for caches (their bytes are bound by
    # the signature alone); Optional mounts results alone, and says unsigned.
    refused = volumes.check(record, pem, True, cfg)
    assert not refused.mountable and "is not signed" in refused.reason
    assert not volumes.check(record, pem, False, cfg).mountable
    results_only = replace(record, caches=())
    monkeypatch.setattr(ocibundle, "check_volume", lambda *a: None)  # its own test is above
    unsigned = volumes.check(results_only, pem, False, cfg)
    assert unsigned.mountable and not unsigned.signed and "is not signed" in unsigned.reason
    monkeypatch.undo()
    monkeypatch.setattr(registry_mod, "open_store", lambda location, options: reg)
    signing.sign(reg, digest, _key())
    assert volumes.check(record, pem, True, cfg) == volumes.VolumeVerdict(True, True, "")
    # Another key (the spec's changed): refused under Required.
    other = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    changed = volumes.check(record, other, True, cfg)
    assert not changed.mountable and "no valid signature by the configured key" in changed.reason
    assert "spec.storage.signing.publicKey" in volumes.check(record, "", True, cfg).reason
    bad = volumes.check(
        record, "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----", True, cfg
    )
    assert not bad.mountable and bad.reason.startswith("spec.storage.signing.publicKey")
    # Content against the pins: a record whose sha256 the volume does not hold.
    forged = replace(record, sha256="0" * 64)
    assert "is not the artifact" in volumes.check(forged, pem, True, cfg).reason


def test_verdicts_are_kept_by_digest_key_and_policy_for_a_while() -> None:
    from tunefleet.artifacts import volumes

    now = [0.0]
    kept = volumes.Verdicts(ttl_s=60, clock=lambda: now[0])
    ok = volumes.VolumeVerdict(True, True)
    kept.remember("sha256:d", "KEY-A", True, ok)
    assert kept.get("sha256:d", "KEY-A", True) == ok
    assert kept.get("sha256:d", " KEY-A\n", True) == ok  # the same PEM, other whitespace
    assert kept.get("sha256:d", "KEY-B", True) is None  # a changed key: checked again now
    assert kept.get("sha256:d", "KEY-A", False) is None  # a changed policy: likewise
    assert kept.get("sha256:e", "KEY-A", True) is None
    now[0] = 61
    assert kept.get("sha256:d", "KEY-A", True) is None  # a removed signature counts after 60 s


def test_a_volume_pinned_to_a_malformed_sha256_is_refused_naming_the_volume(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"^the image volume at .*: .*sha") as refused:
        from_volume(tmp_path, Pinned("oci://registry.example.com/p", "not-a-sha"), Serving(1))
    assert str(tmp_path) in str(refused.value)


# --- admission's checks: single flight per digest, side by side, within the webhook's time ----

THREE = ("NVIDIA-H100", "NVIDIA-H200", "AMD-MI300X")


def _three_volumes() -> dict[str, Any]:
    """A profile whose three GPU models each serve an image volume of their own."""
    arts = [
        make_artifact(m, sha)
        .uri(f"oci://{HOST}/team/tf#ns/x/{m}/{sha}")
        .fields(delivery="ImageVolume", bundle={**BUNDLE, "volume": f"sha256:{sha}"})
        for m, sha in zip(THREE, ("a1" * 32, "b2" * 32, "c3" * 32), strict=True)
    ]
    return OCI_PROFILE.gpu("nvidia", *THREE).artifacts(*arts).obj()


class _SlowRegistry:
    """volumes.check against a registry that answers in `delay_s` (or when `release` is set):
    how many checks of each digest ran, and the most at once."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s, self.release = delay_s, threading.Event()
        self.lock = threading.Lock()
        self.calls: dict[str, int] = {}
        self.running = self.most = 0

    def check(self, record: ArtifactRecord, key: str, required: bool, cfg: Config) -> Any:
        with self.lock:
            self.calls[record.volume] = self.calls.get(record.volume, 0) + 1
            self.running += 1
            self.most = max(self.most, self.running)
        if self.delay_s:
            time.sleep(self.delay_s)
        else:
            self.release.wait(10)
        with self.lock:
            self.running -= 1
        return VolumeVerdict(True, True)


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Fresh verdicts and checks, each check by a _SlowRegistry: set its delay_s, or leave it
    0 and set release."""
    from tunefleet.artifacts import volumes

    registry = _SlowRegistry()
    monkeypatch.setattr(volumes, "VERDICTS", volumes.Verdicts())
    monkeypatch.setattr(volumes, "CHECKS", volumes.Checks())
    monkeypatch.setattr(volumes, "check", registry.check)
    yield registry
    registry.release.set()


def _admit_all(pods: int, budget_s: float) -> list[tuple[float, dict[str, VolumeVerdict]]]:
    """`pods` admissions at once of the three-model profile: each one's time and verdicts."""
    import asyncio

    from tunefleet.handlers import on_pod

    entry, cfg = _three_volumes(), Config(image="tf:1", oci_config="/cfg")

    async def one() -> tuple[float, dict[str, VolumeVerdict]]:
        t = time.perf_counter()
        got = await on_pod._volume_verdicts(entry, cfg, budget_s)
        return time.perf_counter() - t, got

    async def burst() -> list[tuple[float, dict[str, VolumeVerdict]]]:
        return list(await asyncio.gather(*(one() for _ in range(pods))))

    return asyncio.run(burst())


def test_fifty_pods_needing_three_digests_cost_three_checks_run_side_by_side(slow: Any) -> None:
    """Scaled down from a registry at 2 s a read against a 5 s webhook: each check takes
    0.2 s, the budget 1 s. Before, each pod checked its digests one after another (0.6 s
    each) and pods needing the same digest each checked it (150 checks)."""
    slow.delay_s = 0.2
    results = _admit_all(50, budget_s=1.0)
    assert slow.calls == {f"sha256:{s}": 1 for s in ("a1" * 32, "b2" * 32, "c3" * 32)}
    assert slow.most == 3  # the three digests side by side, never one after another
    for took, got in results:
        assert len(got) == 3 and all(v.mountable for v in got.values())
        assert took < 1.0 + 0.5, took  # within the budget (a generous margin for CI)


def test_a_check_past_the_budget_is_not_verified_now_and_never_started_twice(slow: Any) -> None:
    """A registry that does not answer: every admission returns at its budget with no
    verdict (the pod fetches and verifies the artifact itself), the one check per digest
    runs on (no thread per pod), and its verdict, when it lands, serves the next pod."""
    from tunefleet.artifacts import volumes

    results = _admit_all(20, budget_s=0.1)
    assert all(got == {} and took < 0.1 + 0.5 for took, got in results), results
    assert sorted(slow.calls.values()) == [1, 1, 1] and volumes.CHECKS.in_flight() == 3
    assert _admit_all(5, budget_s=0.0) == [(pytest.approx(0, abs=0.5), {})] * 5
    slow.release.set()
    deadline = time.monotonic() + 5
    while volumes.CHECKS.in_flight() and time.monotonic() < deadline:
        time.sleep(0.01)
    ((_, got),) = _admit_all(1, budget_s=0.0)  # from the verdicts kept: no wait
    assert len(got) == 3 and sorted(slow.calls.values()) == [1, 1, 1]


def test_the_checks_budget_is_inside_the_webhooks_timeout() -> None:
    from tunefleet.handlers import on_pod

    now = time.perf_counter()
    assert on_pod.check_budget(Config(), now) == pytest.approx(on_pod.VOLUME_CHECK_S, abs=0.05)
    short = Config(webhook_timeout_seconds=3)
    assert on_pod.check_budget(short, now) == pytest.approx(3 - on_pod.ROOM_S, abs=0.05)
    assert on_pod.check_budget(Config(), now - 4.5) == 0.0  # nothing left: verdicts kept only
