"""Compacting a GEMM library: every entry is read and verified (what this gc cannot merge is
left alone), the good ones are merged by merge_results' rule into compacted entries of one row
per GEMM, and an old entry goes only when what stays covers each of its GEMMs with a row the
merge prefers or ties.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tunefleet.artifacts.library import MAX_ENTRY_BYTES, entry_sha256
from tunefleet.storage.store import Listed, NotFoundError, Store
from tuner_job.files import sha256_hex
from tuner_job.library import EntrySource, LibraryEntryError, make_entry, parse_entry
from tuner_job.results import ResultRow, ResultsFile, ResultsMerger, format_results

from .common import WORKERS, GcError
from .inventory import ENTRIES, Group, LibraryDir
from .plan import Plan, Write, deletion, kept_young

T = TypeVar("T")
R = TypeVar("R")
# Compacted entries stay well under the 4 MiB a reader takes per entry (MAX_ENTRY_BYTES).
CHUNK_BYTES = MAX_ENTRY_BYTES // 2
# What a compacted entry's source says: no profile (DNS names are never empty) and a revision
# no spec can have (revisions start with a letter or digit), so it is never taken for a
# publisher's entry.
COMPACTED_REVISION = "_compacted"
# The fields of an entry document this gc knows how to merge; an entry with more (a later
# schema's, e.g. the settings it was tuned with) is left as it is, never compacted.
ENTRY_FIELDS = frozenset(
    {"schema", "gpuModel", "key", "validators", "identity", "source", "results"}
)
READ_BATCH = 64  # entries fetched at once: bounds the bytes held while they are parsed
HELD_BYTES = 64 << 20  # entry bytes kept between the two passes over a library

# Why library objects are kept, as the report says it.
KEPT_ENTRY = "library entries holding a GEMM row no older entry has"
KEPT_COMPACT = "library entries already compact (one row per GEMM)"
KEPT_FOREIGN = "library objects that are not entries this gc can merge (left alone)"


@dataclass
class Entry:
    listed: Listed
    compacted: bool  # written by gc (its source's revision is COMPACTED_REVISION)
    data: bytes | None  # held between the passes while under HELD_BYTES


@dataclass
class LibraryRead:
    """The first pass over a library: its good entries, what they merge to, what was left."""

    entries: list[Entry] = field(default_factory=list)
    merged: ResultsMerger = field(default_factory=ResultsMerger)
    identity: dict[str, str] = field(default_factory=dict)
    foreign: int = 0  # objects that are not entries this gc can merge
    held: int = 0


def _entry_doc(data: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


@dataclass(frozen=True)
class Verified:
    source: EntrySource
    results: ResultsFile
    identity: dict[str, str]


def verify_entry(lib: LibraryDir, o: Listed, data: bytes) -> Verified:
    """parse_entry's checks, with the entry's own validators (the entries of one library key
    all have the key's); LibraryEntryError for what gc must not merge."""
    doc = _entry_doc(data)
    if doc is None or not isinstance(doc.get("validators"), dict):
        raise LibraryEntryError("not an entry document")
    unknown = set(doc) - ENTRY_FIELDS
    if unknown:
        raise LibraryEntryError(f"fields this gc does not know: {', '.join(sorted(unknown))}")
    sha = entry_sha256(o.key.rsplit("/", 1)[-1]) or ""
    validators = {str(k): str(v) for k, v in doc["validators"].items()}
    source, results = parse_entry(
        data, name_sha256=sha, key=lib.key, gpu_model=lib.gpu_model, validators=validators
    )
    identity = {str(k): str(v) for k, v in (doc.get("identity") or {}).items()}
    return Verified(source, results, identity)


def _fetch(store: Store, o: Listed) -> bytes | None:
    """An entry's bytes; None when it is gone (another gc) or over what readers take."""
    if o.size > MAX_ENTRY_BYTES:
        return None  # readers skip it too: merging it would change what they read
    try:
        return store.get(o.key, MAX_ENTRY_BYTES)
    except NotFoundError:
        return None


def read_entries(store: Store, lib: LibraryDir) -> LibraryRead:
    """First pass: fetch and verify every entry, merge the good ones (merge_results' rule)."""
    out = LibraryRead()
    listed = sorted(lib.entries, key=lambda o: (-o.modified, o.key))
    for batch in _batches(listed, READ_BATCH):
        for o, data in zip(batch, _parallel(lambda o: _fetch(store, o), batch), strict=True):
            _take(out, lib, o, data)
    return out


def _take(out: LibraryRead, lib: LibraryDir, o: Listed, data: bytes | None) -> None:
    if data is None:
        out.foreign += 1
        return
    try:
        got = verify_entry(lib, o, data)
    except LibraryEntryError:
        out.foreign += 1
        return
    out.identity = out.identity or got.identity  # one key, one identity
    out.merged.add(got.results)
    hold = out.held + len(data) <= HELD_BYTES
    out.held += len(data) if hold else 0
    compacted = got.source.revision == COMPACTED_REVISION and not got.source.profile
    out.entries.append(Entry(o, compacted, data if hold else None))


def _row_bytes(row: ResultRow) -> int:
    fields = (row.op, row.params, row.solution, row.ms_text or "", row.blas or "")
    return sum(len(f) + 1 for f in fields)


def _chunks(rows: Sequence[ResultRow]) -> Iterator[list[ResultRow]]:
    """Rows (sorted) in runs of at most CHUNK_BYTES of CSV: the same rows give the same cuts."""
    chunk: list[ResultRow] = []
    size = 0
    for row in rows:
        if chunk and size + _row_bytes(row) > CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(row)
        size += _row_bytes(row)
    if chunk:
        yield chunk


def compacted_entries(lib: LibraryDir, read: LibraryRead) -> list[tuple[str, bytes, ResultsFile]]:
    """(key, bytes, rows) of the entries that hold the library's merge, one row per GEMM."""
    merged = read.merged.result()
    out = []
    for rows in _chunks(merged.rows):
        results = ResultsFile(dict(merged.validators), rows)
        text = format_results(results)
        data = make_entry(
            gpu_model=lib.gpu_model,
            validators=merged.validators,
            identity=read.identity,
            source=EntrySource(lib.namespace, "", COMPACTED_REVISION, sha256_hex(text.encode())),
            results_text=text,
        )
        if len(data) > MAX_ENTRY_BYTES:
            raise GcError(f"a compacted entry of {lib.base} came out over {MAX_ENTRY_BYTES} bytes")
        out.append((f"{lib.base}/{sha256_hex(data)}.json", data, results))
    return out


def covered(kept: ResultsMerger, results: ResultsFile) -> bool:
    """Whether merging `results` into `kept` changes nothing: every GEMM of it is there with a
    row merge_results prefers or ties (ties keep the row already there)."""
    best = kept.best
    if any(r.key not in best for r in results.rows):
        return False
    trial = ResultsMerger()
    trial.add(ResultsFile(dict(results.validators), [best[r.key] for r in results.rows]))
    before = dict(trial.best)
    trial.add(results)
    return all(trial.best[k] is row for k, row in before.items())


def plan_library(plan: Plan, store: Store, lib: LibraryDir) -> None:
    read = read_entries(store, lib)
    plan.keep(KEPT_FOREIGN, read.foreign)
    chunks = compacted_entries(lib, read) if read.entries else []
    present = {e.listed.key: e for e in read.entries}
    # One entry holds each GEMM once already; rewriting it would only churn.
    if len(present) < 2 or set(present) == {key for key, _, _ in chunks}:
        plan.keep(KEPT_COMPACT, len(present))
        return
    where = plan.location.uri(lib.base)
    anchors = ResultsMerger()
    for key, data, results in chunks:
        there = present.pop(key, None)
        if there is None:
            plan.writes.append(Write(where, key, data, results.gemms))
        else:
            plan.keep(KEPT_COMPACT, 1)
        # A chunk written now is as young as can be: it covers deletions only with no grace.
        if not plan.rules.young(there.listed.modified if there else plan.rules.now):
            anchors.add(results)
    _supersede(plan, store, lib, list(present.values()), anchors)


def _supersede(
    plan: Plan, store: Store, lib: LibraryDir, rest: list[Entry], kept: ResultsMerger
) -> None:
    """Second pass, over the entries that are not this run's compaction: each old one goes if
    what stays covers it, else it stays and covers later ones. Compacted entries first, then
    the newest: they cover the most."""
    gone: list[Listed] = []
    for e in sorted(rest, key=lambda e: (not e.compacted, -e.listed.modified, e.listed.key)):
        if plan.rules.young(e.listed.modified):
            plan.keep(kept_young(plan.rules), 1)
            continue
        results = _reread(store, lib, e)
        if results is None:
            continue  # gone since the first pass: nothing to decide
        if covered(kept, results):
            gone.append(e.listed)
        else:
            kept.add(results)
            plan.keep(KEPT_ENTRY, 1)
    if gone:
        group = Group(ENTRIES, lib.base, gone)
        reason = (
            "every GEMM of each is in an entry that stays (a row as fast or faster), and that "
            "entry is older than the grace period"
        )
        plan.deletes.append(deletion(plan, group, reason))


def _reread(store: Store, lib: LibraryDir, e: Entry) -> ResultsFile | None:
    data = e.data if e.data is not None else _fetch(store, e.listed)
    if data is None:
        return None
    try:
        return verify_entry(lib, e.listed, data).results
    except LibraryEntryError:
        return None  # replaced by something else under the same name: leave it


def _batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _parallel(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    if len(items) < 2:
        return [fn(i) for i in items]
    with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return list(pool.map(fn, items))
