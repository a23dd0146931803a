"""cosign v3's signature format (issue 54): a Sigstore bundle attached as an OCI referrer,
read and written beside the legacy `.sig` tag, against an in-memory registry that the real
OciStore talks HTTP to (tests/support/registry.py), with and without the referrers API.

data/cosign/v3-bundle/ is what `cosign sign --key data/cosign/cosign.key --tlog-upload=false
--use-signing-config=false` (cosign v3.1.3, default bundle format) pushed to Distribution
3.1.2: the signed image's manifest, the tag-schema index, the referrer and its bundle."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from tests.support.registry import MemoryRegistry
from tunefleet.artifacts import ocibundle, sigbundle, signing
from tunefleet.artifacts.fetch import FetchError, Signature, serving_store
from tunefleet.storage import oci

DATA = Path(__file__).parent / "data" / "cosign"
COSIGNED = DATA / "v3-bundle"
PASSWORD = b"tunefleet-test"  # of data/cosign/cosign.key, made by `cosign generate-key-pair`


def _key() -> ec.EllipticCurvePrivateKey:
    return signing.load_private_key((DATA / "cosign.key").read_bytes(), PASSWORD)


def _pub() -> ec.EllipticCurvePublicKey:
    return signing.load_public_key((DATA / "cosign.pub").read_bytes())


def _cosigned(referrers_api: bool) -> tuple[MemoryRegistry, str]:
    """The registry as cosign v3 left it; where it has the referrers API, without the
    index (the API lists the referrer by its subject)."""
    reg = MemoryRegistry(referrers_api)
    image = reg.put_manifest((COSIGNED / "image.json").read_bytes())
    reg.blobs[oci.EMPTY_DIGEST] = b"{}"
    bundle = (COSIGNED / "bundle.json").read_bytes()
    reg.blobs[oci.digest_of(bundle)] = bundle
    reg.put_manifest((COSIGNED / "referrer.json").read_bytes())
    if not referrers_api:
        reg.put_manifest((COSIGNED / "index.json").read_bytes(), oci.referrers_tag(image))
    return reg, image


def _image(reg: MemoryRegistry) -> str:
    """A tunefleet bundle (what fetch serves), pushed through the store."""
    store = reg.store()
    results = b"Validator,PT_VERSION,2.11.0\n"
    layer = {
        "mediaType": ocibundle.PAYLOAD_LAYERS["results.csv"],
        "digest": store.push_blob(results),
        "size": len(results),
        "annotations": {oci.KEY_ANNOTATION: "ml/llm/M/abc/results.csv"},
    }
    return store.push_manifest(store._artifact(ocibundle.ARTIFACT_TYPE, [layer], {}), "b-x")


def _attach(reg: MemoryRegistry, subject: str, bundle: bytes) -> str:
    """`bundle` attached to `subject` as cosign would, whatever it holds."""
    store = reg.store()
    return store.push_referrer(sigbundle.referrer(store, store.descriptor(subject), bundle))


def _envelope(bundle: bytes) -> dict[str, Any]:
    return dict(json.loads(bundle)["dsseEnvelope"])


# --- what cosign v3 signed -----------------------------------------------------------------


@pytest.mark.parametrize("referrers_api", [False, True], ids=["tag-fallback", "referrers-api"])
def test_a_bundle_cosign_v3_signed_is_verified_through_either_lookup(referrers_api: bool) -> None:
    reg, image = _cosigned(referrers_api)
    store = reg.store()
    assert store.manifest(signing.signature_tag(image)) is None  # no legacy .sig at all
    assert signing.verify(store, image, _pub()).ok
    assert oci.referrers_tag(image) in reg.tags or referrers_api


def test_a_cosign_v3_bundle_by_another_key_is_refused() -> None:
    reg, image = _cosigned(False)
    verdict = signing.verify(
        reg.store(), image, ec.generate_private_key(ec.SECP256R1()).public_key()
    )
    assert not verdict.ok and "no valid signature by the configured key" in verdict.reason
    assert "signed by another key, or altered" in verdict.reason


def test_a_cosign_v3_bundle_moved_onto_another_image_is_refused() -> None:
    reg, image = _cosigned(False)
    other = _image(reg)
    # cosign's index copied under the other image's fallback tag: the referrer's subject is not it.
    reg.tags[oci.referrers_tag(other)] = reg.tags[oci.referrers_tag(image)]
    verdict = signing.verify(reg.store(), other, _pub())
    assert not verdict.ok and "a Sigstore bundle attached to another image" in verdict.reason
    # Attached to it properly, but signing a statement that names the first image.
    reg.tags.pop(oci.referrers_tag(other))
    _attach(reg, other, (COSIGNED / "bundle.json").read_bytes())
    verdict = signing.verify(reg.store(), other, _pub())
    assert not verdict.ok and f"a signature of another image ({image})" in verdict.reason


def test_a_tampered_statement_is_refused_by_its_signature() -> None:
    reg = MemoryRegistry()
    image = _image(reg)
    bundle = json.loads((COSIGNED / "bundle.json").read_bytes())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["subject"][0]["digest"]["sha256"] = image.removeprefix("sha256:")
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    _attach(reg, image, json.dumps(bundle).encode())
    verdict = signing.verify(reg.store(), image, _pub())
    assert not verdict.ok and "signed by another key, or altered" in verdict.reason


@pytest.mark.parametrize(
    ("bundle", "why"),
    [
        (b"not json", "a malformed Sigstore bundle"),
        (
            b'{"dsseEnvelope": {"payload": "%%%", "payloadType": "x", "signatures": []}}',
            "malformed",
        ),
        (b'{"messageSignature": {}}', "signing a blob (cosign sign-blob), not an image"),
        (
            b'{"dsseEnvelope": {"payload": "", "payloadType": "text/plain", "signatures": []}}',
            "not an in-toto statement",
        ),
    ],
)
def test_a_malformed_bundle_is_refused_saying_why(bundle: bytes, why: str) -> None:
    reg = MemoryRegistry()
    image = _image(reg)
    _attach(reg, image, bundle)
    verdict = signing.verify(reg.store(), image, _pub())
    assert not verdict.ok and why in verdict.reason, verdict.reason


def test_an_attestation_by_the_key_is_not_taken_for_a_signature() -> None:
    # cosign attest's DSSE statements are signed by the same key, but sign nothing about the
    # image's contents being approved: only cosign sign's predicate type counts.
    reg = MemoryRegistry()
    image = _image(reg)
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"digest": {"sha256": image.removeprefix("sha256:")}}],
        "predicateType": "https://spdx.dev/Document",
        "predicate": {},
    }
    payload = json.dumps(statement).encode()
    sig = _key().sign(
        sigbundle.pae(sigbundle.DSSE_PAYLOAD_TYPE, payload), ec.ECDSA(hashes.SHA256())
    )
    envelope = {
        "payload": base64.b64encode(payload).decode(),
        "payloadType": sigbundle.DSSE_PAYLOAD_TYPE,
        "signatures": [{"sig": base64.b64encode(sig).decode()}],
    }
    _attach(reg, image, json.dumps({"dsseEnvelope": envelope}).encode())
    verdict = signing.verify(reg.store(), image, _pub())
    assert (
        not verdict.ok and "'https://spdx.dev/Document', not a cosign signature" in verdict.reason
    )


def test_an_oversized_bundle_is_refused_before_it_is_read() -> None:
    reg = MemoryRegistry()
    image = _image(reg)
    huge = b"{" + b" " * sigbundle.MAX_BUNDLE + b"}"
    _attach(reg, image, huge)
    digest = oci.digest_of(huge)
    reg.blobs[digest] = b"never read"  # were it read, it would fail its digest instead
    verdict = signing.verify(reg.store(), image, _pub())
    assert not verdict.ok and "an oversized Sigstore bundle" in verdict.reason


def test_a_bundle_whose_blob_is_larger_than_its_manifest_says_is_cut_at_that_size() -> None:
    reg = MemoryRegistry()
    image = _image(reg)
    store = reg.store()
    manifest = sigbundle.referrer(store, store.descriptor(image), sigbundle.make(image, _key()))
    reg.blobs[manifest["layers"][0]["digest"]] += b" " * 4096
    store.push_referrer(manifest)
    verdict = signing.verify(store, image, _pub())
    assert not verdict.ok and "an unreadable Sigstore bundle" in verdict.reason, verdict.reason


# --- what tunefleet signs --------------------------------------------------------------------


@pytest.mark.parametrize("referrers_api", [False, True], ids=["tag-fallback", "referrers-api"])
def test_signing_publishes_both_formats_and_each_alone_verifies(referrers_api: bool) -> None:
    reg = MemoryRegistry(referrers_api)
    image = _image(reg)
    store = reg.store()
    legacy = signing.sign(store, image, _key())
    assert reg.tags[signing.signature_tag(image)] == legacy
    (bundle,) = store.referrers(image, sigbundle.BUNDLE_MEDIA_TYPE)
    # The index is the fallback's alone: where the registry lists referrers, no tag is written.
    assert (oci.referrers_tag(image) in reg.tags) is not referrers_api
    referrer = json.loads(reg.manifests[bundle["digest"]][0])
    assert referrer["subject"] == store.descriptor(image)
    assert referrer["annotations"][sigbundle.CONTENT_ANNOTATION] == "dsse-envelope"
    # The legacy .sig gone, the bundle verifies; the bundle gone, the .sig does.
    sig_manifest = reg.manifests.pop(legacy)
    assert signing.verify(store, image, _pub()).ok
    reg.manifests[legacy] = sig_manifest
    reg.manifests.pop(bundle["digest"])
    assert signing.verify(store, image, _pub()).ok


def test_tunefleets_bundle_is_cosigns_shape_signed_by_the_profiles_key() -> None:
    mine = json.loads(sigbundle.make("sha256:" + "ab" * 32, _key()))
    cosigns = json.loads((COSIGNED / "bundle.json").read_bytes())
    assert mine["mediaType"] == cosigns["mediaType"] == sigbundle.BUNDLE_MEDIA_TYPE
    assert mine["verificationMaterial"] == cosigns["verificationMaterial"]  # the key's hint
    assert (
        _envelope(json.dumps(mine).encode()).keys()
        == _envelope(json.dumps(cosigns).encode()).keys()
    )
    assert sigbundle.check_bundle(json.dumps(mine).encode(), "sha256:" + "ab" * 32, _pub()) == ""


def test_signing_keeps_other_referrers_and_adds_no_second_bundle_of_its_own() -> None:
    reg = MemoryRegistry()
    image = _image(reg)
    store = reg.store()
    theirs = ec.generate_private_key(ec.SECP256R1())
    signing.sign(store, image, theirs)
    sbom = {**sigbundle.referrer(store, store.descriptor(image), b"{}"), "artifactType": "x/sbom"}
    store.push_referrer(sbom)
    signing.sign(store, image, _key())
    signing.sign(store, image, _key())  # again: its bundle is there already
    index = json.loads(reg.manifests[reg.tags[oci.referrers_tag(image)]][0])
    kinds = sorted(str(m["artifactType"]) for m in index["manifests"])
    assert kinds == [sigbundle.BUNDLE_MEDIA_TYPE] * 2 + ["x/sbom"]
    assert signing.verify(store, image, theirs.public_key()).ok
    assert signing.verify(store, image, _pub()).ok


def test_fetch_serves_a_bundle_signed_in_the_new_format_only(tmp_path: Path) -> None:
    reg = MemoryRegistry()
    image = _image(reg)
    pem = (DATA / "cosign.pub").read_bytes()
    with pytest.raises(FetchError, match=r"is not signed .*no Sigstore bundle among its referrers"):
        serving_store(reg.store(), Signature(image, key_pem=pem, required=True))
    key = _key()
    sigbundle.attach(reg.store(), image, sigbundle.make(image, key), key.public_key())
    view = serving_store(reg.store(), Signature(image, key_pem=pem, required=True))
    assert isinstance(view, ocibundle.BundleView)
    assert view.get("ml/llm/M/abc/results.csv", 1000).startswith(b"Validator")


def test_gc_deletes_an_images_bundles_and_their_index_with_it() -> None:
    reg = MemoryRegistry()
    base = "ml/llm/M/" + "a" * 64
    image = _image(reg)
    reg.tags[oci.bundle_tag(base)] = image
    store = reg.store()
    signing.sign(store, image, _key())
    store.delete(f"{base}/manifest.json")
    assert image not in reg.manifests
    assert not any("subject" in json.loads(body) for body, _ in reg.manifests.values())
    assert not any(t.startswith("sha256-") for t in reg.tags)


def test_the_operator_knows_a_bundle_by_the_manifest_it_holds_before_it_signs_it() -> None:
    reg = MemoryRegistry()
    store = reg.store()
    manifest = b'{"schema": "tunefleet.io/manifest/v1"}\n'
    layer = {
        "mediaType": ocibundle.MANIFEST_LAYER,
        "digest": store.push_blob(manifest),
        "size": len(manifest),
    }
    bundle = store.push_manifest(store._artifact(ocibundle.ARTIFACT_TYPE, [layer], {}), "b-y")
    assert ocibundle.names_manifest(store, bundle, manifest) == ""
    said = ocibundle.names_manifest(store, bundle, manifest + b" ")
    assert "is a bundle of another manifest" in said
    other = _image(reg)  # a bundle with no manifest layer at all
    assert "another manifest" in ocibundle.names_manifest(store, other, manifest)
    missing = "sha256:" + "0" * 64
    assert "no such image" in ocibundle.names_manifest(store, missing, manifest)
