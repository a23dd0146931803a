"""cosign v3's signature format: a Sigstore bundle, attached to the image as an OCI referrer.
signing.py reads and writes it beside the legacy ``.sig`` tag; either one, by the profile's
key, verifies an image.

What ``cosign sign --key`` (v3.1.3, default flags) pushes, as read off a registry:

- a manifest pushed by digest, ``artifactType`` and its one layer's ``mediaType``
  ``application/vnd.dev.sigstore.bundle.v0.3+json``, the empty config, ``subject`` the signed
  image's descriptor, annotations ``dev.sigstore.bundle.content: dsse-envelope`` and
  ``dev.sigstore.bundle.predicateType: https://sigstore.dev/cosign/sign/v1``;
- found through ``GET /v2/<repo>/referrers/<digest>`` or, where the registry has no referrers
  API (Distribution 3 answers 404), through the tag schema's index tagged ``sha256-<hex>``;
- the layer is the bundle: ``verificationMaterial.publicKey.hint`` (base64 SHA-256 of the
  key's DER, a hint only) and a ``dsseEnvelope``: ``payloadType``
  ``application/vnd.in-toto+json``, the base64 ``payload`` an in-toto Statement v1 whose
  ``subject[].digest.sha256`` is the image's and ``predicateType`` the one above, and
  ``signatures[].sig`` the base64 DER ECDSA signature of the envelope's PAE (DSSE's
  pre-authentication encoding) over SHA-256. Without Rekor (``--tlog-upload=false``) the bundle
  holds no tlog entry and no timestamp; ``cosign verify --insecure-ignore-tlog=true`` accepts it.

A ``messageSignature`` bundle is what ``cosign sign-blob`` makes: it signs bytes, names no
image, and is refused here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tunefleet.contracts.sign_request import pae  # DSSE's, one definition
from tunefleet.storage.store import StoreError

if TYPE_CHECKING:
    from tunefleet.storage.oci import OciStore

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
DSSE_PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPES = ("https://in-toto.io/Statement/v1", "https://in-toto.io/Statement/v0.1")
PREDICATE_TYPE = "https://sigstore.dev/cosign/sign/v1"
CONTENT_ANNOTATION = "dev.sigstore.bundle.content"
PREDICATE_ANNOTATION = "dev.sigstore.bundle.predicateType"
# A key-signed bundle is under 1 KiB; one with a certificate chain and a Rekor entry a few.
MAX_BUNDLE = 64 << 10


def key_hint(key: ec.EllipticCurvePublicKey) -> str:
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def make(digest: str, key: ec.EllipticCurvePrivateKey) -> bytes:
    """The bundle cosign v3 writes for `digest`, signed by `key`."""
    statement = {
        "_type": STATEMENT_TYPES[0],
        "subject": [{"digest": {"sha256": digest.removeprefix("sha256:")}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {},
    }
    payload = json.dumps(statement, separators=(",", ":")).encode()
    sig = key.sign(pae(DSSE_PAYLOAD_TYPE, payload), ec.ECDSA(hashes.SHA256()))
    doc = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": key_hint(key.public_key())}},
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": DSSE_PAYLOAD_TYPE,
            "signatures": [{"sig": base64.b64encode(sig).decode()}],
        },
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def referrer(store: OciStore, subject: dict[str, Any], bundle: bytes) -> dict[str, Any]:
    """The manifest that attaches `bundle` to the image `subject` (a descriptor), as cosign's."""
    from tunefleet.storage.oci import EMPTY_DIGEST, EMPTY_MEDIA_TYPE, MANIFEST_MEDIA_TYPE

    store.push_blob(b"{}")
    layer = {"mediaType": BUNDLE_MEDIA_TYPE, "digest": store.push_blob(bundle), "size": len(bundle)}
    return {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": BUNDLE_MEDIA_TYPE,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": EMPTY_DIGEST, "size": 2},
        "layers": [layer],
        "annotations": {
            CONTENT_ANNOTATION: "dsse-envelope",
            PREDICATE_ANNOTATION: PREDICATE_TYPE,
            "org.opencontainers.image.created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "subject": subject,
    }


def attach(store: OciStore, digest: str, bundle: bytes, key: ec.EllipticCurvePublicKey) -> str:
    """Attach `bundle` (made by the private half of `key`) to the image at `digest`, unless
    one by `key` that verifies is there already (a referrer cannot be replaced, only added:
    publishing again adds none). Other signers' bundles and other referrers are left as they
    are. The referrer's digest."""
    for descriptor in store.referrers(digest, BUNDLE_MEDIA_TYPE):
        if check(store, digest, descriptor, key) == "":
            return str(descriptor["digest"])
    return store.push_referrer(referrer(store, store.descriptor(digest), bundle))


def verify(store: OciStore, digest: str, key: ec.EllipticCurvePublicKey) -> list[str]:
    """Why each bundle attached to `digest` does not verify by `key`; [""] among them when one
    does, [] when there is none."""
    reasons: list[str] = []
    for descriptor in store.referrers(digest, BUNDLE_MEDIA_TYPE):
        reasons.append(check(store, digest, descriptor, key))
        if reasons[-1] == "":
            break
    return reasons


def check(store: OciStore, digest: str, descriptor: dict[str, Any], key: Any) -> str:
    """Why the referrer at `descriptor` is no bundle by `key` of `digest`; "" when it is. The
    manifest is read by its digest, its subject must be `digest`, its one layer a bundle of
    at most MAX_BUNDLE bytes."""
    try:
        return _check_referrer(store, digest, str(descriptor["digest"]), key)
    except StoreError as exc:  # gone since listed, over its bound, not its digest
        return f"an unreadable Sigstore bundle ({exc})"


def _check_referrer(store: OciStore, digest: str, reference: str, key: Any) -> str:
    from tunefleet.storage.oci import layer_size

    found = store.manifest(reference)
    if found is None:
        return "a Sigstore bundle no longer in the registry"
    subject = found[0].get("subject")
    if not isinstance(subject, dict) or subject.get("digest") != digest:
        return "a Sigstore bundle attached to another image"
    layers = found[0].get("layers")
    if not isinstance(layers, list) or len(layers) != 1 or not isinstance(layers[0], dict):
        return "a Sigstore bundle manifest without one bundle layer"
    size = layer_size(layers[0])
    if layers[0].get("mediaType") != BUNDLE_MEDIA_TYPE or size is None:
        return "a Sigstore bundle manifest without one bundle layer"
    if size > MAX_BUNDLE:
        return f"an oversized Sigstore bundle ({size} bytes, over {MAX_BUNDLE})"
    body = store.blob(str(layers[0].get("digest", "")), size, f"the Sigstore bundle of {digest}")
    return check_bundle(body, digest, key)


def check_bundle(body: bytes, digest: str, key: ec.EllipticCurvePublicKey) -> str:
    """Why `body` is no bundle by `key` naming `digest`; "" when it is: its DSSE envelope's
    signature first, then (only of signed bytes) the statement and what it names."""
    try:
        doc = json.loads(body)
        envelope = doc.get("dsseEnvelope")
        if envelope is None and "messageSignature" in doc:
            return "a Sigstore bundle signing a blob (cosign sign-blob), not an image"
        payload_type = envelope["payloadType"]
        payload = base64.b64decode(envelope["payload"], validate=True)
        sigs = [base64.b64decode(s["sig"], validate=True) for s in envelope["signatures"]][:8]
    except (ValueError, KeyError, TypeError, AttributeError):
        return "a malformed Sigstore bundle"
    if payload_type != DSSE_PAYLOAD_TYPE:
        return f"a Sigstore bundle of {str(payload_type)[:64]!r}, not an in-toto statement"
    if not any(_verifies(key, sig, pae(payload_type, payload)) for sig in sigs):
        return "signed by another key, or altered"
    return _check_statement(payload, digest)


def _verifies(key: ec.EllipticCurvePublicKey, sig: bytes, data: bytes) -> bool:
    try:
        key.verify(sig, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


def _check_statement(payload: bytes, digest: str) -> str:
    try:
        statement = json.loads(payload)
        kind, predicate = statement["_type"], statement["predicateType"]
        named = [str(s["digest"]["sha256"]) for s in statement["subject"]]
    except (ValueError, KeyError, TypeError):
        return "a Sigstore bundle whose statement names no image"
    if kind not in STATEMENT_TYPES or predicate != PREDICATE_TYPE:
        return f"a Sigstore bundle of {str(predicate)[:80]!r}, not a cosign signature"
    if digest.removeprefix("sha256:") not in named:
        return f"a signature of another image (sha256:{named[0] if named else '?'})"
    return ""
