"""The signing request: what a tuning Job's publish step (or the merge Job) sends the operator
to have an artifact's stored manifest signed, and the reply.

Written by publish (artifacts/publish.py's RemoteSigner, in tunefleet's image, in the tuning
pod), read by the operator's signing endpoint (signer/route.py, every replica). The private
key stays in the operator's namespace (the chart's signing.secret): no pod that runs user code
holds it.

The request: ``POST https://<operator>/sign/v1/manifest`` with ``Authorization: Bearer
<token>``, a projected ServiceAccount token of the publishing pod for AUDIENCE only (the API
server accepts no token of it; only the publish or merge container mounts it), and a JSON body:

    {"version": 1, "manifest": "<base64 of manifest.json as the store holds it>"}

The operator signs only what it can vouch for: it reads the caller's pod and that pod's Job
from the API server, never from the body, and checks that the manifest is for that Job's
profile, GPU model and revision, and that its identity document is the one the operator computes
for them (signer/judge.py).

The reply (200): ``{"signature": "...", "attestation": {...}}``:
- ``signature``: the manifest's bytes signed as `cosign sign-blob --key` writes it
  (artifacts/signing.sign_blob), stored as ``manifest.json.sig`` beside the manifest: every
  reader verifies it as before.
- ``attestation``: a DSSE envelope (ATTESTATION_TYPE) of what the operator knows: cluster,
  profile and its uid, GPU model, Job and its uid, revision, the manifest's SHA-256, the
  identity document's SHA-256 and the time; stored as ``manifest.json.att``.

Any other status: ``{"message": "..."}``, what to fix; 429 and 503 carry ``Retry-After``.
Standard library only: the publish step imports it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

VERSION = 1
PATH = "/sign/v1/manifest"
# The audience of the publish step's projected token: the API server accepts no token of this
# audience, so it is good for nothing but asking this operator for a signature.
AUDIENCE = "tunefleet.io/sign"
# The projected token's volume in the tuning pod and the merge pod; only the publish (merge)
# container mounts it, and the operator refuses a pod where any other container does.
TOKEN_VOLUME = "tunefleet-sign-token"
TOKEN_DIR = "/var/run/secrets/tunefleet.io/sign"
TOKEN_FILE = "token"
# A manifest is at most 1 MiB (artifacts/publish.py reads it so); base64 and JSON around it.
MAX_MANIFEST_BYTES = 1 << 20
MAX_BODY_BYTES = MAX_MANIFEST_BYTES * 4 // 3 + 4096
MAX_REPLY_BYTES = 64 << 10
ATTESTATION_TYPE = "application/vnd.tunefleet.attestation.v1+json"
ATTESTATION_SUFFIX = ".att"
MAX_OCI_DIGESTS = 2  # an artifact's bundle and its volume image
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


class BodyError(ValueError):
    """The body is not a request (or reply) of this version; the message says what to fix."""


@dataclass(frozen=True)
class Request:
    manifest: bytes
    # oci:// stores: the images to sign, the artifact's bundle and volume image, by digest.
    oci_digests: tuple[str, ...] = ()

    def encode(self) -> bytes:
        if len(self.manifest) > MAX_MANIFEST_BYTES:
            raise BodyError(f"a manifest is at most {MAX_MANIFEST_BYTES} bytes")
        doc: dict[str, Any] = {
            "version": VERSION,
            "manifest": base64.b64encode(self.manifest).decode(),
        }
        if self.oci_digests:
            doc["ociDigests"] = list(self.oci_digests)
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, body: bytes) -> Request:
        doc = json_object(body, MAX_BODY_BYTES)
        if doc.get("version") != VERSION:
            raise BodyError(f"version must be {VERSION} (got {doc.get('version')!r})")
        raw = doc.get("manifest")
        if not isinstance(raw, str):
            raise BodyError("manifest must be the base64 of manifest.json")
        try:
            manifest = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise BodyError("manifest is not valid base64") from None
        if len(manifest) > MAX_MANIFEST_BYTES:
            raise BodyError(f"a manifest is at most {MAX_MANIFEST_BYTES} bytes")
        digests = doc.get("ociDigests", [])
        if (
            not isinstance(digests, list)
            or len(digests) > MAX_OCI_DIGESTS
            or not all(isinstance(d, str) and _DIGEST_RE.match(d) for d in digests)
        ):
            raise BodyError(f"ociDigests is a list of at most {MAX_OCI_DIGESTS} sha256: digests")
        return cls(manifest, tuple(digests))


@dataclass(frozen=True)
class Attestation:
    """What the operator vouches for when it signs a manifest: read from the API server (the
    caller's pod, its Job, the profile) and from its own configuration, never from the body.
    In JSON, the fields are camelCase (JSON_NAMES)."""

    cluster: str
    namespace: str
    profile: str
    profile_uid: str
    gpu_model: str
    job: str
    job_uid: str
    revision: str
    manifest_sha256: str
    identity_sha256: str  # "" where the manifest carries no identity document
    signed_at: str  # RFC 3339, UTC

    def to_json(self) -> bytes:
        doc = {JSON_NAMES[k]: v for k, v in asdict(self).items()}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Attestation:
        doc = json_object(data, MAX_REPLY_BYTES)
        names = {v: k for k, v in JSON_NAMES.items()}
        if set(doc) != set(names) or not all(isinstance(v, str) for v in doc.values()):
            raise BodyError(f"an attestation has exactly the string fields {sorted(names)}")
        return cls(**{names[k]: v for k, v in doc.items()})


JSON_NAMES = {
    name: name.split("_")[0] + "".join(p.capitalize() for p in name.split("_")[1:])
    for name in Attestation.__dataclass_fields__
}


def identity_sha256(identity: dict[str, Any] | None) -> str:
    """The identity document's SHA-256 over its canonical JSON; "" for none."""
    if identity is None:
        return ""
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: the bytes a DSSE signature is over."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def envelope(payload: bytes, signature: bytes) -> dict[str, Any]:
    """A DSSE envelope of an attestation; `signature` is the base64 (sign_blob's form)."""
    return {
        "payloadType": ATTESTATION_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"sig": signature.decode().strip()}],
    }


def open_envelope(doc: Any) -> tuple[bytes, bytes]:
    """(the PAE bytes the signature is over, the signature in sign_blob's form) of an
    envelope; BodyError when it is not one of ATTESTATION_TYPE with one signature."""
    if not isinstance(doc, dict) or doc.get("payloadType") != ATTESTATION_TYPE:
        raise BodyError(f"not a DSSE envelope of {ATTESTATION_TYPE}")
    sigs = doc.get("signatures")
    if not isinstance(sigs, list) or len(sigs) != 1 or not isinstance(sigs[0], dict):
        raise BodyError("an attestation carries exactly one signature")
    sig, raw = sigs[0].get("sig"), doc.get("payload")
    if not isinstance(sig, str) or not isinstance(raw, str):
        raise BodyError("an attestation's payload and signature are base64 strings")
    try:
        payload = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise BodyError("an attestation's payload is not valid base64") from None
    return pae(ATTESTATION_TYPE, payload), sig.encode()


def payload_of(doc: Any) -> Attestation:
    """The attestation an envelope carries (its signature not checked here)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("payload"), str):
        raise BodyError("not a DSSE envelope")
    try:
        return Attestation.from_json(base64.b64decode(doc["payload"], validate=True))
    except (binascii.Error, ValueError) as e:
        raise BodyError(f"an attestation's payload is not one: {e}") from None


@dataclass(frozen=True)
class OciSigned:
    """One image's signatures (artifacts/signing.OciSignatures' fields, in base64)."""

    digest: str
    legacy: bytes
    bundle: bytes


@dataclass(frozen=True)
class Reply:
    signature: bytes = b""  # sign_blob's form
    attestation: dict[str, Any] | None = None  # the DSSE envelope
    message: str = ""
    retry_after: float | None = None
    oci: tuple[OciSigned, ...] = ()

    def encode(self) -> bytes:
        doc: dict[str, Any] = {}
        if self.signature:
            doc["signature"] = self.signature.decode()
        if self.attestation is not None:
            doc["attestation"] = self.attestation
        if self.message:
            doc["message"] = self.message[:2000]
        if self.retry_after is not None:
            doc["retryAfter"] = self.retry_after
        if self.oci:
            doc["oci"] = [
                {
                    "digest": o.digest,
                    "legacy": base64.b64encode(o.legacy).decode(),
                    "bundle": base64.b64encode(o.bundle).decode(),
                }
                for o in self.oci
            ]
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, body: bytes) -> Reply:
        doc = json_object(body, MAX_REPLY_BYTES)
        reply = cls._decode(doc)
        raw = doc.get("oci", [])
        try:
            oci = tuple(
                OciSigned(
                    str(o["digest"]),
                    base64.b64decode(o["legacy"], validate=True),
                    base64.b64decode(o["bundle"], validate=True),
                )
                for o in raw
            )
        except (TypeError, KeyError, binascii.Error, ValueError):
            raise BodyError("oci holds {digest, legacy, bundle} objects, in base64") from None
        return replace(reply, oci=oci)

    @classmethod
    def _decode(cls, doc: dict[str, Any]) -> Reply:
        sig, att = doc.get("signature", ""), doc.get("attestation")
        message, retry = doc.get("message", ""), doc.get("retryAfter")
        if not isinstance(sig, str) or not isinstance(message, str):
            raise BodyError("signature and message are strings")
        if att is not None and not isinstance(att, dict):
            raise BodyError("attestation is a DSSE envelope")
        if retry is not None and (isinstance(retry, bool) or not isinstance(retry, int | float)):
            raise BodyError("retryAfter is a number of seconds")
        return cls(sig.encode(), att, message, float(retry) if retry is not None else None)


def json_object(body: bytes, limit: int) -> dict[str, Any]:
    """A request's or reply's body as a JSON object of at most `limit` bytes; BodyError
    otherwise (contracts/store_broker.py reads its bodies with it too)."""
    if len(body) > limit:
        raise BodyError(f"a body is at most {limit} bytes (got {len(body)})")
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise BodyError(f"the body is not UTF-8 JSON: {e}") from None
    if not isinstance(doc, dict):
        raise BodyError("the body must be a JSON object")
    return doc
