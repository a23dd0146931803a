"""The GEMM library, checkpoints and shard outputs in the object store (tunefleet's image).

Keys (``<prefix>`` is the storage URI's prefix):

* library, scope ``namespace`` (default):
  ``<prefix>/<namespace>/_library/<gpu-model>/<key>/<sha256 of entry>.json``;
  scope ``cluster``: ``<prefix>/_library/<gpu-model>/<key>/<sha256 of entry>.json``.
  Profile and namespace names are DNS labels, so ``_library`` never collides with either.
* checkpoint: ``<prefix>/<ns>/<profile>/<gpu-model>/_checkpoints/<revision>/<i>-of-<N>.json``
* shard output: ``<prefix>/<ns>/<profile>/<gpu-model>/_shards/<revision>/<i>-of-<N>/
  {results.csv,manifest.json}``

Library entries are append-only: each is written once (If-None-Match: *, SHA-256 checksum)
under the hash of its own bytes, never replaced, so two Jobs publishing at the same moment each
add their own object and lose nothing; readers list the key's prefix and merge. Checkpoints and
shard outputs are scratch, replaced by a retried pod.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tunefleet.storage.store import Listed, Location, Store, StoreError
from tuner_job.files import sha256_hex
from tuner_job.library import (
    CheckpointId,
    EntrySource,
    LibraryEntryError,
    Settings,
    library_key,
    make_entry,
    parse_entry,
)
from tuner_job.manifest import ArtifactId, Manifest
from tuner_job.results import ResultsFile, ResultsMerger, ValidatorMismatchError

SCOPES = ("namespace", "cluster")
LIBRARY_DIR = "_library"
CHECKPOINTS_DIR = "_checkpoints"
SHARDS_DIR = "_shards"

# Bounds on reading one library, for the sidecar's small memory limit: it keeps one row per
# distinct GEMM (~0.5 KB each), and parsing an entry takes ~1 KB per row while it lasts (a
# 4 MiB entry holds ~45,000 rows). Entries are read newest first, so whichever bound binds, what
# is left out is the oldest: past MAX_ENTRIES the rest is reported as skipped; an entry over
# MAX_ENTRY_BYTES, past MAX_TOTAL_BYTES, or that would take the library past MAX_GEMMS distinct
# GEMMs is skipped and reported too.
MAX_ENTRIES = 500
MAX_ENTRY_BYTES = 4 << 20
MAX_TOTAL_BYTES = 32 << 20
MAX_GEMMS = 100_000
MAX_LISTED = 100_000  # keys listed at most, to find the newest entries
MAX_CHECKPOINT_BYTES = 64 << 20

_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
_ENTRY_NAME_RE = re.compile(r"^([0-9a-f]{64})\.json$")


def entry_sha256(name: str) -> str | None:
    """The SHA-256 a library entry's object name claims (``<sha256>.json``), or None."""
    m = _ENTRY_NAME_RE.match(name)
    return m.group(1) if m else None


def check_scope(scope: str) -> str:
    if scope not in SCOPES:
        raise ValueError(f"library scope {scope!r} is not one of {', '.join(SCOPES)}")
    return scope


def check_revision(revision: str) -> str:
    if not _REVISION_RE.match(revision):
        raise ValueError(f"revision {revision!r} is not a key-safe name (letters, digits, - _)")
    return revision


def check_shard(shard: int, shards: int) -> None:
    if not 1 <= shards <= 1024 or not 0 <= shard < shards:
        raise ValueError(f"shard {shard} of {shards} is not 0..N-1 with N in 1..1024")


def library_prefix(location: Location, scope: str, namespace: str, gpu_model: str, key: str) -> str:
    check_scope(scope)
    if scope == "cluster":
        return location.key(LIBRARY_DIR, gpu_model, key)
    return location.key(namespace, LIBRARY_DIR, gpu_model, key)


@dataclass(frozen=True)
class Library:
    """One GEMM library: the store's location, the scope ("namespace" or "cluster"), the
    namespace (unused for the cluster scope), the GPU model and the identity's key."""

    location: Location
    scope: str
    namespace: str
    gpu_model: str
    key: str

    @property
    def prefix(self) -> str:
        return library_prefix(self.location, self.scope, self.namespace, self.gpu_model, self.key)


@dataclass(frozen=True)
class TunedRows:
    """Rows to add to a library, and what they were tuned as: the entry's fields
    (tuner_job/library.py make_entry)."""

    gpu_model: str
    validators: dict[str, str]
    identity: dict[str, str]
    source: EntrySource
    results_text: str
    settings: Settings | None = None


def checkpoint_key(location: Location, ident: CheckpointId) -> str:
    return location.key(
        ident.namespace,
        ident.profile,
        ident.gpu_model,
        CHECKPOINTS_DIR,
        ident.revision,
        f"{ident.shard}-of-{ident.shards}.json",
    )


def shard_base(location: Location, artifact: ArtifactId, shard: int, shards: int) -> str:
    a = artifact
    return location.key(
        a.namespace, a.profile, a.gpu_model, SHARDS_DIR, a.revision, f"{shard}-of-{shards}"
    )


@dataclass(frozen=True)
class Added:
    uri: str
    created: bool  # False: the identical entry was there already


def add_entry(
    store: Store, location: Location, scope: str, manifest: Manifest, results: bytes
) -> Added:
    """Add a published artifact to the library of its identity (create-only, own hash)."""
    key = manifest.extra.library_key
    computed = library_key(manifest.gpu_model, manifest.validators, manifest.identity)
    if key is not None and key != computed:
        raise StoreError(
            f"the manifest's libraryKey {key} is not its identity's key {computed}: not adding it"
        )
    source = EntrySource(
        manifest.namespace, manifest.profile, manifest.revision, manifest.results_sha256
    )
    return add_rows(
        store,
        location,
        scope,
        TunedRows(
            gpu_model=manifest.gpu_model,
            validators=manifest.validators,
            identity=manifest.identity,
            source=source,
            results_text=results.decode("utf-8"),
            settings=Settings.from_dict(manifest.extra.settings)
            if manifest.extra.settings
            else None,
        ),
    )


def add_rows(store: Store, location: Location, scope: str, rows: TunedRows) -> Added:
    """Add tuned rows to the library of their identity: a published artifact's, or what a
    stopped Job tuned before it was stopped (its sync sidecar's last act). `settings`: what
    they were tuned with (None: not recorded, so only readers that ask for none reuse them)."""
    entry = make_entry(
        gpu_model=rows.gpu_model,
        validators=rows.validators,
        identity=rows.identity,
        source=rows.source,
        results_text=rows.results_text,
        settings=rows.settings,
    )
    key = library_key(rows.gpu_model, rows.validators, rows.identity)
    prefix = library_prefix(location, scope, rows.source.namespace, rows.gpu_model, key)
    object_key = f"{prefix}/{sha256_hex(entry)}.json"
    created = store.put_if_absent(object_key, entry, "application/json")
    return Added(store.uri(object_key), created)


@dataclass
class LibraryView:
    """A library as read: the merged rows of every good entry, and what was skipped."""

    key: str
    results: ResultsFile | None = None  # None: no good entry with rows
    entries: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (object, reason)

    @property
    def gemms(self) -> int:
        return self.results.gemms if self.results is not None else 0


def _entries(store: Store, prefix: str, view: LibraryView) -> list[Listed]:
    """The entries listed under the key's prefix, newest first, at most MAX_ENTRIES; what is
    left out goes to view.skipped with why."""
    entries = []
    for o in store.list(prefix, MAX_LISTED):
        if "/" in o.key[len(prefix) + 1 :]:
            view.skipped.append((o.key, "not an entry (a nested key)"))
        else:
            entries.append(o)
    # Newest first, for every bound after: what was tuned recently (and what tunefleet-gc
    # compacted, which it writes anew) is what the fleet runs now. Ties go by key.
    entries.sort(key=lambda o: (-o.modified, o.key))
    for o in entries[MAX_ENTRIES:]:
        view.skipped.append((o.key, f"over the limit of {MAX_ENTRIES} entries read"))
    return entries[:MAX_ENTRIES]


def read_library(
    store: Store, library: Library, validators: dict[str, str], settings: Settings | None = None
) -> LibraryView:
    """List the key's entries, verify each, merge the good ones (merge_results' rule).
    settings: the reader's; entries tuned with weaker ones (or none recorded) are skipped.

    A listing failure raises StoreError (the caller reports it as the library's error); an entry
    that cannot be read, or is bad, is skipped and reported, never merged.
    """
    view = LibraryView(library.key)
    entries = _entries(store, library.prefix, view)
    merger = ResultsMerger()
    total = 0
    for o in entries:
        name = o.key.rsplit("/", 1)[-1]
        sha = entry_sha256(name)
        if sha is None:
            view.skipped.append((o.key, "name is not <sha256>.json"))
            continue
        if o.size > MAX_ENTRY_BYTES:
            view.skipped.append((o.key, f"{o.size} bytes, over the {MAX_ENTRY_BYTES} limit"))
            continue
        if total + o.size > MAX_TOTAL_BYTES:
            view.skipped.append((o.key, f"over the {MAX_TOTAL_BYTES} bytes read per library"))
            continue
        try:
            data = store.get(o.key, MAX_ENTRY_BYTES)
        except StoreError as exc:  # too large, gone, or the store failed: less to reuse
            view.skipped.append((o.key, f"not read: {exc}"))
            continue
        total += len(data)
        try:
            _, results = parse_entry(
                data,
                name_sha256=sha,
                key=library.key,
                gpu_model=library.gpu_model,
                validators=validators,
                settings=settings,
            )
            new = sum(1 for r in results.rows if r.key not in merger.best)
            if len(merger.best) + new > MAX_GEMMS:
                view.skipped.append((o.key, f"over the {MAX_GEMMS} GEMMs kept per library"))
                continue
            merger.add(results)
        except (LibraryEntryError, ValidatorMismatchError) as exc:
            view.skipped.append((o.key, str(exc)))
            continue
        view.entries += 1
    if view.entries:
        view.results = merger.result()
    return view
