"""The store broker: how a tuning pod's tunefleet steps (sync, publish) reach an s3:// store
with no credential of their own. For each object operation they ask the operator for a URL
presigned for exactly that operation on exactly that key; the operator decides which keys the
Job may touch and how (signer/store_rules.py), and presigns with the chart's publish identity
(signing.storeCredentialsSecret, in its own namespace). No pod that runs user code holds a
credential of the store.

Written by the pods' brokered store (artifacts/brokered.py, tunefleet's image), read by the
operator's route (signer/store_route.py, every replica).

The request: ``POST https://<operator>/store/v1/presign`` with ``Authorization: Bearer
<token>`` (a projected ServiceAccount token of AUDIENCE, mounted by the sync and publish
steps only) and a JSON body:

    {"version": 1, "op": "get" | "create" | "put" | "list", "key": "<full key>",
     "contentType": "...", "checksumSha256": "<base64>", "limit": N, "after": "<key>"}

- ``get``: a presigned GET of the object;
- ``create``: a presigned PUT that writes only where nothing is: ``If-None-Match: *``,
  the content type and the body's SHA-256 are in the signature, so the URL writes that body
  there once and replaces nothing;
- ``put``: a presigned PUT that replaces (the Job's scratch keys and its signature files),
  of that body (its SHA-256 signed in);
- ``list``: no URL: the operator lists ``key + "/"`` itself, at most ``limit`` (LIST_CAP)
  keys, in key order, those after ``after`` when it names one (the next page).

The reply (200): ``{"url": "...", "headers": {...}}`` (send exactly these headers), or
``{"listed": [{"key", "size", "modified"}...], "capped": bool}`` (capped: more follow the
last). Any other status:
``{"message": "..."}``, what to fix; 429 and 503 carry ``Retry-After``.

oci:// stores (a registry has no presigned URLs): the same token, and the distribution API
itself under REGISTRY_PATH on the operator, which forwards each request it allows to the
profile's registry with its own push identity (the chart's signing.registryCredentialsSecret;
signer/registry_route.py, its rules signer/registry_rules.py). The pod's side is the plain
registry client pointed there (storage/oci.Via); a refusal is the distribution spec's error
body, ``{"errors": [{"code": "DENIED", "message": "..."}]}``.
Standard library only.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any

# The endpoint's requests share their body errors and reader (a body that is not one of this
# version: the message says what to fix).
from tunefleet.contracts.sign_request import BodyError as BodyError
from tunefleet.contracts.sign_request import json_object

VERSION = 1
PATH = "/store/v1/presign"
REGISTRY_PATH = "/v2/"  # oci:// stores: the distribution API, proxied
# Its own audience, apart from signing's: the store token is held by sync and publish, the
# signing token by publish alone, and neither is good for the API server.
AUDIENCE = "tunefleet.io/store"
TOKEN_VOLUME = "tunefleet-store-token"
TOKEN_DIR = "/var/run/secrets/tunefleet.io/store"
TOKEN_FILE = "token"
OPS = ("get", "create", "put", "list")
MAX_BODY_BYTES = 8 << 10
MAX_REPLY_BYTES = 1 << 20
LIST_CAP = 1000  # objects one list answers with; a larger one says `capped`
URL_SECONDS = 900  # a presigned URL's lifetime: one operation, retried a few times
_KEY_RE = re.compile(r"^[A-Za-z0-9._=/-]{1,1024}$")
_CHECKSUM_RE = re.compile(r"^[A-Za-z0-9+/]{43}=$")


def check_key(key: str) -> str:
    """A key the broker talks of: store-safe characters, no empty, "." or ".." segment."""
    if not _KEY_RE.match(key) or any(s in ("", ".", "..") for s in key.split("/")):
        raise BodyError(f"{key[:200]!r} is not a store key tunefleet writes")
    return key


@dataclass(frozen=True)
class Request:
    op: str
    key: str
    content_type: str = ""
    checksum_sha256: str = ""  # base64 of the body's SHA-256 (create, put: required)
    limit: int = LIST_CAP
    after: str = ""  # list: the last key of the page before

    def encode(self) -> bytes:
        doc = {
            "version": VERSION, "op": self.op, "key": self.key, "contentType": self.content_type,
            "checksumSha256": self.checksum_sha256, "limit": self.limit, "after": self.after,
        }  # fmt: skip
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, body: bytes) -> Request:
        doc = json_object(body, MAX_BODY_BYTES)
        if doc.get("version") != VERSION:
            raise BodyError(f"version must be {VERSION} (got {doc.get('version')!r})")
        op, key = doc.get("op"), doc.get("key")
        if op not in OPS:
            raise BodyError(f"op must be one of {', '.join(OPS)} (got {op!r})")
        if not isinstance(key, str):
            raise BodyError("key must be a string")
        ctype, checksum = doc.get("contentType", ""), doc.get("checksumSha256", "")
        limit = doc.get("limit", LIST_CAP)
        if not isinstance(ctype, str) or len(ctype) > 200 or not ctype.isprintable():
            raise BodyError("contentType must be a short printable string")
        if not isinstance(checksum, str) or (checksum and not _CHECKSUM_RE.match(checksum)):
            raise BodyError("checksumSha256 must be the base64 of a SHA-256")
        if op in ("create", "put") and not checksum:
            raise BodyError(f"a {op} names its body's checksumSha256")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= LIST_CAP:
            raise BodyError(f"limit must be an integer from 1 to {LIST_CAP}")
        after = doc.get("after", "")
        if not isinstance(after, str) or (after and not after.startswith(key + "/")):
            raise BodyError("after must be a key under the listed one")
        return cls(
            str(op), check_key(key), ctype, checksum, limit, check_key(after) if after else ""
        )


def checksum_of(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


@dataclass(frozen=True)
class Listed:
    key: str
    size: int
    modified: float


@dataclass(frozen=True)
class Reply:
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    listed: tuple[Listed, ...] | None = None
    capped: bool = False
    message: str = ""
    retry_after: float | None = None

    def encode(self) -> bytes:
        doc: dict[str, Any] = {}
        if self.url:
            doc["url"], doc["headers"] = self.url, dict(self.headers)
        if self.listed is not None:
            doc["listed"] = [
                {"key": o.key, "size": o.size, "modified": o.modified} for o in self.listed
            ]
            doc["capped"] = self.capped
        if self.message:
            doc["message"] = self.message[:2000]
        if self.retry_after is not None:
            doc["retryAfter"] = self.retry_after
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, body: bytes) -> Reply:
        doc = json_object(body, MAX_REPLY_BYTES)
        url, headers, raw = doc.get("url", ""), doc.get("headers") or {}, doc.get("listed")
        if not isinstance(url, str) or not isinstance(headers, dict):
            raise BodyError("url must be a string and headers an object")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise BodyError("headers are strings")
        listed = None
        if raw is not None:
            try:
                listed = tuple(
                    Listed(str(o["key"]), int(o["size"]), float(o["modified"])) for o in raw
                )
            except (TypeError, KeyError, ValueError):
                raise BodyError("listed holds {key, size, modified} objects") from None
        message = doc.get("message", "")
        retry = doc.get("retryAfter")
        return cls(
            url=url,
            headers=headers,
            listed=listed,
            capped=bool(doc.get("capped")),
            message=message if isinstance(message, str) else "",
            retry_after=float(retry) if isinstance(retry, int | float) else None,
        )


def presigns_for(named: str | None, default: str) -> bool:
    """Whether the broker presigns for a profile that names the S3 endpoint `named` (None or
    "": the operator's): only for the operator's own, `default`, which its publish identity is
    for; it never signs a request for a host a profile chose."""
    return (named or default) == default
