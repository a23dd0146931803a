"""What a tuning Job's pod may do in its oci:// store through the operator's registry proxy
(signer/registry_route.py): pure.

A registry has no presigned URLs, so the proxy sees each request of the distribution API and
forwards only these, to the profile's own repository (the caller is vouched for as for the
store broker: signer/store_rules.STORE):

| request                                   | allowed                                        |
| ----------------------------------------- | ---------------------------------------------- |
| GET/HEAD a manifest, a blob; tags; referrers | any in the repository (its unit of reading) |
| blob uploads (POST, PATCH, PUT, GET)      | yes, never a mount from another repository     |
| PUT a manifest by digest                  | yes (content-addressed: it replaces nothing);  |
|                                           | one with a subject only on the Job's own image |
| PUT `k-<hash of key>`                     | the store rules' create or put of that key     |
| PUT `b-`/`v-<hash of base>`               | a bundle or volume image of the Job's own      |
|                                           | artifact, `<own>/<sha256>`: create only        |
| PUT `sha256-<hex>[.sig]`                  | signatures of the Job's own images             |
| DELETE, any other tag, the catalog        | never                                          |

A create is forwarded only where the tag is absent or already this very manifest (the proxy
looks first: a registry has no conditional write, so two writers racing inside that look can
still both write; a tuning pod can only race its own content there). Whose an image is, is
decided from the registry: the subject's bundle or volume tag of the Job's own base must name
it (own_image_tags).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tunefleet.artifacts.ocibundle import ARTIFACT_TYPE, VOLUME_ARTIFACT_TYPE
from tunefleet.runtime.pod_tokens import Denied
from tunefleet.signer.store_rules import Scope, allowed
from tunefleet.storage.oci import (
    KEY_ANNOTATION,
    TITLE_ANNOTATION,
    bundle_tag,
    digest_of,
    tag_of,
    volume_tag,
)

_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_SIGNATURE_TAG_RE = re.compile(r"^sha256-([0-9a-f]{64})(\.sig)?$")
_UPLOAD_RE = re.compile(r"^blobs/uploads/[A-Za-z0-9._=-]{1,256}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")  # the distribution spec's tag
READS = ("GET", "HEAD")


@dataclass(frozen=True)
class Step:
    """One allowed request: what it touches (`kind`: blob, upload, manifest, tags,
    referrers) and, for a manifest, its reference."""

    kind: str
    reference: str = ""


@dataclass(frozen=True)
class Write:
    """A manifest PUT allowed by its body: `create` only where the tag holds nothing else;
    `subject`: an image that must be one of the Job's own (checked against the registry)."""

    create: bool = False
    subject: str = ""


def _refuse(what: str) -> Denied:
    return Denied(403, "forbidden", what)


def step(method: str, tail: str, query: dict[str, str], repository: str) -> Step:
    """The request `method /v2/<tail>?<query>` as one of the allowed steps, or Denied."""
    if not tail.startswith(repository + "/"):
        raise _refuse(f"this Job reaches its profile's repository {repository} only")
    rest = tail[len(repository) + 1 :]
    if rest in ("blobs/uploads/", "blobs/uploads") and method == "POST":
        if "mount" in query or "from" in query:
            raise _refuse("a blob is uploaded, never mounted from another repository")
        return Step("upload")
    if _UPLOAD_RE.match(rest) and method in ("GET", "PATCH", "PUT"):
        return Step("upload")
    if rest.startswith("blobs/") and _DIGEST_RE.match(rest[6:]) and method in READS:
        return Step("blob")
    if rest.startswith("manifests/") and method in (*READS, "PUT"):
        reference = rest[len("manifests/") :]
        if _DIGEST_RE.match(reference) or _TAG_RE.match(reference):
            return Step("manifest", reference)
    if rest == "tags/list" and method == "GET":
        return Step("tags")
    if rest.startswith("referrers/") and _DIGEST_RE.match(rest[10:]) and method == "GET":
        return Step("referrers")
    raise _refuse(
        f"{method} {rest} is not a request a tuning pod makes: it reads its repository, uploads "
        "blobs and pushes its own artifact's manifests, and deletes nothing"
    )


def manifest_doc(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise Denied(400, "bad_request", "the manifest is not a JSON object")
    return doc


def _annotations(doc: Any) -> dict[str, Any]:
    found = doc.get("annotations") if isinstance(doc, dict) else None
    return found if isinstance(found, dict) else {}


def _bundle_base(doc: dict[str, Any], scope: Scope) -> str | None:
    """`<own>/<sha256>` when every layer of a bundle is an object of that one artifact."""
    layers = doc.get("layers")
    if doc.get("artifactType") != ARTIFACT_TYPE or not isinstance(layers, list) or not layers:
        return None
    bases = set()
    for layer in layers:
        key = _annotations(layer).get(KEY_ANNOTATION)
        if not isinstance(key, str) or not key.startswith(scope.own + "/"):
            return None
        sha, _, name = key[len(scope.own) + 1 :].partition("/")
        if not _SHA_RE.match(sha) or not name:
            return None
        bases.add(f"{scope.own}/{sha}")
    return bases.pop() if len(bases) == 1 else None


def _volume_base(doc: dict[str, Any], scope: Scope) -> str | None:
    title = _annotations(doc).get(TITLE_ANNOTATION)
    if doc.get("artifactType") != VOLUME_ARTIFACT_TYPE or not isinstance(title, str):
        return None
    return f"{scope.own}/{title}" if _SHA_RE.match(title) else None


def own_image_tags(doc: dict[str, Any], scope: Scope) -> tuple[str, ...]:
    """The tags at which `doc` (a subject's manifest) would be one of the Job's own images:
    its bundle's or volume image's; () when it is neither."""
    base = _bundle_base(doc, scope)
    if base is not None:
        return (bundle_tag(base),)
    base = _volume_base(doc, scope)
    return (volume_tag(base),) if base is not None else ()


def _subject(doc: dict[str, Any]) -> str:
    subject = doc.get("subject")
    digest = subject.get("digest") if isinstance(subject, dict) else None
    if subject is not None and not (isinstance(digest, str) and _DIGEST_RE.match(digest)):
        raise Denied(400, "bad_request", "the manifest's subject names no digest")
    return str(digest or "")


def manifest_write(reference: str, body: bytes, scope: Scope) -> Write:
    """Whether the Job may PUT `body` at `reference` (a tag or its digest), and how; Denied
    naming what it may push otherwise."""
    doc = manifest_doc(body)
    if _DIGEST_RE.match(reference):
        if reference != digest_of(body):
            raise Denied(400, "bad_request", f"the manifest is not {reference}")
        return Write(subject=_subject(doc))
    signature = _SIGNATURE_TAG_RE.match(reference)
    if signature:
        return Write(subject=f"sha256:{signature.group(1)}")
    if reference.startswith("k-"):
        key = _annotations(doc).get(KEY_ANNOTATION)
        if not isinstance(key, str) or tag_of(key) != reference:
            raise _refuse(f"{reference} is not the tag of the key its manifest names")
        try:
            allowed("put", key, scope)
            return Write()
        except Denied:
            allowed("create", key, scope)
            return Write(create=True)
    if reference.startswith(("b-", "v-")):
        base = (_bundle_base if reference[0] == "b" else _volume_base)(doc, scope)
        tag = (bundle_tag if reference[0] == "b" else volume_tag)(base) if base else ""
        if tag == reference:
            return Write(create=True)
    raise _refuse(
        f"this Job may not push the tag {reference}: it pushes its objects' tags (as the store "
        f"rules allow their keys), the bundle and volume image of an artifact under "
        f"{scope.own}/<sha256>, and signatures of those images"
    )
