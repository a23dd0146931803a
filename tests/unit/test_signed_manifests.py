"""Signatures of artifacts in stores of objects (s3://, pvc://; artifacts/signing.py): publish
signs the stored manifest as `cosign sign-blob` does, and whatever serves or adopts the
artifact verifies it as the profile's storage.signing asks (fetch, the operator's delivery,
fleet adoption: download_verified). The store is a real directory store standing where the
bucket is; the key pair is one `cosign generate-key-pair` made (tests/unit/data/cosign)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from testbed.builders.wrappers import make_profile
from tests.support.artifacts import tuner_output
from tunefleet import naming
from tunefleet.artifacts import fetch as fetch_module
from tunefleet.artifacts import fit, signing
from tunefleet.artifacts.fetch import FetchError, Pinned, Signature, download_verified
from tunefleet.artifacts.publish import Published, PublishError, sign_manifest, upload_artifact
from tunefleet.config import Config
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.serving import delivery
from tunefleet.storage.filesystem import DirStore
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import StoreOptions
from tunefleet.watched.views import ProfileRef
from tuner_job.output import MANIFEST_NAME

DATA = Path(__file__).parent / "data" / "cosign"
PASSWORD = b"tunefleet-test"  # of data/cosign/cosign.key
PUBLIC = (DATA / "cosign.pub").read_bytes()
LOCATION = parse_uri("s3://bkt/p")
MODEL = "AMD_Instinct_MI300X_OAM"


def key_dir(tmp_path: Path) -> Path:
    """The signing Secret as the tuning Job mounts it."""
    d = tmp_path / "signing"
    d.mkdir()
    (d / signing.PRIVATE_KEY).write_bytes((DATA / "cosign.key").read_bytes())
    (d / signing.PASSWORD).write_bytes(PASSWORD + b"\n")
    return d


def published(tmp_path: Path, signed: bool = True) -> tuple[DirStore, Published]:
    store = DirStore(LOCATION, tmp_path / "bkt")
    manifest = tuner_output(tmp_path / "out", gpu_model=MODEL)
    results = (tmp_path / "out" / "results.csv").read_bytes()
    pub = upload_artifact(store, LOCATION, results, manifest)
    if signed:
        pub = sign_manifest(store, LOCATION, pub, key_dir(tmp_path))
    return store, pub


def pin(pub: Published) -> Pinned:
    return Pinned(pub.uri, pub.sha256, pub.manifest_sha256, MODEL, fit.Target(MODEL, "amd", False))


def signature_key(pub: Published) -> str:
    return f"{parse_uri(pub.uri).prefix}/{MANIFEST_NAME}{signing.BLOB_SIGNATURE_SUFFIX}"


def check(store: DirStore, pub: Published, sig: Signature | None) -> None:
    download_verified(pin(pub), store=store, signature=sig)


REQUIRED = Signature(required=True, key_pem=PUBLIC)
OPTIONAL = Signature(required=False, key_pem=PUBLIC)


def test_publish_signs_the_stored_manifest_and_it_verifies_with_the_public_key(
    tmp_path: Path,
) -> None:
    store, pub = published(tmp_path)
    assert pub.signed
    sig = store.get(signature_key(pub), 4096)
    manifest = store.get(f"{parse_uri(pub.uri).prefix}/{MANIFEST_NAME}", 1 << 20)
    assert signing.verify_blob(manifest, sig, signing.load_public_key(PUBLIC)).ok
    check(store, pub, REQUIRED)
    check(store, pub, OPTIONAL)
    # Published again (the Job retried): the signature already there is kept.
    again = sign_manifest(store, LOCATION, pub, tmp_path / "signing")
    assert again.signed and store.get(signature_key(pub), 4096) == sig


def test_a_missing_signature_is_refused_only_where_one_is_required(tmp_path: Path) -> None:
    store, pub = published(tmp_path, signed=False)
    with pytest.raises(FetchError, match=r"manifest.json.sig is missing .*required"):
        check(store, pub, REQUIRED)
    check(store, pub, OPTIONAL)
    check(store, pub, None)  # a profile that signs nothing checks nothing


@pytest.mark.parametrize("policy", [REQUIRED, OPTIONAL])
def test_a_signature_by_another_key_or_of_other_bytes_or_not_base64_is_refused(
    tmp_path: Path, policy: Signature
) -> None:
    store, pub = published(tmp_path)
    key, prefix = signature_key(pub), parse_uri(pub.uri).prefix
    manifest = store.get(f"{prefix}/{MANIFEST_NAME}", 1 << 20)
    other = ec.generate_private_key(ec.SECP256R1())
    forged = {
        "another key": signing.sign_blob(manifest, other),
        "other bytes": signing.sign_blob(
            manifest + b" ", signing.read_key_dir(tmp_path / "signing")
        ),
        "not base64": b"not a signature!",
    }
    for what, data in forged.items():
        store.put(key, data, "text/plain")
        with pytest.raises(FetchError, match="not served"):
            check(store, pub, policy)
        assert what


def test_required_without_a_public_key_says_to_set_it(tmp_path: Path) -> None:
    store, pub = published(tmp_path)
    with pytest.raises(FetchError, match=r"set spec\.storage\.signing\.publicKey"):
        check(store, pub, Signature(required=True))


def test_publish_fails_saying_why_when_the_key_cannot_be_read(tmp_path: Path) -> None:
    store, pub = published(tmp_path, signed=False)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / signing.PRIVATE_KEY).write_bytes((DATA / "cosign.key").read_bytes())
    (bad / signing.PASSWORD).write_bytes(b"not-it")
    with pytest.raises(PublishError, match="cannot sign the manifest"):
        sign_manifest(store, LOCATION, pub, bad)
    assert sign_manifest(store, LOCATION, pub, None) == pub  # no key: nothing signed


def test_signing_an_object_store_asks_for_the_public_key_and_one_share() -> None:
    base = make_profile().gpu("amd", MODEL)
    signing_spec = {"secret": {"name": "signing"}, "publicKey": PUBLIC.decode()}
    signed = base.storage("s3://bkt/p", signing=signing_spec).spec_model()
    assert signed.storage.signing_policy == "Required" and naming.spec_problems(signed) == []
    no_key = base.storage("s3://bkt/p", signing={"secret": {"name": "signing"}}).spec_model()
    (problem,) = naming.spec_problems(no_key)
    assert "storage.signing.publicKey" in problem and "policy: Optional" in problem
    optional = {"policy": "Optional", "secret": {"name": "signing"}}
    assert naming.spec_problems(base.storage("s3://bkt/p", signing=optional).spec_model()) == []
    sharded = base.storage("s3://bkt/p", signing=signing_spec).gpu("amd", MODEL, parallelism=2)
    (problem,) = naming.spec_problems(sharded.spec_model())
    assert "gpu.parallelism" in problem and "does not sign" in problem
    # No storage.signing on an object store: unsigned, as before.
    assert base.storage("s3://bkt/p").spec_model().storage.signing_policy is None
    assert Signature.asked("", None) is None


@pytest.mark.parametrize("forged", [False, True])
def test_the_operators_delivery_verifies_the_signature_before_making_the_config_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forged: bool
) -> None:
    store, pub = published(tmp_path)
    if forged:
        manifest = store.get(f"{parse_uri(pub.uri).prefix}/{MANIFEST_NAME}", 1 << 20)
        other = signing.sign_blob(manifest, ec.generate_private_key(ec.SECP256R1()))
        store.put(signature_key(pub), other, "text/plain")
    # The bucket the operator's read identity opens is this directory.
    monkeypatch.setattr(fetch_module, "open_store", lambda location, options: store)
    record = ArtifactRecord.from_manifest(
        pub.manifest, uri=pub.uri, manifest_sha256=pub.manifest_sha256
    ).for_job(gpu_model=MODEL, revision="3f2a9c01de", job="tune-p-1", image_id="")

    def deliver() -> dict[str, object]:
        return delivery.artifact_config_map(
            record, ProfileRef("ml", "llama", "uid-p"), store=StoreOptions(),
            config=Config(delivery_credentials_secret="reader"), vendor="amd", signature=REQUIRED,
        )  # fmt: skip

    if forged:
        with pytest.raises(FetchError, match="another key"):
            deliver()
    else:
        assert deliver()["kind"] == "ConfigMap"
