"""The storage contract: what every artifact store offers, its errors, and where things are.

A backend (s3.py, filesystem.py) implements `Store` for the URI schemes it owns; registry.py
picks one by scheme. Every backend gives the same guarantee: an object is written once, under
its content-addressed key, and an identical object already there is success while a different
one is an error. Scratch objects (checkpoints, shard outputs) are the exception: `put`
replaces them. Nothing here imports a backend, so the contract never depends on one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from tuner_job.files import CHUNK, HashingWriter, TooLarge

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_DNS_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
PREFIX_SEGMENT_RE = re.compile(r"^[A-Za-z0-9._=-]+$")


class StoreError(Exception):
    """The object store refused, failed, or holds something unexpected."""


class ConflictError(StoreError):
    """A different object already sits under a content-addressed key."""


class TooLargeError(StoreError):
    """An object is larger than the caller allows (checked before it is downloaded). `size`
    and `tag` (its version's tag) where the refusing answer gave them: what read_tagged
    returns of an object it will not download."""

    def __init__(self, message: str, size: int = 0, tag: str = "") -> None:
        super().__init__(message)
        self.size, self.tag = size, tag


class NotFoundError(StoreError):
    """No object under the key."""


@dataclass(frozen=True)
class Listed:
    key: str  # the full key, as get() takes it
    size: int
    modified: float  # seconds since the epoch


class Store(Protocol):
    def put_if_absent(self, key: str, data: bytes, content_type: str) -> bool:
        """Write once. True if written, False if an identical object was already there."""

    def put(self, key: str, data: bytes, content_type: str) -> None:
        """Write, replacing what is there (scratch objects only: checkpoints, shard outputs)."""

    def get(self, key: str, max_bytes: int) -> bytes:
        """The object's bytes; NotFoundError if there is none."""

    def list(self, prefix: str, limit: int) -> list[Listed]:
        """Objects under ``prefix + "/"`` (every object when prefix is ""), by key, at most
        ``limit`` of them."""

    def delete(self, key: str) -> None:
        """Remove one object; one that is already gone is success."""

    def uri(self, key: str) -> str: ...


@dataclass(frozen=True)
class Received:
    """An object streamed into a file: how many bytes came, and their SHA-256 (hashed as they
    arrived, so checking a GB archive costs no second read)."""

    size: int
    sha256: str


class Streams(Protocol):
    """What a store offers beside `Store` for objects of any size (cache archives: GBs): a
    download into an open file and a write-once upload from a file, each in bounded memory.
    Every backend has them; `get_file` and `put_file_if_absent` below fall back to whole
    reads and writes for a store that has not (a test's fake)."""

    def get_file(self, key: str, dest: BinaryIO, max_bytes: int) -> Received:
        """The object's bytes written to dest as they arrive; NotFoundError, TooLargeError."""

    def put_file_if_absent(self, key: str, path: Path, content_type: str) -> bool:
        """put_if_absent of a file's bytes, read from disk a part at a time."""


def get_file(store: Store, key: str, dest: BinaryIO, max_bytes: int) -> Received:
    """The object streamed into dest (bounded by max_bytes), hashed as it comes."""
    own = getattr(store, "get_file", None)
    if callable(own):
        got = own(key, dest, max_bytes)
        assert isinstance(got, Received)
        return got
    data = store.get(key, max_bytes)
    return write_hashed([data], dest, max_bytes, store.uri(key))


def write_hashed(chunks: Any, dest: BinaryIO, max_bytes: int, what: str) -> Received:
    """Chunks (an iterable of bytes, or a reader) written to dest, counted and hashed,
    TooLargeError past max_bytes (the page cache of what was written handed back as it goes:
    tuner_job/files.py)."""
    out = HashingWriter(dest, max_bytes, what)
    if hasattr(chunks, "read"):  # a reader: its chunks
        reader = chunks
        chunks = iter(lambda: reader.read(CHUNK), b"")
    try:
        for chunk in chunks:
            if chunk:
                out.write(chunk)
    except TooLarge as exc:
        raise TooLargeError(str(exc)) from None
    out.drop()
    return Received(out.size, out.hexdigest())


def put_file_if_absent(store: Store, key: str, path: Path, content_type: str) -> bool:
    """The file written once under key, streamed where the backend can."""
    own = getattr(store, "put_file_if_absent", None)
    if callable(own):
        return bool(own(key, path, content_type))
    return store.put_if_absent(key, path.read_bytes(), content_type)


@dataclass(frozen=True)
class Tagged:
    """An object's bytes and the tag of that version (S3's ETag): what a conditional replace
    names, so it fails when anyone wrote the object since it was read."""

    data: bytes
    tag: str
    # The object's size when it was over the reader's bound: `data` is then b"" (never
    # downloaded), and the tag still names its version, so that what is too large to be a
    # coordination object can be replaced on that version like any other (fleet/).
    oversize: int = 0


class Swappable(Protocol):
    """What a store offers beside `Store` for coordination objects (fleet/claims.py): a create
    that fails on anything already there, a read with the version's tag, and a replace of that
    version only. s3:// (If-None-Match, If-Match) and file:// / pvc:// (link(2), a lock) have it;
    oci:// has not (it has a Board)."""

    def create(self, key: str, data: bytes, content_type: str) -> bool:
        """Write only where nothing is: False if an object is there, whatever it holds."""

    def read_tagged(self, key: str, max_bytes: int) -> Tagged:
        """The object and its version's tag; NotFoundError if there is none. One over
        max_bytes is not downloaded: its tag and `oversize` alone, with no data."""

    def replace_if(self, key: str, data: bytes, content_type: str, tag: str) -> bool:
        """Replace the version `tag` names: False if the object changed or went since."""


class SwappableStore(Store, Swappable, Protocol):
    """A store that also coordinates (s3://, file://, pvc://)."""


def swappable(store: Store) -> SwappableStore | None:
    """The store as a SwappableStore, or None when its backend cannot coordinate."""
    ops = ("create", "read_tagged", "replace_if")
    return store if all(callable(getattr(store, op, None)) for op in ops) else None  # type: ignore[return-value]


class Board(Protocol):
    """What a store with no conditional write offers for coordination (oci://: a registry
    replaces a tag with no If-Match): a board of notes. Each writer posts and replaces only its
    own note in a group, and anyone reads a group's notes at once; fleet/bids.py builds claims
    on it from time (a settle window) instead of an atomic swap."""

    def post(self, group: str, member: str, data: bytes) -> None:
        """Write (or replace) `member`'s note in `group`."""

    def notes(self, group: str, max_bytes: int) -> list[bytes]:
        """Every note in `group` (of any member; each at most max_bytes, larger ones skipped)."""

    def unpost(self, group: str, member: str) -> None:
        """Remove `member`'s note; one already gone is success."""


class BoardStore(Store, Board, Protocol):
    """A store that coordinates through a board (oci://)."""


def board(store: Store) -> BoardStore | None:
    """The store as a BoardStore, or None when it offers no board."""
    ops = ("post", "notes", "unpost")
    return store if all(callable(getattr(store, op, None)) for op in ops) else None  # type: ignore[return-value]


def same_object(store: Store, key: str, data: bytes) -> bool:
    """Whether the object at key is exactly data (used after a create-if-absent lost)."""
    try:
        return store.get(key, len(data)) == data
    except TooLargeError:
        return False


@dataclass(frozen=True)
class Location:
    """A parsed storage URI: ``<scheme>://<bucket>/<prefix>``. For s3 the bucket is the
    bucket; for pvc the PersistentVolumeClaim's name; for file the directory itself."""

    scheme: str
    bucket: str
    prefix: str  # key prefix without leading or trailing "/", may be ""
    # Between the bucket and the key in a URI: "#" for oci://, whose repository path is itself
    # made of "/"-separated components (oci://registry/repo#key).
    separator: str = "/"

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def uri(self, key: str = "") -> str:
        """The URI of a full key (as returned by key())."""
        root = f"{self.scheme}://{self.bucket.rstrip('/')}"
        return f"{root}{self.separator}{key}" if key else root


@dataclass(frozen=True)
class StoreOptions:
    """How to reach a store from this process: what the CLIs' storage flags say."""

    endpoint_url: str | None = None  # s3: the endpoint (else AWS_ENDPOINT_URL_S3, else AWS)
    region: str | None = None  # s3
    timeout_s: float = 60.0  # the whole operation's wall-clock bound
    # pvc: where the claim is mounted in this container (tunefleet's pods mount it here).
    pvc_root: str = "/tunefleet/store"
    client: Any = None  # s3: a boto3 client to reuse (one per long-running process)
    # oci: a directory holding the docker config (.dockerconfigjson) and optionally ca.crt
    # (the registry's CA), as a dockerconfigjson Secret is mounted; else $TUNEFLEET_OCI_CONFIG.
    oci_config: str | None = None
    # The operator's store broker (artifacts/brokered.Broker: `open(location, timeout_s)`):
    # every operation on a URL it presigns, with no credential here (tuning pods of profiles
    # the operator brokers for).
    broker: Any = None


@dataclass(frozen=True)
class PodStorage:
    """What a pod's container needs to reach the store: the backend decides (registry.py)."""

    env: list[dict[str, Any]] = field(default_factory=list)  # credentials by reference only
    args: list[str] = field(default_factory=list)  # the CLIs' storage flags
    volumes: list[dict[str, Any]] = field(default_factory=list)  # pod volumes (pvc)
    mounts: list[dict[str, Any]] = field(default_factory=list)  # the container's mounts
    # The Secret the env refers to ("" when none): a missing one is named in status.
    credentials_secret: str = ""
    # What the Secret holds, in words, and its keys: for the fix a condition message gives.
    credentials_kind: str = ""
    credential_keys: tuple[str, ...] = ()
    # The pod's fsGroup the store's files need (a volume written by tunefleet's user).
    fs_group: int | None = None

    def optional(self) -> PodStorage:
        """The same, with the credentials Secret optional: a model pod whose namespace lacks it
        starts anyway, and its fetch (told by --credentials-secret which Secret it expected)
        says so and follows the profile's policy: untuned and counted, or refused. A
        required reference would hold the pod in CreateContainerConfigError for good."""
        if not self.credentials_secret:
            return self
        env = [
            {**e, "valueFrom": {"secretKeyRef": {**e["valueFrom"]["secretKeyRef"],
                                                 "optional": True}}}
            if "secretKeyRef" in (e.get("valueFrom") or {}) else e
            for e in self.env
        ]  # fmt: skip
        # Every Secret volume (the signing key's too): fetch refuses what it cannot verify.
        volumes = [
            {**v, "secret": {**v["secret"], "optional": True}} if v.get("secret") else v
            for v in self.volumes
        ]
        args = [*self.args, "--credentials-secret", self.credentials_secret]
        return replace(self, env=env, volumes=volumes, args=args)


def check_prefix(uri: str, prefix: str) -> str:
    for seg in prefix.split("/") if prefix else []:
        if not PREFIX_SEGMENT_RE.match(seg) or seg in (".", ".."):
            raise ValueError(f"{uri!r} has an unsafe key segment {seg!r}")
    return prefix


def check_key_parts(namespace: str, profile: str, gpu_model: str) -> None:
    if not _DNS_RE.match(namespace) or len(namespace) > 63:
        raise ValueError(f"namespace {namespace!r} is not a Kubernetes namespace name")
    if not _DNS_RE.match(profile) or len(profile) > 253:
        raise ValueError(f"profile {profile!r} is not a Kubernetes object name")
    if not _LABEL_VALUE_RE.match(gpu_model) or len(gpu_model) > 63:
        raise ValueError(f"GPU model {gpu_model!r} is not a Kubernetes label value")


def check_sha256(sha: str) -> str:
    value = sha.strip().lower()
    if not _SHA_RE.match(value):
        raise ValueError(f"{sha!r} is not a SHA-256 (64 hex digits)")
    return value
