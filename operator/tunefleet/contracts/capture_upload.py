"""The capture upload: what a model pod's capture sidecar sends the operator, and the reply.

Written by the sidecar (capture/sidecar.py, in tunefleet's image beside the user's
containers), read by the operator's capture endpoint (capture/endpoint.py, every replica).
Standard library only: the sidecar must stay small.

The request: ``POST https://<operator>/capture/v1/misses`` with ``Authorization: Bearer
<token>``, the token a projected ServiceAccount token of the pod, for AUDIENCE only (the API
server refuses it, the endpoint reviews it), and a JSON body:

    {"version": 1, "rows": ["GemmTunableOp_BFloat16_TN,tn_4096_...", ...],
     "notLoaded": 0, "dropped": 0,
     "caches": [{"kind": "vllm", "path": "recompiled", "key": "5f1c...", "reason": "..."}]}

``rows``: GEMMs TunableOp recorded as untuned (``OpSig,ParamSig``, its untuned file's rows)
that the pod's pinned artifact does not have; at most MAX_ROWS, each at most MAX_ROW_CHARS,
the body at most MAX_BODY_BYTES. ``notLoaded``: recorded GEMMs the pinned artifact *has*: the
process recorded without the results loaded (so it serves untuned). ``dropped``: rows the
sidecar could not keep (its queue was full). What the rows mean (which profile, GPU model,
software identity) is never taken from the body: the endpoint reads it from the pod as
admitted.

``caches`` (optional): which path each served cache took at the pod's start, in the stack's
own words (capture/hook.py writes them down, the sidecar judges them with
``hook.cache_verdict``): ``loaded``; ``recompiled`` (the entry for its key was there and did
not load; ``reason`` is the stack's); ``missed`` (nothing for its key: compiled from zero;
``reason`` names the key's factors that differ from the bundle's, where vLLM wrote them); or
``empty`` (the entry for its key loaded and held no compiled code: it runs eager, vllm#56879).
``key`` the stack's cache key (vLLM's hash directory). At most MAX_CACHES entries, one per kind.

The reply (any status): ``{"accepted": n, "new": n, "message": "..."}``; 429 and 503 carry
``Retry-After`` (seconds) and ``retryAfter`` in the body.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

VERSION = 1
PATH = "/capture/v1/misses"
# The audience of the projected token: the API server accepts no token of this audience, so
# the sidecar's token is good for nothing but this endpoint.
AUDIENCE = "tunefleet.io/capture"
MAX_BODY_BYTES = 256 * 1024
MAX_ROWS = 512
MAX_ROW_CHARS = 1024
# OpSig,ParamSig as TunableOp writes them: printable ASCII, no spaces, exactly one comma.
MAX_CACHES = 4
# The paths a served cache takes at a pod's start. capture/hook.py, a file copied alone into
# model pods, names them too (a unit test holds the two equal).
LOADED, RECOMPILED, MISSED, EMPTY = "loaded", "recompiled", "missed", "empty"
CACHE_PATHS = (LOADED, RECOMPILED, MISSED, EMPTY)
MAX_REASON_CHARS = 500
# Where the hook writes down vLLM's records of its compile path (a pod served a compile cache):
# the builders set CACHE_LOG_ENV in the serving containers to a file named CACHE_LOG_NAME in
# the capture directory, which the sidecar reads. capture/hook.py names them too (held equal).
CACHE_LOG_ENV = "TUNEFLEET_CACHE_LOG"
CACHE_LOG_NAME = "tunefleet-cache-log.jsonl"
_CACHE_KEY = re.compile(r"^[0-9a-f]{0,128}$")
_ROW = re.compile(r"^[A-Za-z][\x21-\x2b\x2d-\x7e]*,[A-Za-z0-9*][\x21-\x2b\x2d-\x7e]*$")


class BodyError(ValueError):
    """The body is not an upload of this version; the message says what to fix."""


def row_problem(row: Any) -> str | None:
    """Why `row` is not an untuned row this contract carries, or None."""
    if not isinstance(row, str):
        return f"a row must be a string, not {type(row).__name__}"
    if len(row) > MAX_ROW_CHARS:
        return f"a row is at most {MAX_ROW_CHARS} characters (got {len(row)})"
    if not _ROW.match(row):
        return f"not an OpSig,ParamSig row: {row[:80]!r}"
    return None


@dataclass(frozen=True)
class CacheLoad:
    """Which path one served cache took at the pod's start."""

    kind: str
    path: str  # one of CACHE_PATHS
    key: str = ""
    reason: str = ""
    # The pod's own values of the stack's key flags (tuner_job/caches.py's variants, as JSON),
    # set by the endpoint from the pod as admitted; never read from a body.
    args: str = ""

    def to_dict(self) -> dict[str, str]:
        doc = {"kind": self.kind, "path": self.path, "key": self.key, "reason": self.reason}
        if self.args:
            doc["args"] = self.args
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> CacheLoad:
        """BodyError says what is wrong."""
        if not isinstance(doc, dict):
            raise BodyError("a caches entry must be an object")
        kind, path = doc.get("kind"), doc.get("path")
        key, reason = doc.get("key", ""), doc.get("reason", "")
        if kind not in ("vllm", "torchCompile", "cache"):
            raise BodyError(f"caches[].kind must be vllm, torchCompile or cache (got {kind!r})")
        if path not in CACHE_PATHS:
            raise BodyError(f"caches[].path must be one of {', '.join(CACHE_PATHS)}")
        if not isinstance(key, str) or not _CACHE_KEY.match(key):
            raise BodyError("caches[].key must be at most 128 lowercase hex digits")
        if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
            raise BodyError(f"caches[].reason must be a string of at most {MAX_REASON_CHARS}")
        return cls(kind, path, key, reason)  # args: the endpoint's, from the pod


@dataclass(frozen=True)
class Upload:
    rows: tuple[str, ...]
    not_loaded: int = 0
    dropped: int = 0
    caches: tuple[CacheLoad, ...] = ()

    def encode(self) -> bytes:
        """The request body; raises BodyError when it would break the contract's bounds."""
        for row in self.rows:
            problem = row_problem(row)
            if problem:
                raise BodyError(problem)
        if len(self.rows) > MAX_ROWS:
            raise BodyError(f"at most {MAX_ROWS} rows per upload (got {len(self.rows)})")
        doc = {
            "version": VERSION,
            "rows": list(self.rows),
            "notLoaded": self.not_loaded,
            "dropped": self.dropped,
        }
        if self.caches:
            if len(self.caches) > MAX_CACHES:
                raise BodyError(f"at most {MAX_CACHES} caches per upload")
            doc["caches"] = [CacheLoad.from_dict(c.to_dict()).to_dict() for c in self.caches]
        body = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        if len(body) > MAX_BODY_BYTES:
            raise BodyError(f"an upload is at most {MAX_BODY_BYTES} bytes (got {len(body)})")
        return body

    @classmethod
    def decode(cls, body: bytes) -> Upload:
        if len(body) > MAX_BODY_BYTES:
            raise BodyError(f"an upload is at most {MAX_BODY_BYTES} bytes (got {len(body)})")
        try:
            doc = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise BodyError(f"the body is not UTF-8 JSON: {e}") from None
        if not isinstance(doc, dict):
            raise BodyError("the body must be a JSON object")
        if doc.get("version") != VERSION:
            raise BodyError(f"version must be {VERSION} (got {doc.get('version')!r})")
        rows = doc.get("rows")
        if not isinstance(rows, list):
            raise BodyError("rows must be a list of OpSig,ParamSig strings")
        if len(rows) > MAX_ROWS:
            raise BodyError(f"at most {MAX_ROWS} rows per upload (got {len(rows)})")
        for row in rows:
            problem = row_problem(row)
            if problem:
                raise BodyError(problem)
        counts = {}
        for key in ("notLoaded", "dropped"):
            value = doc.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
                raise BodyError(f"{key} must be a non-negative integer")
            counts[key] = value
        caches = doc.get("caches", [])
        if not isinstance(caches, list) or len(caches) > MAX_CACHES:
            raise BodyError(f"caches must be a list of at most {MAX_CACHES} entries")
        loads = tuple(CacheLoad.from_dict(c) for c in caches)
        if len({c.kind for c in loads}) != len(loads):
            raise BodyError("caches lists a kind twice")
        # Repeats are dropped here, first kept: a row counts once however often it is sent.
        return cls(tuple(dict.fromkeys(rows)), counts["notLoaded"], counts["dropped"], loads)


@dataclass(frozen=True)
class Reply:
    accepted: int = 0  # rows taken (new or already known)
    new: int = 0  # rows the store did not have
    message: str = ""
    retry_after: float | None = None

    def encode(self) -> bytes:
        doc: dict[str, Any] = {"accepted": self.accepted, "new": self.new}
        if self.message:
            doc["message"] = self.message[:1000]
        if self.retry_after is not None:
            doc["retryAfter"] = self.retry_after
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")

    @classmethod
    def decode(cls, body: bytes) -> Reply:
        try:
            doc = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return cls(message=body[:200].decode("utf-8", "replace"))
        if not isinstance(doc, dict):
            return cls()
        retry = doc.get("retryAfter")
        return cls(
            accepted=int(doc.get("accepted") or 0),
            new=int(doc.get("new") or 0),
            message=str(doc.get("message") or ""),
            retry_after=float(retry) if isinstance(retry, int | float) else None,
        )
