"""A directory as the artifact store: ``pvc://<claim>/<prefix>`` in the cluster, ``file:///dir``
on one machine.

``pvc://`` lets a cluster without object storage use tunefleet: tunefleet's containers (the
tuning pod's sync and publish steps, the merge Job, the model pod's fetch) mount the
PersistentVolumeClaim at ``/tunefleet/store`` and read and write files there, with no
credentials at all. The claim must be in the profile's namespace, and ReadWriteMany when the
tuning pods and model pods of a namespace run on more than one node. ``file://`` is the same
store on a path of this machine (scripts/gpu-check.sh, unit tests, the plugin beside a mount).

Create-if-absent is link(2) of a synced temporary file: the If-None-Match of a directory.
A conditional replace (If-Match) holds an flock(2) on a lock file beside the object while it
compares the object's SHA-256 (its tag) and renames the new version into place; `create` takes
the same lock, so neither can slip between the other's check and write.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO
from urllib.parse import ParseResult, unquote

from tuner_job.files import DroppingReader, file_sha256

from .store import (
    ConflictError,
    Listed,
    Location,
    NotFoundError,
    PodStorage,
    Received,
    StoreError,
    StoreOptions,
    Tagged,
    TooLargeError,
    check_prefix,
    same_object,
    write_hashed,
)

SCHEMES: tuple[str, ...] = ("pvc", "file")
VOLUME = "tunefleet-store"
MOUNT_PATH = "/tunefleet/store"
# tunefleet's image runs as this group (builders/security.py): fsGroup makes the claim's
# files writable for it on volume types that honour fsGroup.
FS_GROUP = 65532
_CLAIM_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def parse(uri: str, parsed: ParseResult) -> Location:
    if parsed.scheme == "pvc":
        claim = parsed.netloc
        if not _CLAIM_RE.match(claim):
            raise ValueError(f"{uri!r}: {claim!r} is not a PersistentVolumeClaim name")
        return Location("pvc", claim, check_prefix(uri, parsed.path.strip("/")))
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"{uri!r}: file:// URIs must be local (file:///path)")
    path = unquote(parsed.path)
    if not path.startswith("/"):
        raise ValueError(f"{uri!r}: file:// needs an absolute path")
    return Location("file", path.rstrip("/") or "/", "")


def open_store(location: Location, options: StoreOptions) -> DirStore:
    if location.scheme == "pvc":
        return DirStore(location, Path(options.pvc_root))
    return DirStore(location, Path(location.bucket))


def session(options: StoreOptions) -> StoreOptions:
    return options  # nothing to keep between operations


def pod_storage(
    location: Location, *, read_only: bool, secret: str, endpoint: str, region: str
) -> PodStorage:
    """The claim, mounted where the CLIs look for it; no credentials (the volume is access)."""
    if location.scheme != "pvc":
        raise ValueError(f"{location.uri()} is not reachable from a pod: use s3:// or pvc://")
    return PodStorage(
        args=["--pvc-root", MOUNT_PATH],
        volumes=[
            {
                "name": VOLUME,
                "persistentVolumeClaim": {"claimName": location.bucket, "readOnly": read_only},
            }
        ],
        mounts=[{"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": read_only}],
        fs_group=None if read_only else FS_GROUP,
    )


class DirStore:
    """Objects as files under a root directory."""

    def __init__(self, location: Location, root: Path | None = None) -> None:
        self.location = location
        self.root = root if root is not None else Path(location.bucket)

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

    @contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def create(self, key: str, data: bytes, content_type: str) -> bool:
        path = self._path(key)
        tmp = ""
        try:
            with self._locked(path):
                tmp = self._write_temp(path, data)
                os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
        finally:
            if tmp:
                Path(tmp).unlink(missing_ok=True)

    def read_tagged(self, key: str, max_bytes: int) -> Tagged:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > max_bytes:
                    # Hashed as it streams (bounded memory), from the file opened: a version
                    # renamed into place meanwhile leaves this tag stale, so replace_if fails.
                    return Tagged(b"", _tag(f), size)
                data = f.read()
        except FileNotFoundError:
            raise NotFoundError(f"no object at {self.uri(key)}") from None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
        return Tagged(data, hashlib.sha256(data).hexdigest())

    def replace_if(self, key: str, data: bytes, content_type: str, tag: str) -> bool:
        path = self._path(key)
        tmp = ""
        try:
            with self._locked(path):
                try:
                    with open(path, "rb") as f:
                        now = _tag(f)  # streamed: the version replaced may be any size
                except FileNotFoundError:
                    return False
                if now != tag:
                    return False
                tmp = self._write_temp(path, data)
                os.replace(tmp, path)
                tmp = ""
            return True
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
        finally:
            if tmp:
                Path(tmp).unlink(missing_ok=True)

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

    # -- objects of any size (store.Streams) ------------------------------------------------

    def get_file(self, key: str, dest: BinaryIO, max_bytes: int) -> Received:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > max_bytes:
                    raise TooLargeError(f"{self.uri(key)} is {size} bytes, more than {max_bytes}")
                return write_hashed(DroppingReader(f), dest, max_bytes, self.uri(key))
        except FileNotFoundError:
            raise NotFoundError(f"no object at {self.uri(key)}") from None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None

    def put_file_if_absent(self, key: str, path: Path, content_type: str) -> bool:
        target = self._path(key)
        tmp = ""
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                write_hashed(DroppingReader(src), out, 1 << 62, str(path))
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o444)
            os.link(tmp, target)
            return True
        except FileExistsError:
            pass
        except OSError as exc:
            raise StoreError(f"cannot write {target}: {exc.strerror or exc}") from None
        finally:
            if tmp:
                Path(tmp).unlink(missing_ok=True)
        if file_sha256(target) != file_sha256(path):
            raise ConflictError(f"a different object already exists at {self.uri(key)}")
        return False

    def put(self, key: str, data: bytes, content_type: str) -> None:
        path = self._path(key)
        tmp = ""
        try:
            tmp = self._write_temp(path, data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
        finally:
            if tmp:
                Path(tmp).unlink(missing_ok=True)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot delete {path}: {exc.strerror or exc}") from None

    def list(self, prefix: str, limit: int) -> list[Listed]:
        top = self._path(prefix) if prefix else self.root  # "": the whole store
        out: list[Listed] = []
        try:
            # Sorted walk, so the first `limit` are the first by key, as S3 lists them.
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames.sort()
                for name in sorted(filenames):
                    if name.startswith("."):
                        continue  # a temp file of a write in progress
                    path = Path(dirpath) / name
                    try:
                        st = path.stat()
                    except FileNotFoundError:
                        continue  # deleted since the walk saw it (tunefleet-gc): not listed
                    out.append(
                        Listed(path.relative_to(self.root).as_posix(), st.st_size, st.st_mtime)
                    )
        except OSError as exc:
            raise StoreError(f"cannot list {top}: {exc.strerror or exc}") from None
        out.sort(key=lambda o: o.key)
        return out[:limit]

    def uri(self, key: str) -> str:
        return self.location.uri(key)


def _tag(f: io.BufferedReader) -> str:
    """An object's version tag (read_tagged, replace_if): the SHA-256 of its bytes."""
    return hashlib.file_digest(f, "sha256").hexdigest()
