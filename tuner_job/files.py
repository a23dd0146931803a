"""Small filesystem helpers shared by the tuner and by fetch (stdlib only)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write_bytes(
    path: str | Path, data: bytes, mode: int = 0o644, *, fsync: bool = True
) -> None:
    """Write via a temp file in the same directory and rename: readers see all or nothing.

    fsync=False for files rewritten often whose loss in a machine crash does not matter (they
    live in the pod's emptyDir, gone with the pod anyway): the rename alone keeps them whole.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_termination_log(path: str | None, message: str) -> None:
    """Best effort: Kubernetes shows this file's text in the pod's status.

    The default /dev/termination-log is written only when it already exists (the kubelet
    creates it in a container), so running a CLI on a workstation never creates files in /dev.
    """
    if not path:
        return
    p = Path(path)
    if path == "/dev/termination-log" and not p.exists():
        return
    with contextlib.suppress(OSError):
        p.write_text(message if message.endswith("\n") else message + "\n", encoding="utf-8")


# --- streams: files of any size in bounded memory ------------------------------------------
# A cache archive is up to gigabytes: it is hashed, copied and unpacked a chunk at a time, and
# the page cache its writes and reads leave behind is handed back as it goes. A container's
# memory cgroup counts that page cache as the container's own, so without it a fetch of a
# 1 GiB bundle would show 1 GiB of "memory" (and crowd the node's real users out of theirs),
# though it holds a few MiB.
CHUNK = 1 << 20
# How much a writer lets pile up before it syncs and drops it (fdatasync, then DONTNEED: only
# clean pages can be dropped).
DROP_EVERY = 2 << 20


def drop_cache(fd: int, *, written: bool, start: int = 0, length: int = 0) -> None:
    """Hand back the page cache of one open file, or of `length` bytes from `start` (0: to
    its end) (written: sync it first, so its pages are clean and can go). Best effort: a
    filesystem without fadvise keeps its cache."""
    with contextlib.suppress(OSError, AttributeError):
        if written:
            os.fdatasync(fd)
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)


class TooLarge(ValueError):
    """A stream went past its bound."""


class HashingWriter:
    """A binary file's writer that hashes and counts what passes through, refuses to grow
    past `limit` bytes, and drops the page cache behind itself every DROP_EVERY bytes."""

    def __init__(self, f: Any, limit: int | None = None, what: str = "") -> None:
        self.f = f
        self.limit = limit
        self.what = what or getattr(f, "name", "stream")
        self.hash = hashlib.sha256()
        self.size = 0
        self._pending = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = len(data)
        if self.limit is not None and self.size + n > self.limit:
            raise TooLarge(f"{self.what} is more than {self.limit} bytes")
        self.f.write(data)
        self.hash.update(data)
        self.size += n
        self._pending += n
        if self._pending >= DROP_EVERY:
            self.drop()
        return n

    def drop(self) -> None:
        self._pending = 0
        # Only a file on disk has a cache to drop. Over a compressor (a gzip stream's
        # plain side) nothing is dropped: its flush would write a sync marker into the
        # stream, and its fileno is the file underneath, which may be no file at all.
        if not isinstance(self.f, io.BufferedWriter | io.BufferedRandom | io.FileIO):
            return
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            self.f.flush()
            drop_cache(self.f.fileno(), written=True)

    def flush(self) -> None:
        self.f.flush()

    def tell(self) -> int:
        return self.size

    def hexdigest(self) -> str:
        return self.hash.hexdigest()


def open_once(path: str | Path) -> Any:
    """A file to read once, front to back, in CHUNK reads and without the kernel's readahead:
    its window (8 MiB on some disks, twice that while it ramps up) would sit in the reader's
    memory cgroup as page cache, where a streamed fetch is meant to hold a few MiB. 1 MiB
    reads keep the disk's throughput (well above gunzip's) without it."""
    f = open(path, "rb", buffering=CHUNK)  # noqa: SIM115 (the caller closes it)
    with contextlib.suppress(OSError, AttributeError):
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
    return f


def file_sha256(path: str | Path) -> tuple[int, str]:
    """(size, SHA-256) of a file, read a chunk at a time, its page cache dropped as it goes."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        fd = f.fileno()
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
            if size % DROP_EVERY < CHUNK:
                drop_cache(fd, written=False)
        drop_cache(fd, written=False)
    return size, h.hexdigest()


class DroppingReader:
    """A binary file's reader that drops the page cache behind itself (a GB archive read once
    to unpack leaves nothing charged to the reader)."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self._since = 0

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.f.read(n)
        self._since += len(data)
        if self._since >= DROP_EVERY:
            self._since = 0
            with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
                drop_cache(self.f.fileno(), written=False)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.f.close()


def copy_file(src: str | Path, dst: str | Path) -> int:
    """src copied to a new file dst a chunk at a time, neither file's page cache kept; its
    size."""
    with open_once(src) as f, open(dst, "xb") as out:
        w = HashingWriter(out, what=str(dst))
        reader = DroppingReader(f)
        while chunk := reader.read(CHUNK):
            w.write(chunk)
        w.drop()
        return w.size
