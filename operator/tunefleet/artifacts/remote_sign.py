"""The publish step's side of signing by the operator (contracts/sign_request.py): the stored
manifest sent with the pod's projected token, the signature and attestation back, each checked
with the profile's public key before anything is stored. Retried while the operator says to
(429, 503, unreachable), within the step's deadline; refused (400, 401, 403) fails the step with
the operator's words."""

from __future__ import annotations

import hashlib
import http.client
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from tunefleet import pod_https
from tunefleet.artifacts import sigbundle, signing
from tunefleet.contracts.sign_request import (
    MAX_REPLY_BYTES,
    PATH,
    BodyError,
    Reply,
    Request,
    open_envelope,
    payload_of,
)


class RemoteSignError(Exception):
    pass


@dataclass(frozen=True)
class Signed:
    signature: bytes  # sign_blob's form, of the manifest
    attestation: dict[str, Any]  # the DSSE envelope
    images: tuple[signing.OciSignatures, ...] = ()  # oci:// stores: each image's, as asked


@dataclass(frozen=True)
class RemoteSigner:
    url: str
    token_file: Path
    ca_pem: str = ""
    address: str = ""
    public_key: str = ""  # the profile's (spec.storage.signing.publicKey): replies checked
    timeout_s: float = 120.0

    def sign(self, manifest: bytes, images: tuple[str, ...] = (), repository: str = "") -> Signed:
        """The manifest signed and attested; with `images` (digests in `repository`, an
        oci:// store's), each of them signed too."""
        endpoint = pod_https.Endpoint(self.url, self.ca_pem, self.address, timeout_s=20.0)
        deadline = time.monotonic() + self.timeout_s
        body, attempt, last = Request(manifest, images).encode(), 0, ""
        while True:
            try:
                token = self.token_file.read_text().strip()  # rotated by the kubelet
            except OSError as e:
                why = f"cannot read the signing token {self.token_file}: {e}"
                raise RemoteSignError(why) from None
            retry: float | None = None
            try:
                got = endpoint.post(PATH, body, token, MAX_REPLY_BYTES)
                reply = Reply.decode(got.body)
                if got.status == 200:
                    signed = self._checked(manifest, reply)
                    return self._images(signed, reply, images, repository)
                last = f"{got.status} {reply.message or got.reason}"
                if got.status not in (429, 503):
                    raise RemoteSignError(f"the operator refused to sign: {last}")
                retry = reply.retry_after
            except (OSError, http.client.HTTPException) as e:
                last = f"cannot reach {self.url}: {e}"
            except BodyError as e:
                last = f"the operator's answer does not read: {e}"
            attempt += 1
            wait = retry if retry is not None else min(30.0, 2.0**attempt) * random.uniform(0.5, 1)
            if time.monotonic() + wait > deadline:
                raise RemoteSignError(f"no signature from the operator in time: {last}")
            time.sleep(wait)

    def _checked(self, manifest: bytes, reply: Reply) -> Signed:
        if not reply.signature or reply.attestation is None:
            raise RemoteSignError("the operator's answer has no signature or attestation")
        try:
            signed_bytes, att_sig = open_envelope(reply.attestation)
            attestation = payload_of(reply.attestation)
        except BodyError as e:
            raise RemoteSignError(f"the operator's attestation does not read: {e}") from None
        if attestation.manifest_sha256 != hashlib.sha256(manifest).hexdigest():
            raise RemoteSignError("the operator attested another manifest than this one")
        if self.public_key:
            try:
                key = signing.load_public_key(self.public_key.encode())
            except signing.SigningError as e:
                raise RemoteSignError(f"spec.storage.signing.publicKey: {e}") from None
            for what, data, sig in (
                ("manifest", manifest, reply.signature),
                ("attestation", signed_bytes, att_sig),
            ):
                if not signing.verify_blob(data, sig, key).ok:
                    raise RemoteSignError(
                        f"the operator's signature of the {what} does not verify with "
                        "spec.storage.signing.publicKey: the chart's signing.secret holds "
                        "another key pair than the profile names"
                    )
        return Signed(reply.signature, reply.attestation)

    def _images(
        self, signed: Signed, reply: Reply, asked: tuple[str, ...], repository: str
    ) -> Signed:
        """The images' signatures of the reply, each checked with the profile's public key
        before anything is pushed: one per image asked for, both formats."""
        got = {o.digest: o for o in reply.oci}
        if set(got) != set(asked):
            raise RemoteSignError("the operator signed other images than those asked for")
        if not asked:
            return signed
        if not self.public_key:
            raise RemoteSignError("an image is signed only for a profile with a publicKey")
        key = signing.load_public_key(self.public_key.encode())
        out = []
        for digest in asked:
            o = got[digest]
            try:
                key.verify(o.legacy, signing.payload(repository, digest), ec.ECDSA(hashes.SHA256()))
            except InvalidSignature:
                raise RemoteSignError(
                    f"the operator's signature of {digest} does not verify with "
                    "spec.storage.signing.publicKey"
                ) from None
            why = sigbundle.check_bundle(o.bundle, digest, key)
            if why:
                raise RemoteSignError(f"the operator's Sigstore bundle of {digest}: {why}")
            out.append(signing.OciSignatures(digest, o.legacy, o.bundle))
        return replace(signed, images=tuple(out))
