"""Which store keys a tuning Job's pod may touch through the broker, and how: pure.

The Job is vouched for as for a signature (signer/judge.the_job: its very pod, a Job the
operator made for the profile, the store token held only by tunefleet's sync and publish
steps). What it may then do is decided from the Job, never from the request:

| op     | keys                                                                   |
| ------ | ---------------------------------------------------------------------- |
| get    | its profile and model's folder, and its library (scope's)              |
| list   | the same                                                               |
| create | `<own>/<sha256>/...` (an artifact's objects), its library's entries     |
| put    | its revision's checkpoints and shard outputs, `<own>/<sha256>/` signature |
|        | and attestation files                                                  |

`<own>` is `<prefix>/<namespace>/<profile>/<gpu-model>`. A create is written only where
nothing is (If-None-Match and the body's SHA-256 are signed into the URL), so a pod can add
objects, never change one: no artifact, entry or other profile's object is reachable. A put
replaces; the signature files it may replace are checked by every reader against the
profile's key, so a bad one makes the profile's own artifact unverifiable, never a forged one
verified.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tunefleet.artifacts.library import CHECKPOINTS_DIR, LIBRARY_DIR, SHARDS_DIR
from tunefleet.contracts import store_broker as sb
from tunefleet.contracts.sign_request import ATTESTATION_SUFFIX
from tunefleet.runtime.pod_tokens import Denied
from tunefleet.signer.judge import TokenRule, Vouched
from tunefleet.storage.store import Location

STORE = TokenRule(
    what="store",
    volume=sb.TOKEN_VOLUME,
    audience=sb.AUDIENCE,
    steps={"sync": "tunefleet-sync", "publish": "tunefleet-publish"},
    most=2,
    roles={"tune": frozenset({"sync", "publish"})},
)
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
SIGNATURE_FILES = ("manifest.json.sig", f"manifest.json{ATTESTATION_SUFFIX}")


@dataclass(frozen=True)
class Scope:
    """The key folders of one Job (each without a trailing "/")."""

    own: str
    library: str
    revision: str


def scope_of(v: Vouched, namespace: str, location: Location, library_scope: str) -> Scope:
    own = location.key(namespace, v.name, v.model)
    if library_scope == "cluster":
        library = location.key(LIBRARY_DIR, v.model)
    else:
        library = location.key(namespace, LIBRARY_DIR, v.model)
    return Scope(own, library, v.revision)


def _under(key: str, folder: str) -> str | None:
    """The rest of `key` below `folder`, or None when it is not below it."""
    return key[len(folder) + 1 :] if key.startswith(folder + "/") else None


def _artifact_object(rest: str | None) -> tuple[str, str] | None:
    """(sha256, name) of a key below `<own>/<sha256>/`, or None."""
    if rest is None:
        return None
    sha, _, name = rest.partition("/")
    return (sha, name) if _SHA_RE.match(sha) and name else None


def allowed(op: str, key: str, scope: Scope) -> None:
    """Nothing when the Job may do `op` on `key` (a full key, as the store names it); Denied
    naming what it may do otherwise."""
    own, library = _under(key, scope.own), _under(key, scope.library)
    if op in ("get", "list"):
        if own is not None or library is not None or key in (scope.own, scope.library):
            return
    elif op == "create":
        if library is not None or _artifact_object(own) is not None:
            return
    elif op == "put":
        scratch = (f"{CHECKPOINTS_DIR}/{scope.revision}/", f"{SHARDS_DIR}/{scope.revision}/")
        artifact = _artifact_object(own)
        if own is not None and own.startswith(scratch):
            return
        if artifact is not None and artifact[1] in SIGNATURE_FILES:
            return
    raise Denied(
        403,
        "forbidden",
        f"this Job may not {op} {key}: it reads {scope.own}/ and {scope.library}/, adds "
        f"objects under {scope.own}/<sha256>/ and {scope.library}/, and replaces only its "
        f"revision {scope.revision}'s checkpoints and shard outputs and its signature files",
    )
