"""The cache archives an artifact carries (tuner_job/caches.py), in the store: where each one
lives, how publish uploads it and how fetch downloads, checks and unpacks it.

Key: ``<artifact base>/caches/<sha256>.tar.gz``, by the archive's own digest, so the same
cache published again is the same object (put_if_absent is idempotent), and a manifest kept
for byte-identical results still names archives that are there. Archives go up before the
payload and the manifest: a manifest in the store always has its caches.
"""

from __future__ import annotations

from pathlib import Path

from tunefleet.storage.store import Store, StoreError
from tuner_job import caches as cc
from tuner_job.files import sha256_hex
from tuner_job.manifest import Manifest

# The archive's bound as fetched (its unpacked bound is the cache's maxBytes, checked again
# when unpacking): what a pod's emptyDir and a ConfigMap-less delivery can take.
MAX_ARCHIVE_BYTES = 4 << 30


class BundleError(Exception):
    """A cache archive missing, or not what its manifest says."""


def key(base: str, entry: cc.Packed) -> str:
    return "/".join(p for p in (base, "caches", f"{entry.sha256}{cc.PAYLOAD_SUFFIX}") if p)


def checked(entry: cc.Packed, data: bytes, source: str) -> cc.Index:
    """The archive against its manifest entry: the digest first (the pin, and the plainest
    word for a changed archive), then safe to unpack with the counts the manifest lists."""
    sha = sha256_hex(data)
    if sha != entry.sha256:
        raise BundleError(f"{source} has SHA-256 {sha}, the manifest pins {entry.sha256}")
    try:
        index = cc.check_archive(data, max(entry.bytes, 1), source)
    except cc.CacheError as exc:
        raise BundleError(str(exc)) from None
    problem = cc.disagreement(entry, data, index)
    if problem:
        raise BundleError(problem)
    return index


def read_local(directory: Path, manifest: Manifest) -> dict[str, bytes]:
    """Each listed archive from the tuner's output directory, checked (publish)."""
    out: dict[str, bytes] = {}
    for entry in manifest.caches:
        path = directory / entry.payload
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise BundleError(f"cannot read {path}: {exc.strerror or exc}") from None
        checked(entry, data, str(path))
        out[entry.name] = data
    return out


def upload(store: Store, base: str, manifest: Manifest, archives: dict[str, bytes]) -> None:
    for entry in manifest.caches:
        store.put_if_absent(key(base, entry), archives[entry.name], cc.CONTENT_TYPE)


def download(store: Store, base: str, manifest: Manifest) -> dict[str, bytes]:
    """Each listed archive, checked; BundleError names the first that is missing or wrong."""
    out: dict[str, bytes] = {}
    for entry in manifest.caches:
        try:
            data = store.get(key(base, entry), min(MAX_ARCHIVE_BYTES, entry.size + 1))
        except StoreError as exc:
            raise BundleError(f"cache {entry.name}: {exc}") from None
        checked(entry, data, f"cache {entry.name}")
        out[entry.name] = data
    return out


def unpack(archives: dict[str, bytes], manifest: Manifest, dest: Path) -> list[Path]:
    """Every archive into dest/<name>: a writable, pod-local copy (stacks write into their
    caches while they run; the shared copy is never theirs to change)."""
    done: list[Path] = []
    for entry in manifest.caches:
        target = dest / entry.name
        try:
            cc.unpack(archives[entry.name], target, max(entry.bytes, 1), f"cache {entry.name}")
        except (cc.CacheError, OSError) as exc:
            raise BundleError(f"cannot unpack cache {entry.name} into {target}: {exc}") from None
        done.append(target)
    return done
