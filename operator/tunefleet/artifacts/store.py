"""Where artifacts live: an S3 bucket (s3://bucket/prefix) or a directory (file:///path).

The directory store exists so the same publish/fetch code runs where boto3 or an S3 server does
not (scripts/gpu-check.sh on a GPU machine, unit tests); boto3 is imported only for s3:// URIs.
Both stores give the same guarantee: an object is written once, under its content-addressed key,
and an identical object already there is success while a different one is an error. Scratch
objects (checkpoints, shard outputs) are the exception: `put` replaces them.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_DNS_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_PREFIX_SEGMENT_RE = re.compile(r"^[A-Za-z0-9._=-]+$")


class StoreError(Exception):
    """The object store refused, failed, or holds something unexpected."""


class ConflictError(StoreError):
    """A different object already sits under a content-addressed key."""


class TooLargeError(StoreError):
    """An object is larger than the caller allows (checked before it is downloaded)."""


class NotFoundError(StoreError):
    """No object under the key."""


@dataclass(frozen=True)
class Listed:
    key: str  # the full key, as get() takes it
    size: int
    modified: float  # seconds since the epoch


def same_object(store: Store, key: str, data: bytes) -> bool:
    """Whether the object at key is exactly data (used after a create-if-absent lost)."""
    try:
        return store.get(key, len(data)) == data
    except TooLargeError:
        return False


class Store(Protocol):
    def put_if_absent(self, key: str, data: bytes, content_type: str) -> bool:
        """Write once. True if written, False if an identical object was already there."""

    def put(self, key: str, data: bytes, content_type: str) -> None:
        """Write, replacing what is there (scratch objects only: checkpoints, shard outputs)."""

    def get(self, key: str, max_bytes: int) -> bytes:
        """The object's bytes; NotFoundError if there is none."""

    def list(self, prefix: str, limit: int) -> list[Listed]:
        """Objects under ``prefix + "/"``, by key, at most ``limit`` of them."""

    def uri(self, key: str) -> str: ...


@dataclass(frozen=True)
class Location:
    scheme: str  # "s3" or "file"
    bucket: str  # s3 bucket, or the directory for file://
    prefix: str  # key prefix without leading or trailing "/", may be ""

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def uri(self, key: str = "") -> str:
        """The URI of a full key (as returned by key())."""
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{key}" if key else f"s3://{self.bucket}"
        root = self.bucket.rstrip("/")
        return f"file://{root}/{key}" if key else f"file://{root}"


def parse_uri(uri: str) -> Location:
    """s3://bucket[/prefix], file:///abs/dir[/prefix] or an absolute directory path."""
    if uri.startswith("/"):
        return Location("file", uri.rstrip("/") or "/", "")
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"{uri!r} has no bucket (expected s3://bucket/prefix)")
        prefix = parsed.path.strip("/")
        for seg in prefix.split("/") if prefix else []:
            if not _PREFIX_SEGMENT_RE.match(seg) or seg in (".", ".."):
                raise ValueError(f"{uri!r} has an unsafe key segment {seg!r}")
        return Location("s3", parsed.netloc, prefix)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{uri!r}: file:// URIs must be local (file:///path)")
        path = unquote(parsed.path)
        if not path.startswith("/"):
            raise ValueError(f"{uri!r}: file:// needs an absolute path")
        return Location("file", path.rstrip("/") or "/", "")
    raise ValueError(f"{uri!r} is not an s3:// or file:// URI")


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


class DirStore:
    """Objects as files under a root directory; create-if-absent via link(2)."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self.root = Path(location.bucket)

    def _path(self, key: str) -> Path:
        if any(part in ("", ".", "..") for part in key.split("/")):
            raise StoreError(f"unsafe key {key!r}")
        return self.root / key

    @staticmethod
    def _write_temp(path: Path, data: bytes) -> str:
        """A synced temporary file beside `path` holding `data` (the caller links or renames
        it into place, so readers never see a partial object)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return tmp

    def put_if_absent(self, key: str, data: bytes, content_type: str) -> bool:
        path = self._path(key)
        tmp = ""
        try:
            tmp = self._write_temp(path, data)
            os.chmod(tmp, 0o444)
            os.link(tmp, path)  # fails if the key exists: the If-None-Match of a directory
            return True
        except FileExistsError:
            pass
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
        finally:
            if tmp:
                Path(tmp).unlink(missing_ok=True)
        if not same_object(self, key, data):
            raise ConflictError(f"a different object already exists at {self.uri(key)}")
        return False

    def get(self, key: str, max_bytes: int) -> bytes:
        path = self._path(key)
        try:
            size = path.stat().st_size
            if size > max_bytes:
                raise TooLargeError(f"{self.uri(key)} is {size} bytes, more than {max_bytes}")
            return path.read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"no object at {self.uri(key)}") from None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None

    def put(self, key: str, data: bytes, content_type: str) -> None:
        path = self._path(key)
        tmp = ""
        try:
            tmp = self._write_temp(path, data)
            os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
        finally:
            if tmp:
                Path(tmp).unlink(missing_ok=True)

    def list(self, prefix: str, limit: int) -> list[Listed]:
        top = self._path(prefix)
        out: list[Listed] = []
        try:
            # Sorted walk, so the first `limit` are the first by key, as S3 lists them.
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames.sort()
                for name in sorted(filenames):
                    if name.startswith("."):
                        continue  # a temp file of a write in progress
                    path = Path(dirpath) / name
                    st = path.stat()
                    out.append(
                        Listed(path.relative_to(self.root).as_posix(), st.st_size, st.st_mtime)
                    )
        except OSError as exc:
            raise StoreError(f"cannot list {top}: {exc.strerror or exc}") from None
        out.sort(key=lambda o: o.key)
        return out[:limit]

    def uri(self, key: str) -> str:
        return self.location.uri(key)


def open_store(
    location: Location,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    timeout_s: float = 60.0,
    client: Any = None,
) -> Store:
    """A store for the location; ``client``: a boto3 S3 client to reuse (long-running callers
    open a store per operation, so that each gets its own deadline, without a new client)."""
    if location.scheme == "file":
        return DirStore(location)
    from .s3 import S3Store  # boto3 only where S3 is used

    return S3Store(
        location, endpoint_url=endpoint_url, region=region, timeout_s=timeout_s, client=client
    )
