"""``oci://registry[:port]/repository``: an OCI registry (CNCF Distribution, Harbor, Zot, ECR,
GHCR, Quay, ...) as the artifact store, through the ORAS Python SDK (oras-py).

Every object is one OCI artifact in the repository: a manifest whose only layer is the object's
bytes, annotated with its key (``io.tunefleet.key``), and tagged ``k-<sha256 of the key>``. The
tag is an index, never a source of trust: get() reads the manifest, checks that it names the
key asked for, and checks the layer against its digest; what the operator serves is pinned by
SHA-256 in its status, so a moved tag is a refused mismatch, never served.

Bundles (push_bundle) are what a cluster pulls and verifies: one image manifest per artifact
whose layers are the artifact's stored objects (manifest, payload, cache archives), referenced
by digest and signed (signing.py). The registry's own limits apply: no conditional writes (two
writers of different bytes under one key race, last wins; content-addressed keys make the bytes
the same), deletes need ``storage.delete.enabled`` on Distribution, and blobs are reclaimed by
the registry's garbage collection.

Fleet claims (store.Board) are notes: each member's under its own tag,
``n-<group hash>-<member hash>``, so a group's notes are one tag listing (from the prefix on)
away; fleet/bids.py makes claims of them without a conditional write.

Credentials come the way clusters give them: a docker config (a ``kubernetes.io/dockerconfigjson``
Secret, mounted as a directory holding ``.dockerconfigjson`` and optionally ``ca.crt``, the CA
that signed the registry's certificate), or $DOCKER_CONFIG / ~/.docker/config.json.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import ParseResult, urlsplit

import oras.provider
import requests
import requests.adapters

from tuner_job.files import CHUNK, DroppingReader, file_sha256

from .store import (
    ConflictError,
    Listed,
    Location,
    NotFoundError,
    PodStorage,
    Received,
    StoreError,
    StoreOptions,
    TooLargeError,
    check_prefix,
    write_hashed,
)

log = logging.getLogger(__name__)

SCHEMES: tuple[str, ...] = ("oci",)

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_DIGEST = "sha256:" + hashlib.sha256(b"{}").hexdigest()
OBJECT_ARTIFACT_TYPE = "application/vnd.tunefleet.object.v1"
OBJECT_MEDIA_TYPE = "application/vnd.tunefleet.object.v1"
KEY_ANNOTATION = "io.tunefleet.key"
TITLE_ANNOTATION = "org.opencontainers.image.title"
CREATED_ANNOTATION = "org.opencontainers.image.created"
TAG_PREFIX = "k-"
NOTE_PREFIX = "n-"  # a board's notes (Board): n-<group hash>-<member hash>
NOTE_MEMBER_ANNOTATION = "io.tunefleet.member"

# Where a pod's tunefleet container finds the docker config Secret (its keys as files).
MOUNT_PATH = "/tunefleet/oci"
VOLUME = "tunefleet-oci"
DOCKER_CONFIG_KEY = ".dockerconfigjson"
CA_KEY = "ca.crt"
CONFIG_ENV = "TUNEFLEET_OCI_CONFIG"  # a directory, as mounted from the Secret

# The distribution spec's repository grammar; Distribution refuses names over 255 characters
# (registry host included), so a profile naming one is refused when it is admitted.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REPOSITORY_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
HOST_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?$")
MAX_NAME = 255
MAX_ATTEMPTS = 4
# The most tags one listing reads (tags()): a repository's own tags, a few per stored object,
# fit many times over; a registry whose Link loops, or one far larger than any tunefleet
# store, is cut here with an error that says so, never read forever.
MAX_TAGS = 100_000
# The most bytes of one manifest or index read: Distribution itself refuses manifests over
# 4 MiB, so anything larger is no manifest a registry should hold.
MAX_MANIFEST = 4 << 20
# The most referrers of one image looked at (referrers()): signatures, SBOMs, attestations;
# more than this is someone filling the list, and what lies past it is not read.
MAX_REFERRERS = 64


def parse(uri: str, parsed: ParseResult) -> Location:
    """oci://host[:port]/repository[#key-prefix]: the whole path is the repository; what
    follows "#" is a key prefix (the keys live in the repository's tags)."""
    host, repository = parsed.netloc, parsed.path.strip("/")
    if not host or not HOST_RE.match(host):
        raise ValueError(f"{uri!r} has no registry host (expected oci://registry[:port]/repo)")
    if not repository:
        raise ValueError(f"{uri!r} names no repository (expected oci://{host}/repository)")
    if parsed.query or "@" in repository or ":" in repository:
        raise ValueError(f"{uri!r}: give a repository, not a tag or digest")
    if not REPOSITORY_RE.match(repository):
        raise ValueError(
            f"{uri!r}: repository {repository!r} is not a valid OCI name (lowercase letters, "
            "digits and . _ - between them, components separated by /)"
        )
    if len(f"{host}/{repository}") > MAX_NAME:
        raise ValueError(
            f"{uri!r}: registry and repository are {len(host) + 1 + len(repository)} characters, "
            f"over the {MAX_NAME} registries accept"
        )
    prefix = check_prefix(uri, parsed.fragment.strip("/"))
    return Location("oci", f"{host}/{repository}", prefix, separator="#")


def config_dir(options: StoreOptions) -> Path | None:
    value = options.oci_config or os.environ.get(CONFIG_ENV) or ""
    return Path(value) if value else None


def auth_headers(config: Path) -> dict[str, str]:
    """The Authorization header for each registry host of a docker config directory (as
    mounted from a dockerconfigjson Secret): the basic credentials its ``auths`` hold, by
    host[:port] (a "https://host/v1/" key is taken as its host). ValueError when it cannot be
    read."""
    import base64

    for name in (DOCKER_CONFIG_KEY, "config.json"):
        path = config / name
        if path.is_file():
            break
    else:
        raise ValueError(f"{config} holds no {DOCKER_CONFIG_KEY}")
    try:
        auths = json.loads(path.read_text()).get("auths") or {}
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{path} is not a docker config: {e}") from None
    out: dict[str, str] = {}
    for key, entry in auths.items() if isinstance(auths, dict) else ():
        if not isinstance(entry, dict):
            continue
        host = urlsplit(key if "://" in key else f"https://{key}").netloc
        token = entry.get("auth")
        if not token and entry.get("username"):
            pair = f"{entry['username']}:{entry.get('password', '')}"
            token = base64.b64encode(pair.encode()).decode()
        if host and isinstance(token, str) and token:
            out[host] = f"Basic {token}"
    return out


def open_store(location: Location, options: StoreOptions) -> OciStore:
    return OciStore(location, timeout_s=options.timeout_s, config=config_dir(options))


def session(options: StoreOptions) -> StoreOptions:
    return options  # a registry session holds a token that expires: one per operation


def pod_storage(
    location: Location, *, read_only: bool, secret: str, endpoint: str, region: str
) -> PodStorage:
    """The docker config Secret, mounted as a directory (never in env); none for a public,
    anonymous registry. The registry itself decides what those credentials may do: model pods
    get the serving Secret, which should allow pulls only."""
    if not secret:
        return PodStorage()
    return PodStorage(
        args=["--oci-config", MOUNT_PATH],
        volumes=[{"name": VOLUME, "secret": {"secretName": secret, "defaultMode": 0o444}}],
        mounts=[{"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}],
        credentials_secret=secret,
        credentials_kind="registry credentials (a kubernetes.io/dockerconfigjson Secret)",
        credential_keys=(DOCKER_CONFIG_KEY,),
    )


def tag_of(key: str) -> str:
    return TAG_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def bundle_tag(base: str) -> str:
    """The tag of the bundle of the artifact stored under `base` (for browsing and deletion;
    a bundle is served only by its digest)."""
    return "b-" + hashlib.sha256(base.encode()).hexdigest()


def volume_tag(base: str) -> str:
    """The tag of the volume image of the artifact stored under `base` (artifacts/ocibundle.py)."""
    return "v-" + hashlib.sha256(base.encode()).hexdigest()


def note_prefix(group: str) -> str:
    """The tags of a board group's notes all start with this (Board: fleet claims)."""
    return NOTE_PREFIX + hashlib.sha256(group.encode()).hexdigest()[:32] + "-"


def note_tag(group: str, member: str) -> str:
    return note_prefix(group) + hashlib.sha256(member.encode()).hexdigest()[:32]


def layer_size(layer: Any) -> int | None:
    """A layer descriptor's size, or None when it names none a registry could hold (a forged
    manifest's "big" or -1 is refused, never passed to int())."""
    size = layer.get("size") if isinstance(layer, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None


def referrers_tag(digest: str) -> str:
    """The OCI tag schema's fallback for registries without the referrers API: the index of
    an image's referrers is tagged `sha256-<hex>` (cosign's legacy signature is that plus
    `.sig`, a manifest of its own)."""
    return digest.replace(":", "-", 1)


def manifest_body(manifest: dict[str, Any]) -> bytes:
    """A manifest's bytes as pushed (their SHA-256 is its digest)."""
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Part:
    """One stored object as a bundle layer: its key, and what it is."""

    key: str
    media_type: str
    annotations: dict[str, str]


@dataclass(frozen=True)
class Via:
    """The operator's registry broker (signer/registry_route.py), in place of the registry:
    its https://host[:port] (http:// in tests), the CA file to check it with, the projected
    token it takes (`token()`, called at each request and sent to that host alone:
    artifacts/brokered.Broker.token) and the Service's address, for a pod whose cluster does
    not resolve the name."""

    url: str
    ca_file: str
    token: Callable[[], str]
    address: str = ""

    @property
    def host(self) -> str:
        return urlsplit(self.url).netloc


class _AddressAdapter(requests.adapters.HTTPAdapter):
    """Connects to `address` for `name`, checking the certificate (and SNI) against `name`."""

    def __init__(self, name: str, address: str) -> None:
        self.name, self.address = name, address
        super().__init__()

    def build_connection_pool_key_attributes(
        self, request: requests.PreparedRequest, verify: bool | str, cert: Any = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        host, pool = super().build_connection_pool_key_attributes(request, verify, cert)
        if host.get("host") == self.name:
            host = {**host, "host": self.address}
            pool = {**pool, "server_hostname": self.name, "assert_hostname": self.name}
        return host, pool


def _resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
        return True
    except OSError:
        return False


def _retry_after(value: str, default: float) -> float:
    try:
        return max(0.0, float(value))
    except ValueError:
        return default


class _Registry(oras.provider.Registry):  # type: ignore[misc]
    """oras-py's registry client with a bound on every call: oras retries without timeouts
    (a hung registry would hang the caller), so each request here has a timeout and the
    retries end at the operation's deadline. Through the broker (`via`), each request to it
    carries the pod's token instead of a credential of the registry."""

    def __init__(
        self, hostname: str, tls_verify: bool | str, deadline: float, via: Via | None = None
    ) -> None:
        super().__init__(
            hostname=hostname, insecure=False, tls_verify=tls_verify, auth_backend="basic"
        )
        self.deadline, self.via = deadline, via
        if via is not None and via.address:
            name = urlsplit(via.url).hostname or ""
            if not _resolves(name):
                self.session.mount(f"https://{via.host}/", _AddressAdapter(name, via.address))

    def do_request(
        self,
        url: str,
        method: str = "GET",
        data: Any = None,
        headers: dict[str, str] | None = None,
        json: dict[str, Any] | None = None,
        stream: bool = False,
    ) -> requests.Response:
        headers = dict(headers or {})
        if self.via is not None:
            # The token goes to the broker alone, never to a host a Location or Link names.
            if urlsplit(url).netloc == self.via.host:
                headers["Authorization"] = f"Bearer {self.via.token()}"
        elif getattr(self.auth, "_basic_auth", None):
            headers.update(self.auth.get_auth_header())
        for attempt in range(MAX_ATTEMPTS):
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise StoreError(f"{method} {url}: over the time limit")
            try:
                resp = self.session.request(
                    method,
                    url,
                    data=data,
                    json=json,
                    headers=headers,
                    stream=stream,
                    verify=self._tls_verify,
                    timeout=(min(10.0, left), min(60.0, left)),
                )
            except requests.exceptions.SSLError as exc:
                raise StoreError(f"TLS to the registry failed: {exc}") from None
            except requests.RequestException as exc:
                if attempt + 1 == MAX_ATTEMPTS:
                    raise StoreError(f"{method} {url}: {type(exc).__name__}: {exc}") from None
                time.sleep(min(0.5 * 2**attempt, max(0.0, self.deadline - time.monotonic())))
                continue
            if resp.status_code >= 500 and attempt + 1 < MAX_ATTEMPTS:
                time.sleep(min(0.5 * 2**attempt, max(0.0, self.deadline - time.monotonic())))
                continue
            if resp.status_code == 429 and attempt + 1 < MAX_ATTEMPTS:
                # A registry's (or the operator's proxy's) throttle: wait as it says, in bounds.
                wait = _retry_after(resp.headers.get("Retry-After", ""), 0.5 * 2**attempt)
                time.sleep(min(wait, 30.0, max(0.0, self.deadline - time.monotonic())))
                continue
            return cast(requests.Response, resp)
        raise AssertionError("unreachable")


class OciStore:
    page_size = 1000

    def __init__(
        self,
        location: Location,
        *,
        timeout_s: float = 60.0,
        config: Path | None = None,
        via: Via | None = None,
    ):
        self.location = location
        self.host, _, self.repository = location.bucket.partition("/")
        self.timeout_s = timeout_s
        deadline = time.monotonic() + timeout_s
        self.via = via
        if via is not None:
            self.client = _Registry(via.host, via.ca_file or True, deadline, via)
            return
        ca = config / CA_KEY if config is not None and (config / CA_KEY).is_file() else None
        self.client = _Registry(self.host, str(ca) if ca else True, deadline)
        self._login(config)

    @property
    def base(self) -> str:
        """Where requests go: the registry, or the operator's broker in its place (the same
        paths). Read, not set, so that a store made without __init__ (a test's double of the
        registry) is the registry's."""
        via: Via | None = getattr(self, "via", None)
        return via.url.rstrip("/") if via is not None else f"https://{self.host}"

    def _login(self, config: Path | None) -> None:
        files: list[str] = []
        if config is not None:
            files += [
                str(p) for p in (config / DOCKER_CONFIG_KEY, config / "config.json") if p.is_file()
            ]
        elif os.environ.get("DOCKER_CONFIG"):
            files.append(os.path.join(os.environ["DOCKER_CONFIG"], "config.json"))
        try:
            container = self.client.get_container(self._ref())
            self.client.auth.load_configs(container, configs=files or None)
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read the registry credentials: {exc}") from None

    def _ref(self, reference: str = "") -> str:
        sep = "@" if reference.startswith("sha256:") else ":"
        return f"{self.location.bucket}{sep + reference if reference else ''}"

    def _url(self, kind: str, reference: str) -> str:
        return f"{self.base}/v2/{self.repository}/{kind}/{reference}"

    def uri(self, key: str) -> str:
        return self.location.uri(key)

    @staticmethod
    def _fail(what: str, resp: requests.Response) -> StoreError:
        try:
            errors = resp.json().get("errors") or []
            detail = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}" for e in errors)
        except ValueError:
            detail = resp.text[:200]
        hint = ""
        if resp.status_code in (401, 403):
            hint = " (check the registry credentials Secret: may it push/pull this repository?)"
        elif resp.status_code == 405 and "DELETE" in what.upper():
            hint = " (the registry refuses deletes: enable them, e.g. storage.delete.enabled)"
        return StoreError(f"{what}: HTTP {resp.status_code} {detail}{hint}".rstrip())

    # -- manifests and blobs -------------------------------------------------------------

    def manifest(
        self, reference: str, accept: str = MANIFEST_MEDIA_TYPE
    ) -> tuple[dict[str, Any], str] | None:
        """The manifest (or, accepting INDEX_MEDIA_TYPE, the index) at a tag or digest and its
        digest; None when there is none. Read up to MAX_MANIFEST bytes; a digest reference is
        checked against the bytes the registry returned."""
        body = self._manifest_body(reference, accept)
        if body is None:
            return None
        digest = digest_of(body)
        if reference.startswith("sha256:") and digest != reference:
            raise StoreError(
                f"{self._ref(reference)}: the registry returned other bytes ({digest}): refused"
            )
        try:
            doc = json.loads(body)
        except ValueError:
            raise StoreError(f"{self._ref(reference)} is not a JSON manifest") from None
        if not isinstance(doc, dict):
            raise StoreError(f"{self._ref(reference)} is not a manifest")
        return doc, digest

    def _manifest_body(self, reference: str, accept: str) -> bytes | None:
        resp = self.client.do_request(
            self._url("manifests", reference), "GET", headers={"Accept": accept}, stream=True
        )
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self._fail(f"reading the manifest {self._ref(reference)}", resp)
        return self._bounded(resp, MAX_MANIFEST, f"the manifest {self._ref(reference)}")

    def descriptor(self, digest: str) -> dict[str, Any]:
        """The OCI descriptor of the manifest at `digest` (what a referrer names as subject)."""
        body = self._manifest_body(digest, f"{MANIFEST_MEDIA_TYPE}, {INDEX_MEDIA_TYPE}")
        if body is None or digest_of(body) != digest:
            raise NotFoundError(f"{self._ref(digest)}: no such manifest")
        media_type = json.loads(body).get("mediaType") or MANIFEST_MEDIA_TYPE
        return {"mediaType": media_type, "digest": digest, "size": len(body)}

    @staticmethod
    def _bounded(resp: requests.Response, max_bytes: int, what: str) -> bytes:
        """A streamed answer's body, refused past max_bytes (never read further)."""
        data = bytearray()
        # No chunk larger than the bound: a 16 KiB note is never read a MiB at a time.
        for chunk in resp.iter_content(min(CHUNK, max_bytes + 1)):
            data += chunk
            if len(data) > max_bytes:
                resp.close()
                raise TooLargeError(f"{what} is more than {max_bytes} bytes")
        return bytes(data)

    def blob(self, digest: str, max_bytes: int, what: str) -> bytes:
        resp = self.client.do_request(self._url("blobs", digest), "GET", stream=True)
        if resp.status_code == 404:
            raise NotFoundError(f"{what}: the registry has no blob {digest}")
        if resp.status_code != 200:
            raise self._fail(f"downloading {what}", resp)
        data = self._bounded(resp, max_bytes, what)
        if digest_of(data) != digest:
            raise StoreError(f"{what} does not match its digest {digest}: refused")
        return data

    def blob_to(self, digest: str, dest: BinaryIO, max_bytes: int, what: str) -> Received:
        """The blob streamed into dest, hashed as it arrives, refused when it is not its
        digest (the caller's file is then the caller's to remove)."""
        resp = self.client.do_request(self._url("blobs", digest), "GET", stream=True)
        if resp.status_code == 404:
            raise NotFoundError(f"{what}: the registry has no blob {digest}")
        if resp.status_code != 200:
            raise self._fail(f"downloading {what}", resp)
        try:
            got = write_hashed(resp.iter_content(CHUNK), dest, max_bytes, what)
        except requests.RequestException as exc:
            raise StoreError(f"downloading {what}: {type(exc).__name__}: {exc}") from None
        finally:
            resp.close()
        if f"sha256:{got.sha256}" != digest:
            raise StoreError(f"{what} does not match its digest {digest}: refused")
        return got

    def push_blob_file(self, path: Path) -> tuple[str, int]:
        """A file as a blob (digest, size), streamed from disk in one monolithic PUT (the
        distribution spec's simplest upload; requests sends a file body a block at a time)."""
        size, sha = file_sha256(path)
        with open(path, "rb") as f:
            return self._upload(f"sha256:{sha}", DroppingReader(f), size), size

    def push_blob(self, data: bytes) -> str:
        return self._upload(digest_of(data), data, len(data))

    def _upload(self, digest: str, body: Any, size: int) -> str:
        """The blob `digest` (body: bytes or a reader of `size` bytes), unless the registry
        has it already."""
        head = self.client.do_request(self._url("blobs", digest), "HEAD")
        if head.status_code == 200:
            return digest
        start = self.client.do_request(
            f"{self.base}/v2/{self.repository}/blobs/uploads/",
            "POST",
            headers={"Content-Type": "application/octet-stream"},
        )
        if start.status_code not in (200, 202):
            raise self._fail(f"starting an upload to {self._ref()}", start)
        location = start.headers.get("Location", "")
        location = f"{self.base}{location}" if location.startswith("/") else location
        sep = "&" if "?" in location else "?"
        put = self.client.do_request(
            f"{location}{sep}digest={digest}",
            "PUT",
            data=body,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )
        if put.status_code not in (201, 204):
            raise self._fail(f"uploading a blob to {self._ref()}", put)
        return digest

    def push_manifest(self, manifest: dict[str, Any], reference: str) -> str:
        """Put a manifest under a tag or (reference "") its own digest; its digest."""
        body = manifest_body(manifest)
        digest = digest_of(body)
        resp = self.client.do_request(
            self._url("manifests", reference or digest),
            "PUT",
            data=body,
            headers={"Content-Type": str(manifest.get("mediaType") or MANIFEST_MEDIA_TYPE)},
        )
        if resp.status_code not in (200, 201):
            raise self._fail(f"pushing a manifest to {self._ref(reference)}", resp)
        answered = resp.headers.get("Docker-Content-Digest")
        if answered and answered != digest:
            raise StoreError(f"{self._ref()}: the registry stored {answered}, not {digest}")
        return digest

    def delete_manifest(self, digest: str) -> None:
        resp = self.client.do_request(self._url("manifests", digest), "DELETE")
        if resp.status_code not in (200, 202, 404):
            raise self._fail(f"deleting {self._ref(digest)}", resp)

    # -- referrers (OCI 1.1): the manifests that name an image as their subject -------------

    def _referrers_api(self, digest: str) -> builtins.list[Any] | None:
        """The referrers API's descriptors for `digest` (its first page); None where the
        registry has no referrers API: the spec has those answer 404 (Distribution 3 does),
        and some older registries answer 400 or 405 to a path they do not know."""
        resp = self.client.do_request(
            self._url("referrers", digest), "GET", headers={"Accept": INDEX_MEDIA_TYPE}, stream=True
        )
        if resp.status_code in (400, 404, 405):
            return None
        if resp.status_code != 200:
            raise self._fail(f"listing the referrers of {self._ref(digest)}", resp)
        body = self._bounded(resp, MAX_MANIFEST, f"the referrers of {self._ref(digest)}")
        try:
            found = json.loads(body).get("manifests")
        except (ValueError, AttributeError):
            raise StoreError(f"the referrers of {self._ref(digest)} are not an index") from None
        return found if isinstance(found, builtins.list) else []

    def _fallback_index(self, digest: str) -> builtins.list[Any]:
        found = self.manifest(referrers_tag(digest), INDEX_MEDIA_TYPE)
        if found is None or found[0].get("mediaType") != INDEX_MEDIA_TYPE:
            return []
        entries = found[0].get("manifests")
        return entries if isinstance(entries, builtins.list) else []

    def referrers(self, digest: str, artifact_type: str = "") -> builtins.list[dict[str, Any]]:
        """Descriptors of the manifests whose subject is `digest` (of `artifact_type`, when
        given): from the referrers API or, where the registry has none, from the tag schema's
        index (referrers_tag), which pushers keep up to date. At most MAX_REFERRERS. Only
        descriptors: the caller reads each manifest by digest and checks its subject."""
        found = self._referrers_api(digest)
        if found is None:
            found = self._fallback_index(digest)
        return [
            d
            for d in found
            if isinstance(d, dict)
            and isinstance(d.get("digest"), str)
            and str(d["digest"]).startswith("sha256:")
            and (not artifact_type or d.get("artifactType") == artifact_type)
        ][:MAX_REFERRERS]

    def push_referrer(self, manifest: dict[str, Any]) -> str:
        """A manifest with a subject, pushed by its digest; where the registry has no referrers
        API, also added to the subject's tag-schema index, every other entry kept (other
        signers, SBOMs). Two writers of that index race and the last wins, as the spec says."""
        digest = self.push_manifest(manifest, "")
        subject = str(manifest["subject"]["digest"])
        if self._referrers_api(subject) is not None:
            return digest
        entry = {
            "mediaType": manifest.get("mediaType") or MANIFEST_MEDIA_TYPE,
            "digest": digest,
            "size": len(manifest_body(manifest)),
            "artifactType": manifest.get("artifactType", ""),
        }
        kept = [e for e in self._fallback_index(subject) if isinstance(e, dict)]
        index = {
            "schemaVersion": 2,
            "mediaType": INDEX_MEDIA_TYPE,
            "manifests": [*(e for e in kept if e.get("digest") != digest), entry],
        }
        self.push_manifest(index, referrers_tag(subject))
        return digest

    # -- the Store contract --------------------------------------------------------------

    def _object(self, key: str) -> tuple[dict[str, Any], dict[str, Any], str] | None:
        """(manifest, its one layer, manifest digest) of the object at key; None if absent."""
        found = self.manifest(tag_of(key))
        if found is None:
            return None
        doc, digest = found
        layers = doc.get("layers")
        annotations = doc.get("annotations") or {}
        if (
            not isinstance(annotations, dict)
            or not isinstance(layers, list)
            or len(layers) != 1
            or layer_size(layers[0]) is None
            or annotations.get(KEY_ANNOTATION) != key
        ):
            raise ConflictError(
                f"{self.uri(key)}: the tag {tag_of(key)} holds something that is "
                "not this object: refused"
            )
        return doc, layers[0], digest

    def _write(
        self,
        key: str,
        data: bytes,
        content_type: str,
        tag: str = "",
        annotations: dict[str, str] | None = None,
    ) -> None:
        """The object as an artifact under its key's tag (or `tag`, with more annotations)."""
        self._write_layer(key, self.push_blob(data), len(data), content_type, tag, annotations)

    def _write_layer(
        self,
        key: str,
        layer_digest: str,
        size: int,
        content_type: str,
        tag: str = "",
        annotations: dict[str, str] | None = None,
    ) -> None:
        """The object manifest naming a pushed blob, under its key's tag (or `tag`)."""
        manifest = self._artifact(
            OBJECT_ARTIFACT_TYPE,
            [
                {
                    "mediaType": OBJECT_MEDIA_TYPE,
                    "digest": layer_digest,
                    "size": size,
                    "annotations": {
                        TITLE_ANNOTATION: key.rsplit("/", 1)[-1],
                        "io.tunefleet.content-type": content_type,
                    },
                }
            ],
            {
                KEY_ANNOTATION: key,
                CREATED_ANNOTATION: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **(annotations or {}),
            },
        )
        self.push_manifest(manifest, tag or tag_of(key))

    def _artifact(
        self, artifact_type: str, layers: list[dict[str, Any]], annotations: dict[str, str]
    ) -> dict[str, Any]:
        """An OCI artifact manifest: the empty config (pushed once), these layers."""
        self.push_blob(b"{}")
        return {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "artifactType": artifact_type,
            "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": EMPTY_DIGEST, "size": 2},
            "layers": layers,
            "annotations": dict(sorted(annotations.items())),
        }

    def put_if_absent(self, key: str, data: bytes, content_type: str) -> bool:
        found = self._object(key)
        if found is not None:
            if found[1].get("digest") == digest_of(data):
                return False
            raise ConflictError(f"a different object already exists at {self.uri(key)}")
        self._write(key, data, content_type)
        return True

    def put(self, key: str, data: bytes, content_type: str) -> None:
        self._write(key, data, content_type)

    def get(self, key: str, max_bytes: int) -> bytes:
        return self.blob(self._blob_of(key, max_bytes), max_bytes, self.uri(key))

    def get_file(self, key: str, dest: BinaryIO, max_bytes: int) -> Received:
        return self.blob_to(self._blob_of(key, max_bytes), dest, max_bytes, self.uri(key))

    def _blob_of(self, key: str, max_bytes: int) -> str:
        """The digest of the blob the object at key is; NotFoundError, TooLargeError (by the
        size its manifest gives, before any byte of it is read)."""
        found = self._object(key)
        if found is None:
            raise NotFoundError(f"no object at {self.uri(key)}")
        layer = found[1]
        if int(layer["size"]) > max_bytes:
            raise TooLargeError(
                f"{self.uri(key)} is {layer.get('size')} bytes, more than {max_bytes}"
            )
        return str(layer.get("digest", ""))

    def put_file_if_absent(self, key: str, path: Path, content_type: str) -> bool:
        found = self._object(key)
        if found is not None:
            if found[1].get("digest") == f"sha256:{file_sha256(path)[1]}":
                return False
            raise ConflictError(f"a different object already exists at {self.uri(key)}")
        digest, size = self.push_blob_file(path)
        self._write_layer(key, digest, size, content_type)
        return True

    def object_digest(self, key: str) -> str:
        """The manifest digest of the object at key (what a bundle or a signature names)."""
        found = self._object(key)
        if found is None:
            raise NotFoundError(f"no object at {self.uri(key)}")
        return found[2]

    def tags(self, prefix: str = "") -> list[str]:
        """The repository's tags; with a prefix, only those that start with it, read from the
        prefix on (`last`: the distribution spec's listing is in lexical order) and no further
        than the page that passes it. A registry that ignores `last` is read to the end.
        StoreError once MAX_TAGS were read (or MAX_TAGS // page_size pages, for a registry
        sending short or empty pages) with more to come: the listing was cut, and a caller
        deciding on it (bids, gc) must not take it for the whole."""
        out: list[str] = []
        url = f"{self.base}/v2/{self.repository}/tags/list?n={self.page_size}"
        if prefix:
            url += f"&last={prefix}"
        read, pages = 0, 0
        while url:
            if read >= MAX_TAGS or pages >= MAX_TAGS // self.page_size:
                raise StoreError(
                    f"listing {self._ref()} was cut after {read} tags in {pages} pages (at most "
                    f"{MAX_TAGS} tags are read): the registry's listing does not end there"
                )
            pages += 1
            resp = self.client.do_request(url, "GET")
            if resp.status_code == 404:
                return out  # no repository yet: nothing stored
            if resp.status_code != 200:
                raise self._fail(f"listing {self._ref()}", resp)
            page = [t for t in (resp.json().get("tags") or []) if isinstance(t, str)]
            read += len(page)
            out += [t for t in page if t.startswith(prefix)]
            if prefix and page == sorted(page) and page and page[-1] > prefix + "\uffff":
                break
            link = resp.headers.get("Link", "")
            match = re.match(r"<([^>]+)>", link)
            url = (
                f"{self.base}{match.group(1)}"
                if match and match.group(1).startswith("/")
                else (match.group(1) if match else "")
            )
        return out

    def list(self, prefix: str, limit: int) -> list[Listed]:
        """Every object's manifest is read for its key: a registry has no listing by prefix
        (one request per object; fine for an artifact store, slow for a huge one)."""
        want = prefix.rstrip("/") + "/" if prefix else ""
        out: list[Listed] = []
        for tag in sorted(self.tags()):
            if not tag.startswith(TAG_PREFIX):
                continue
            found = self.manifest(tag)
            if found is None:
                continue
            doc = found[0]
            annotations = doc.get("annotations") or {}
            key = annotations.get(KEY_ANNOTATION) if isinstance(annotations, dict) else None
            layers = doc.get("layers") or []
            if (
                not isinstance(key, str)
                or tag_of(key) != tag
                or not isinstance(layers, list)
                or len(layers) != 1
                or layer_size(layers[0]) is None
            ):
                continue  # not an object of ours (or a tag moved onto another key): skipped
            if not key.startswith(want):
                continue
            out.append(
                Listed(
                    key,
                    int(layers[0]["size"]),
                    _timestamp(annotations.get(CREATED_ANNOTATION, "")),
                )
            )
        out.sort(key=lambda item: item.key)
        return out[:limit]

    def _head(self, reference: str, what: str) -> str:
        """The digest of the manifest at a tag; "" when there is none."""
        resp = self.client.do_request(
            self._url("manifests", reference),
            "HEAD",
            headers={"Accept": f"{MANIFEST_MEDIA_TYPE}, {INDEX_MEDIA_TYPE}"},
        )
        if resp.status_code == 404:
            return ""
        digest = resp.headers.get("Docker-Content-Digest", "")
        if resp.status_code != 200 or not digest.startswith("sha256:"):
            raise self._fail(f"finding {what} to delete it", resp)
        return digest

    def delete(self, key: str) -> None:
        """The object; with an artifact's manifest, its bundle and volume image and their
        signatures too (gc deletes an artifact object by object, the manifest among them)."""
        if key.endswith("/manifest.json"):
            base = key[: -len("/manifest.json")]
            for tag in (bundle_tag(base), volume_tag(base)):
                image = self._head(tag, f"{tag} of {self.uri(base)}")
                if not image:
                    continue
                self._delete_signatures(image)
                self.delete_manifest(image)
        digest = self._head(tag_of(key), self.uri(key))
        if digest:
            self.delete_manifest(digest)

    def _delete_signatures(self, image: str) -> None:
        """An image's signatures, both cosign formats: the legacy `.sig` manifest, and its
        referrers (Sigstore bundles among them) with their tag-schema index."""
        signature = self._head(referrers_tag(image) + ".sig", f"{image}'s signature")
        if signature:
            self.delete_manifest(signature)
        for referrer in self.referrers(image):
            self.delete_manifest(str(referrer["digest"]))
        index = self._head(referrers_tag(image), f"{image}'s referrers index")
        if index:
            self.delete_manifest(index)

    # -- the Board contract (store.Board): fleet claims on a registry ---------------------

    def post(self, group: str, member: str, data: bytes) -> None:
        tag = note_tag(group, member)
        self._write(group, data, "application/json", tag, {NOTE_MEMBER_ANNOTATION: member})

    def notes(self, group: str, max_bytes: int) -> builtins.list[bytes]:
        """Each note's manifest must name the group and a member whose tag it sits under: a
        tag moved onto anything else is skipped, as is a note over max_bytes."""
        out = []
        for tag in self.tags(note_prefix(group)):
            found = self.manifest(tag)
            if found is None:
                continue  # unposted since the listing
            annotations = found[0].get("annotations")
            layers = found[0].get("layers")
            if not isinstance(annotations, dict) or not isinstance(layers, list):
                continue
            member = annotations.get(NOTE_MEMBER_ANNOTATION)
            size = layer_size(layers[0]) if len(layers) == 1 else None
            if (
                annotations.get(KEY_ANNOTATION) != group
                or not isinstance(member, str)
                or note_tag(group, member) != tag
                or size is None
            ):
                continue
            if size > max_bytes:
                log.warning(f"{self._ref(tag)}: a note of {size} bytes, over {max_bytes}: skipped")
                continue
            try:
                # Bounded by the size the manifest gives (at most max_bytes), not max_bytes:
                # a blob larger than its manifest says is not this note, and one bad note
                # must not abort reading the others (every bidder would wait on it for good).
                out.append(self.blob(str(layers[0].get("digest", "")), size, tag))
            except NotFoundError:
                continue
            except TooLargeError:
                log.warning(
                    f"{self._ref(tag)}: a note whose blob is larger than its manifest says "
                    f"({size} bytes): skipped"
                )
        return out

    def unpost(self, group: str, member: str) -> None:
        """Deleted; where the registry refuses deletes, replaced by an empty note (which no
        reader takes for a claim)."""
        tag = note_tag(group, member)
        digest = self._head(tag, f"the note {tag}")
        if not digest:
            return
        resp = self.client.do_request(self._url("manifests", digest), "DELETE")
        if resp.status_code == 405:
            self.post(group, member, b"")
        elif resp.status_code not in (200, 202, 404):
            raise self._fail(f"deleting {self._ref(digest)}", resp)

    # -- bundles -------------------------------------------------------------------------

    def push_bundle(
        self, parts: Sequence[Part], annotations: dict[str, str], artifact_type: str, tag: str
    ) -> str:
        """One image manifest whose layers are stored objects (pushed before, by put*), by
        digest; tagged for people browsing the registry, but only ever read by digest."""
        layers = []
        for part in parts:
            found = self._object(part.key)
            if found is None:
                raise NotFoundError(f"{self.uri(part.key)} is not stored: push it first")
            layer = found[1]
            layers.append(
                {
                    "mediaType": part.media_type,
                    "digest": layer["digest"],
                    "size": int(layer["size"]),
                    "annotations": {
                        TITLE_ANNOTATION: part.key.rsplit("/", 1)[-1],
                        KEY_ANNOTATION: part.key,
                        **part.annotations,
                    },
                }
            )
        manifest = self._artifact(artifact_type, layers, annotations)
        digest = self.push_manifest(manifest, "")
        self.push_manifest(manifest, tag)
        return digest


def _timestamp(value: str) -> float:
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    except (ValueError, OverflowError):
        return 0.0
