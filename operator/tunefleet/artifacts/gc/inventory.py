"""What the store holds, sorted by the layouts tunefleet writes: artifacts (by namespace,
profile and GPU model), each revision's checkpoints and shard outputs, the GEMM libraries'
entries, and objects of no layout tunefleet writes (left alone). All of it is listed once,
before anything is decided.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tunefleet.artifacts import signing
from tunefleet.artifacts.library import (
    CHECKPOINTS_DIR,
    LIBRARY_DIR,
    SHARDS_DIR,
    check_revision,
    entry_sha256,
)
from tunefleet.contracts.fleet import FLEET_DIR
from tunefleet.storage.store import Listed, Location, Store, check_key_parts
from tuner_job import caches as cc
from tuner_job.output import MANIFEST_NAME, RESULTS_NAME

from .common import SHA_RE, GcError

# gc lists everything before deciding (a partial listing could make an old artifact look like
# the newest): past this many objects it stops and asks for --namespace.
MAX_OBJECTS = 1_000_000
# Deletion order: the manifest first, so no manifest is ever without its payload or caches.
# Its signature (storage.signing on an object store) goes with the artifact.
ARTIFACT_FILES = (
    MANIFEST_NAME, RESULTS_NAME, cc.INDEX_NAME, MANIFEST_NAME + signing.BLOB_SIGNATURE_SUFFIX,
)  # fmt: skip
# An artifact's cache archives (artifacts/bundle.py): <base>/caches/<sha256>.tar.gz.
_CACHE_RE = re.compile(r"^[0-9a-f]{64}" + re.escape(cc.PAYLOAD_SUFFIX) + "$")
_CHECKPOINT_RE = re.compile(r"^[0-9]+-of-[0-9]+\.json$")
_SHARD_RE = re.compile(r"^[0-9]+-of-[0-9]+$")

# The kinds of group, as the report names them.
ARTIFACT = "artifact"
CHECKPOINTS = "checkpoints"
SHARDS = "shards"
ENTRIES = "library entries"


@dataclass
class Group:
    """Objects that are kept or deleted together: one artifact, or one revision's scratch."""

    kind: str
    base: str  # the group's key prefix (a "directory")
    objects: list[Listed] = field(default_factory=list)

    @property
    def newest(self) -> float:
        return max(o.modified for o in self.objects)

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)

    @property
    def complete(self) -> bool:
        return any(o.key.endswith("/" + MANIFEST_NAME) for o in self.objects)

    def ordered_keys(self) -> tuple[str, ...]:
        """Manifests first: publish writes results.csv first, so a manifest always has them."""
        ranked = sorted(self.objects, key=lambda o: (not o.key.endswith(MANIFEST_NAME), o.key))
        return tuple(o.key for o in ranked)


@dataclass
class LibraryDir:
    """One library: ``[<ns>/]_library/<model>/<key>/``; namespace "" is the cluster scope."""

    base: str
    namespace: str
    gpu_model: str
    key: str
    entries: list[Listed] = field(default_factory=list)


@dataclass
class Inventory:
    artifacts: dict[tuple[str, str, str], dict[str, Group]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    scratch: dict[tuple[str, str, str, str, str], Group] = field(default_factory=dict)
    libraries: dict[str, LibraryDir] = field(default_factory=dict)
    unknown: list[Listed] = field(default_factory=list)
    listed: int = 0
    listed_bytes: int = 0


def _names_ok(namespace: str, profile: str, gpu_model: str) -> bool:
    try:
        check_key_parts(namespace, profile, gpu_model)
    except ValueError:
        return False
    return True


def _revision_ok(revision: str) -> bool:
    try:
        check_revision(revision)
    except ValueError:
        return False
    return True


def _library_place(parts: list[str]) -> tuple[str, str, str] | None:
    """(namespace, model, key) of a library entry's path, or None."""
    if len(parts) == 4 and parts[0] == LIBRARY_DIR:
        namespace, model, key, name = "", parts[1], parts[2], parts[3]
    elif len(parts) == 5 and parts[1] == LIBRARY_DIR:
        namespace, model, key, name = parts[0], parts[2], parts[3], parts[4]
    else:
        return None
    names_ok = _names_ok(namespace or "x", "x", model)
    if not names_ok or not SHA_RE.match(key) or entry_sha256(name) is None:
        return None
    return namespace, model, key


def _scratch_place(parts: list[str]) -> tuple[str, str] | None:
    """(kind, revision) of a checkpoint or shard output's path (below <ns>/<profile>/<model>)."""
    if len(parts) == 6 and parts[3] == CHECKPOINTS_DIR and _CHECKPOINT_RE.match(parts[5]):
        kind = CHECKPOINTS
    elif (
        len(parts) == 7
        and parts[3] == SHARDS_DIR
        and _SHARD_RE.match(parts[5])
        and parts[6] in ARTIFACT_FILES
    ):
        kind = SHARDS
    else:
        return None
    return (kind, parts[4]) if _revision_ok(parts[4]) else None


def classify(location: Location, listed: Iterable[Listed]) -> Inventory:
    """Sort every listed object into the groups the rules judge; exact depths only, so a store
    nested under this one (another profile's prefix) never reads as this one's objects."""
    inv = Inventory()
    skip = len(location.prefix) + 1 if location.prefix else 0
    for o in listed:
        inv.listed += 1
        inv.listed_bytes += o.size
        parts = o.key[skip:].split("/")
        if parts[0] == FLEET_DIR:
            continue  # the fleet's objects: fleet_objects.py reads and judges them
        if not _place(inv, location, parts, o):
            inv.unknown.append(o)
    return inv


def _place(inv: Inventory, location: Location, parts: list[str], o: Listed) -> bool:
    lib = _library_place(parts)
    if lib is not None:
        base = o.key.rsplit("/", 1)[0]
        inv.libraries.setdefault(base, LibraryDir(base, *lib)).entries.append(o)
        return True
    if len(parts) < 5 or not _names_ok(parts[0], parts[1], parts[2]):
        return False
    owner = (parts[0], parts[1], parts[2])
    in_artifact = (len(parts) == 5 and parts[4] in ARTIFACT_FILES) or (
        len(parts) == 6 and parts[4] == "caches" and bool(_CACHE_RE.match(parts[5]))
    )
    if in_artifact and SHA_RE.match(parts[3]):
        base = location.key(*parts[:4])
        inv.artifacts[owner].setdefault(parts[3], Group(ARTIFACT, base)).objects.append(o)
        return True
    scratch = _scratch_place(parts)
    if scratch is None:
        return False
    base = location.key(*parts[:5])
    inv.scratch.setdefault((*owner, *scratch), Group(scratch[0], base)).objects.append(o)
    return True


def list_store(store: Store, location: Location, namespaces: Sequence[str] | None) -> Inventory:
    """One listing of everything gc may touch: the whole prefix, or the given namespaces and
    the cluster-scope library (which no namespace owns)."""
    prefixes = (
        [location.prefix]
        if namespaces is None
        else [location.key(ns) for ns in namespaces] + [location.key(LIBRARY_DIR)]
    )
    listed: list[Listed] = []
    for prefix in prefixes:
        got = store.list(prefix, MAX_OBJECTS + 1 - len(listed))
        listed += got
        if len(listed) > MAX_OBJECTS:
            raise GcError(
                f"{store.uri(prefix)} holds more than {MAX_OBJECTS} objects: gc lists everything "
                "before it decides; collect part of it at a time with --namespace"
            )
    return classify(location, listed)
