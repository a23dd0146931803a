"""Signatures of OCI bundles, in cosign's format, so that `cosign verify --key cosign.pub`
(and admission policies built on it: Kyverno, the policy-controller) accept what tunefleet
signed, and tunefleet accepts what cosign signed. This module owns the contract both ways.

Both of cosign's formats are read and written; either one by the profile's key verifies. The
legacy one is "simple signing": a manifest tagged ``sha256-<hex>.sig`` beside the signed one,
whose layers are payloads naming the signed manifest's digest, each with its base64 ECDSA
signature in the ``dev.cosignproject.cosign/signature`` annotation. cosign v3 signs by default
in the other, a Sigstore bundle attached to the image as an OCI referrer (sigbundle.py), and
has said it will drop the legacy one; policies built on cosign v2 read only that. Keys are
cosign's: the private key as ``cosign generate-key-pair`` writes it (scrypt + NaCl secretbox,
with its password), or a plain PEM PKCS#8 key; the public key as PEM.

Stores of objects (s3://, pvc://) have no manifests to tag: there the artifact's
``manifest.json`` is signed as ``cosign sign-blob --key`` signs a file, and the base64 ECDSA
signature of its bytes lies beside it as ``manifest.json.sig``. The manifest names the SHA-256
of the results and of every cache archive, so that one signature covers the artifact.

Only verification by key is done here. Keyless (Fulcio certificates, Rekor entries) needs the
cluster's signing service and is not built.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tunefleet.storage.store import StoreError

from . import sigbundle

# oras and requests cost fetch ~14 MiB it does not need for a blob signature (s3://, pvc://):
# imported where a registry is signed or verified.
if TYPE_CHECKING:
    from tunefleet.storage.oci import OciStore

PAYLOAD_MEDIA_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
PAYLOAD_TYPE = "cosign container image signature"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MAX_PAYLOAD = 64 << 10
# The most signatures of one image checked, per format: each is a blob read, and a manifest
# (up to 4 MiB) could list thousands.
MAX_SIGNATURES = 64

# Object stores: the signature of an artifact's manifest.json, as the object beside it.
BLOB_SIGNATURE_SUFFIX = ".sig"
MAX_BLOB_SIGNATURE = 4 << 10  # base64 of a DER ECDSA signature: ~100 bytes

# The Secret's keys, as `cosign generate-key-pair k8s://ns/name` writes them.
PRIVATE_KEY = "cosign.key"
PASSWORD = "cosign.password"
PUBLIC_KEY = "cosign.pub"
ENCRYPTED_PEM_TYPES = ("ENCRYPTED SIGSTORE PRIVATE KEY", "ENCRYPTED COSIGN PRIVATE KEY")


class SigningError(Exception):
    """A key cannot be read, or signing failed."""


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str  # what failed, said for status and `kubectl tunefleet why`; "" when ok


def signature_tag(digest: str) -> str:
    return digest.replace(":", "-", 1) + ".sig"


def payload(repository: str, digest: str) -> bytes:
    doc = {
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": digest},
            "type": PAYLOAD_TYPE,
        },
        "optional": None,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _pem_body(text: bytes) -> tuple[str, bytes]:
    lines = text.decode("ascii", "replace").strip().splitlines()
    if (
        len(lines) < 3
        or not lines[0].startswith("-----BEGIN ")
        or not lines[-1].startswith("-----END ")
    ):
        raise SigningError("the private key is not PEM")
    kind = lines[0][len("-----BEGIN ") :].rstrip("-")
    return kind, base64.b64decode("".join(lines[1:-1]))


def load_private_key(data: bytes, password: bytes) -> ec.EllipticCurvePrivateKey:
    """cosign's encrypted key (with its password) or a plain PEM EC key."""
    kind, body = _pem_body(data)
    if kind in ENCRYPTED_PEM_TYPES:
        der = _decrypt_cosign(body, password)
        key = serialization.load_der_private_key(der, None)
    else:
        try:
            key = serialization.load_pem_private_key(data, password or None)
        except (ValueError, TypeError) as exc:
            raise SigningError(f"the private key cannot be read: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise SigningError("the private key is not an ECDSA key (cosign's keys are P-256)")
    return key


def _decrypt_cosign(body: bytes, password: bytes) -> bytes:
    import nacl.exceptions
    import nacl.secret

    try:
        doc = json.loads(body)
        kdf, cipher = doc["kdf"], doc["cipher"]
        if kdf.get("name") != "scrypt" or cipher.get("name") != "nacl/secretbox":
            raise SigningError(f"unknown key encryption {kdf.get('name')}/{cipher.get('name')}")
        params = kdf["params"]
        n, r, p = int(params["N"]), int(params["r"]), int(params["p"])
        salt = base64.b64decode(kdf["salt"])
        nonce = base64.b64decode(cipher["nonce"])
        ciphertext = base64.b64decode(doc["ciphertext"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SigningError(f"the encrypted private key is malformed: {exc}") from None
    key = hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=32, maxmem=256 << 20)
    try:
        return bytes(nacl.secret.SecretBox(key).decrypt(ciphertext, nonce))
    except nacl.exceptions.CryptoError:
        raise SigningError("the private key's password is wrong (cosign.password)") from None


def load_public_key(data: bytes) -> ec.EllipticCurvePublicKey:
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise SigningError(f"the public key cannot be read: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise SigningError("the public key is not an ECDSA key")
    return key


def read_key_dir(directory: Path) -> ec.EllipticCurvePrivateKey:
    """The private key from a mounted Secret (cosign.key, cosign.password)."""
    try:
        data = (directory / PRIVATE_KEY).read_bytes()
    except OSError as exc:
        raise SigningError(f"no signing key at {directory / PRIVATE_KEY}: {exc.strerror}") from None
    password_file = directory / PASSWORD
    password = password_file.read_bytes().strip(b"\n") if password_file.is_file() else b""
    return load_private_key(data, password)


def _manifest_media_type() -> str:
    from tunefleet.storage.oci import MANIFEST_MEDIA_TYPE

    return MANIFEST_MEDIA_TYPE


@dataclass(frozen=True)
class OciSignatures:
    """One image's signatures in both of cosign's formats, made where the key is (a mounted
    key pair, or the operator: signer/route.py): the legacy one over `payload`, and the
    Sigstore bundle (sigbundle.make)."""

    digest: str
    legacy: bytes  # the DER signature of payload(repository, digest)
    bundle: bytes  # the bundle's JSON


def signatures(repository: str, digest: str, key: ec.EllipticCurvePrivateKey) -> OciSignatures:
    body = payload(repository, digest)
    return OciSignatures(
        digest, key.sign(body, ec.ECDSA(hashes.SHA256())), sigbundle.make(digest, key)
    )


def sign(store: OciStore, digest: str, key: ec.EllipticCurvePrivateKey) -> str:
    """Sign the manifest at `digest` in the store's repository in both of cosign's formats
    (cosign v2 and the policies built on it read only the legacy one, cosign v3 writes the
    bundle); the legacy signature manifest's digest."""
    return attach(store, signatures(store.location.bucket, digest, key), key.public_key())


def attach(store: OciStore, signed: OciSignatures, key: ec.EllipticCurvePublicKey) -> str:
    """Push both signatures of `signed.digest` (made by the private half of `key`): the
    legacy signature manifest's digest."""
    pushed = _attach_legacy(store, signed.digest, signed.legacy, key)
    sigbundle.attach(store, signed.digest, signed.bundle, key)
    return pushed


def _attach_legacy(
    store: OciStore, digest: str, signature: bytes, key: ec.EllipticCurvePublicKey
) -> str:
    body = payload(store.location.bucket, digest)
    payload_digest = store.push_blob(body)
    ours = {
        "mediaType": PAYLOAD_MEDIA_TYPE,
        "digest": payload_digest,
        "size": len(body),
        "annotations": {SIGNATURE_ANNOTATION: base64.b64encode(signature).decode()},
    }
    # Other signers' signatures (cosign sign, a scanner's attestation key) are kept beside ours,
    # as cosign itself appends (their payload may be the very same blob); a signature by this
    # key is replaced.
    found = store.manifest(signature_tag(digest))
    kept = [
        layer
        for layer in ((found[0].get("layers") if found else None) or [])
        if isinstance(layer, dict) and _check_layer(store, digest, layer, key) != ""
    ]
    layers = [*kept, ours]
    config = json.dumps(
        {
            "architecture": "",
            "os": "",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [str(layer["digest"]) for layer in layers]},
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    config_digest = store.push_blob(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": _manifest_media_type(),
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config)},
        "layers": layers,
    }
    return store.push_manifest(manifest, signature_tag(digest))


def verify(store: OciStore, digest: str, key: ec.EllipticCurvePublicKey) -> Verdict:
    """Whether a signature by `key` names `digest`, in either format: the legacy one read
    only by the digest's own tag, each payload checked against its digest, then its
    signature, then what it names; else the Sigstore bundles attached to it (sigbundle.check).
    The legacy tag is read first: where it verifies, the referrers are not asked for."""
    legacy = _verify_legacy(store, digest, key)
    if legacy == [""]:
        return Verdict(True, "")
    bundles = sigbundle.verify(store, digest, key)
    if "" in bundles:
        return Verdict(True, "")
    if legacy is None and not bundles:
        return Verdict(
            False,
            f"{store.location.bucket}@{digest} is not signed (no {signature_tag(digest)} "
            "in the registry, and no Sigstore bundle among its referrers)",
        )
    reasons = sorted(set((legacy or []) + bundles))
    return Verdict(
        False,
        f"{store.location.bucket}@{digest}: no valid signature by the "
        f"configured key ({'; '.join(reasons)})",
    )


def _verify_legacy(
    store: OciStore, digest: str, key: ec.EllipticCurvePublicKey
) -> list[str] | None:
    """Why each legacy signature of `digest` is not one by `key`; [""] when one is, None
    when there is no `.sig` manifest."""
    found = store.manifest(signature_tag(digest))
    if found is None:
        return None
    layers = found[0].get("layers")
    if not isinstance(layers, list) or not layers:
        return [f"the signature manifest {signature_tag(digest)} holds no signatures"]
    reasons: list[str] = []
    for layer in layers[:MAX_SIGNATURES]:
        reasons.append(_check_layer(store, digest, layer, key))
        if not reasons[-1]:
            return [""]
    return reasons


def _check_layer(store: OciStore, digest: str, layer: Any, key: ec.EllipticCurvePublicKey) -> str:
    if not isinstance(layer, dict) or layer.get("mediaType") != PAYLOAD_MEDIA_TYPE:
        return "a layer that is not a cosign payload"
    encoded = (layer.get("annotations") or {}).get(SIGNATURE_ANNOTATION, "")
    try:
        signature = base64.b64decode(encoded, validate=True)
    except (ValueError, TypeError):
        return "a malformed signature"
    if int(layer.get("size", 0)) > MAX_PAYLOAD:
        return "an oversized payload"
    try:
        body = store.blob(
            str(layer.get("digest", "")), MAX_PAYLOAD, f"the signature payload of {digest}"
        )
    except StoreError as exc:  # one unreadable signature must not hide another's verdict
        return f"an unreadable payload ({exc})"
    try:
        key.verify(signature, body, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return "signed by another key, or altered"
    try:
        named = json.loads(body)["critical"]["image"]["docker-manifest-digest"]
    except (ValueError, KeyError, TypeError):
        return "a payload that names no image"
    if named != digest:
        return f"a signature of another image ({named})"
    return ""


def sign_blob(data: bytes, key: ec.EllipticCurvePrivateKey) -> bytes:
    """The signature of `data` as `cosign sign-blob --key` writes it: base64 of the DER ECDSA
    signature over its SHA-256."""
    return base64.b64encode(key.sign(data, ec.ECDSA(hashes.SHA256())))


def verify_blob(data: bytes, signature: bytes, key: ec.EllipticCurvePublicKey) -> Verdict:
    """Whether `signature` (sign_blob's form; whitespace around it is allowed, as cosign
    writes a newline) is one of `data` by `key`."""
    try:
        raw = base64.b64decode(signature.strip(), validate=True)
    except (ValueError, TypeError):
        return Verdict(False, "its signature is not base64")
    try:
        key.verify(raw, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return Verdict(False, "its signature is by another key, or the manifest was altered")
    return Verdict(True, "")
