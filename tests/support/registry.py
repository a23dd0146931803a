"""An OCI registry in memory, at the HTTP level: what OciStore sends through its client
(manifests, blobs, uploads, tags, the referrers API) is answered as Distribution would, so the
store's own code runs, not a stand-in for it. `referrers_api=False` is Distribution 3 (the
referrers path answers 404, and clients keep the tag schema's index); True is Zot, Harbor,
GHCR and the like (manifests with a subject are listed, and the push answers OCI-Subject)."""

from __future__ import annotations

import hashlib
import json
from typing import Any
from urllib.parse import urlparse

from tunefleet.storage import oci
from tunefleet.storage.store import Location

HOST = "registry.example.com:5000"
REPOSITORY = "team/tf"


class Answer:
    """What OciStore reads of a requests.Response."""

    def __init__(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None):
        self.status_code, self.content, self.headers = status, body, dict(headers or {})
        self.text = body.decode(errors="replace")

    def iter_content(self, size: int) -> Any:
        for i in range(0, len(self.content), size):
            yield self.content[i : i + size]

    def json(self) -> Any:
        return json.loads(self.content)

    def close(self) -> None:
        pass


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class MemoryRegistry:
    """One repository's blobs, manifests (digest -> bytes, media type) and tags."""

    def __init__(self, referrers_api: bool = False) -> None:
        self.referrers_api = referrers_api
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[bytes, str]] = {}
        self.tags: dict[str, str] = {}
        self.uploads = 0

    def store(self) -> oci.OciStore:
        """An OciStore talking to this registry (no credentials, no network)."""
        store = oci.OciStore.__new__(oci.OciStore)
        store.location = Location("oci", f"{HOST}/{REPOSITORY}", "", separator="#")
        store.host, store.repository, store.timeout_s = HOST, REPOSITORY, 5.0
        store.client = self
        return store

    def put_manifest(self, body: bytes, tag: str = "") -> str:
        digest = _digest(body)
        self.manifests[digest] = (body, json.loads(body).get("mediaType", ""))
        if tag:
            self.tags[tag] = digest
        return digest

    # -- oras's client, as OciStore calls it -------------------------------------------------

    def get_container(self, ref: str) -> str:
        return ref

    def _get_location(self, resp: Answer, container: str) -> str:
        return resp.headers["Location"]

    def do_request(
        self,
        url: str,
        method: str = "GET",
        data: Any = None,
        headers: dict[str, str] | None = None,
        json: Any = None,
        stream: bool = False,
    ) -> Answer:
        parsed = urlparse(url)
        prefix = f"/v2/{REPOSITORY}/"
        assert parsed.path.startswith(prefix), url
        kind, _, reference = parsed.path[len(prefix) :].partition("/")
        body = data.read() if hasattr(data, "read") else data
        if kind == "manifests":
            return self._manifests(method, reference, body)
        if kind == "blobs":
            return self._blobs(method, reference, parsed.query, body)
        if kind == "referrers" and self.referrers_api:
            return Answer(200, self._index(self._referrers(reference)))
        return Answer(404, b"404 page not found")

    def _manifests(self, method: str, reference: str, body: bytes | None) -> Answer:
        if method == "PUT":
            assert body is not None
            digest = self.put_manifest(body, "" if reference.startswith("sha256:") else reference)
            headers = {"Docker-Content-Digest": digest}
            if self.referrers_api and "subject" in json.loads(body):
                headers["OCI-Subject"] = json.loads(body)["subject"]["digest"]
            return Answer(201, b"", headers)
        digest = reference if reference.startswith("sha256:") else self.tags.get(reference, "")
        if digest not in self.manifests:
            return Answer(404)
        if method == "DELETE":
            del self.manifests[digest]
            self.tags = {t: d for t, d in self.tags.items() if d != digest}
            return Answer(202)
        content, media_type = self.manifests[digest]
        headers = {"Docker-Content-Digest": digest, "Content-Type": media_type}
        return Answer(200, b"" if method == "HEAD" else content, headers)

    def _blobs(self, method: str, reference: str, query: str, body: bytes | None) -> Answer:
        if reference == "uploads/" and method == "POST":
            self.uploads += 1
            location = f"https://{HOST}/v2/{REPOSITORY}/blobs/uploads/{self.uploads}"
            return Answer(202, b"", {"Location": location})
        if reference.startswith("uploads/") and method == "PUT":
            assert body is not None and query == f"digest={_digest(body)}", query
            self.blobs[_digest(body)] = body
            return Answer(201)
        if reference not in self.blobs:
            return Answer(404)
        return Answer(200, b"" if method == "HEAD" else self.blobs[reference])

    def _referrers(self, digest: str) -> list[dict[str, Any]]:
        out = []
        for d, (content, media_type) in self.manifests.items():
            doc = json.loads(content)
            if (doc.get("subject") or {}).get("digest") == digest:
                entry = {"mediaType": media_type, "digest": d, "size": len(content)}
                out.append({**entry, "artifactType": doc.get("artifactType", "")})
        return out

    @staticmethod
    def _index(manifests: list[dict[str, Any]]) -> bytes:
        doc = {"schemaVersion": 2, "mediaType": oci.INDEX_MEDIA_TYPE, "manifests": manifests}
        return json.dumps(doc).encode()
