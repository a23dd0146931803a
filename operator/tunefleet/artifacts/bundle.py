"""The cache archives an artifact carries (tuner_job/caches.py), in the store: where each one
lives, how publish uploads it and how fetch downloads, checks and unpacks it.

Key: ``<artifact base>/caches/<sha256>.tar.gz``, by the archive's own digest, so the same
cache published again is the same object (put_if_absent is idempotent), and a manifest kept
for byte-identical results still names archives that are there. Archives go up before the
payload and the manifest: a manifest in the store always has its caches.

Archives are gigabytes (FlashInfer's and DeepGEMM's JIT caches, Triton's on a GPU): nothing
here holds one in memory. Publish reads each from the tuner's file and uploads it in parts;
fetch streams each into a temporary file beside where it unpacks, hashing as it arrives, and
compares SHA-256 and size with the manifest before a single member is unpacked (a truncated,
oversized or altered archive never writes a file); it then unpacks from the file, each member
checked before it is written, and compares the counts. The temporary file goes whatever
happens. Before any of it, fetch checks that the bundle fits where it unpacks (`Room`).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunefleet.storage.store import Store, StoreError, get_file, put_file_if_absent
from tuner_job import caches as cc
from tuner_job.files import file_sha256
from tuner_job.manifest import Manifest

# The archive's bound as fetched (its unpacked bound is the cache's maxBytes, checked again
# when unpacking).
MAX_ARCHIVE_BYTES = 4 << 30
# Room left beside the caches for the stack to write into them as it runs (the volume is
# sized at the bundle's needs, once more its unpacked bytes, and this).
SLACK_BYTES = 64 << 20


def _zstandard(f: Any) -> Any:
    import zstandard

    return zstandard.ZstdDecompressor().stream_reader(f, closefd=False)


if importlib.util.find_spec("zstandard") is not None:  # the tunefleet image has it
    cc.ZSTD_READERS.append(_zstandard)


class BundleError(Exception):
    """A cache archive missing, or not what its manifest says."""


class NoRoom(BundleError):
    """The bundle cannot fit where the pod unpacks it: told, never a crash loop."""


def key(base: str, entry: cc.Packed) -> str:
    return "/".join(p for p in (base, "caches", f"{entry.sha256}{cc.PAYLOAD_SUFFIX}") if p)


def needs(entries: Iterable[cc.Packed]) -> int:
    """Bytes the caches take in a pod while fetch unpacks them: all of them unpacked, and the
    largest archive beside them (one is downloaded at a time, and removed once unpacked)."""
    listed = list(entries)
    return sum(e.bytes for e in listed) + max((e.size for e in listed), default=0)


def volume_bytes(entries: Iterable[cc.Packed]) -> int:
    """The caches volume's size: what fetch needs, and as much again as the caches unpack to
    for what the stack adds to them while it runs."""
    listed = list(entries)
    return needs(listed) + sum(e.bytes for e in listed) + SLACK_BYTES


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


@dataclass(frozen=True)
class Room:
    """Where fetch unpacks, and the most the pod may hold there (`limit`: the volume's
    sizeLimit as admission set it, or the pod's own ephemeral-storage budget; 0: no bound
    but the disk's)."""

    dest: Path
    limit: int = 0

    def check(self, manifest: Manifest) -> None:
        """NoRoom naming the bundle's needs and the room there is."""
        want = needs(manifest.caches)
        if self.limit and want > self.limit:
            raise NoRoom(
                f"the bundle needs {_gib(want)} on the pod's disk (its caches unpacked, "
                f"{_gib(sum(e.bytes for e in manifest.caches))}, and its largest archive "
                f"beside them), more than the {_gib(self.limit)} this pod may hold: raise "
                "the pod's ephemeral-storage limit, or make the caches smaller (maxBytes)"
            )
        try:
            self.dest.mkdir(parents=True, exist_ok=True)
            st = os.statvfs(self.dest)
        except OSError:
            return  # not knowable here: the writes themselves will say
        free = st.f_bavail * st.f_frsize
        if want > free:
            raise NoRoom(
                f"the bundle needs {_gib(want)} on the node's disk, and {self.dest} has "
                f"{_gib(free)} free: free the node's disk, or make the caches smaller"
            )


def check_local(entry: cc.Packed, path: Path) -> None:
    """One archive on disk against its manifest entry: the digest first (the pin, and the
    plainest word for a changed archive), then safe to unpack with the counts listed; all of
    it read a chunk at a time."""
    try:
        size, sha = file_sha256(path)
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc.strerror or exc}") from None
    if sha != entry.sha256:
        raise BundleError(f"{path} has SHA-256 {sha}, the manifest pins {entry.sha256}")
    try:
        with open(path, "rb") as f:
            index = cc.check_stream(f, max(entry.bytes, 1), str(path))
    except cc.CacheError as exc:
        raise BundleError(str(exc)) from None
    problem = cc.disagreement(entry, size, index)
    if problem:
        raise BundleError(problem)


def read_local(directory: Path, manifest: Manifest) -> dict[str, Path]:
    """Each listed archive in the tuner's output directory, checked (publish): by name, its
    file."""
    out: dict[str, Path] = {}
    for entry in manifest.caches:
        path = directory / entry.payload
        check_local(entry, path)
        out[entry.name] = path
    return out


def upload(store: Store, base: str, manifest: Manifest, archives: dict[str, Path]) -> None:
    for entry in manifest.caches:
        put_file_if_absent(store, key(base, entry), archives[entry.name], cc.CONTENT_TYPE)


def fetch_into(
    store: Store,
    base: str,
    manifest: Manifest,
    room: Room,
    timings: dict[str, float] | None = None,
) -> list[Path]:
    """Every listed cache downloaded, checked and unpacked into room.dest/<name>: a writable,
    pod-local copy (stacks write into their caches while they run; the shared copy is never
    theirs to change). BundleError names the first that is missing, wrong or does not fit;
    what was unpacked before it stays (the caller serves all or none)."""
    room.check(manifest)
    done: list[Path] = []
    clock = timings if timings is not None else {}
    for entry in manifest.caches:
        done.append(_fetch_one(store, base, entry, room.dest, clock))
    return done


def _fetch_one(
    store: Store, base: str, entry: cc.Packed, dest: Path, clock: dict[str, float]
) -> Path:
    target = dest / entry.name
    started = time.monotonic()
    where = f"cache {entry.name}"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{entry.name}.", suffix=".part", dir=dest)
    except OSError as exc:
        raise NoRoom(f"{where}: cannot write its archive into {dest}: {exc.strerror}") from None
    try:
        try:
            with os.fdopen(fd, "w+b") as f:  # read back too: a ranged download hashes so
                got = get_file(store, key(base, entry), f, min(MAX_ARCHIVE_BYTES, entry.size))
        except StoreError as exc:
            raise BundleError(f"{where}: {exc}") from None
        except OSError as exc:
            raise NoRoom(f"{where}: cannot write its archive into {dest}: {exc.strerror}") from None
        if got.sha256 != entry.sha256 or got.size != entry.size:
            raise BundleError(
                f"{where} has SHA-256 {got.sha256} in {got.size} bytes, the manifest pins "
                f"{entry.sha256} in {entry.size}: not unpacked"
            )
        downloaded = time.monotonic()
        clock["download"] = clock.get("download", 0.0) + downloaded - started
        try:
            index = cc.unpack_file(Path(tmp), target, max(entry.bytes, 1), where)
        except cc.Unwritable as exc:
            raise NoRoom(f"cannot unpack {where} into {target}: {exc}") from None
        except (cc.CacheError, OSError) as exc:
            raise BundleError(f"cannot unpack {where} into {target}: {exc}") from None
        clock["unpack"] = clock.get("unpack", 0.0) + time.monotonic() - downloaded
        problem = cc.disagreement(entry, got.size, index)
        if problem:
            cc.remove_tree(target)
            raise BundleError(problem)
        cc.kind_directories(entry.kind, target)
        return target
    finally:
        Path(tmp).unlink(missing_ok=True)
