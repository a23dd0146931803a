"""tunefleet-gc: delete what the artifact store no longer needs and compact each GEMM library.

Keys are content addressed and never overwritten, so without this everything accumulates:
superseded artifacts, checkpoints and shard outputs after the merge, and library entries that
repeat the rows they reused. What is kept and what goes (docs/gc.md says the same):

* **Artifacts** (``<prefix>/<ns>/<profile>/<model>/<sha256>/``): every one named by a profile's
  ``status.artifacts`` or ``status.history``, and the newest N (``--keep``) complete ones of each
  (namespace, profile, GPU model), whether or not the profile still exists. The rest goes.
* **Checkpoints and shard outputs** (``.../_checkpoints/<revision>/``, ``.../_shards/<revision>/``)
  of a revision that is published (its artifact is in the profile's status), superseded (no
  longer the profile's current revision), of a GPU model the spec dropped, or of a profile that
  is gone. Scratch of a current, unpublished revision is what a retried pod resumes from and
  what the merge Job reads: kept.
* **Library entries** (``<prefix>/[<ns>/]_library/<model>/<key>/<sha256>.json``): every good
  entry is merged by merge_results' rule (a timed solution beats a placeholder, the faster
  wins) into compacted entries, one row per GEMM, written first (create-only, under their own
  hash). An entry is deleted only when every GEMM of it is in an entry that stays and is older
  than the grace period, with a row the merge prefers or ties: a reader that listed the library
  before that entry existed has been reading for longer than the grace, so no reader in flight
  loses a row, and what readers merge is the same before and after.
* Nothing younger than the grace period (``--grace``) is deleted, whatever the rules say:
  artifacts being published right now (not yet in any status), scratch being written, entries
  just added. Objects of no layout tunefleet writes are left alone.

It reads the TuningProfiles through the API server (kubeconfig, or the pod's ServiceAccount)
and lists the store before deciding anything: a store it cannot reach, a profile list it cannot
read or a bad URI end it with one line and exit 1 (2 for bad arguments), nothing deleted. A dry
run (the default) writes and deletes nothing and reports what would go and why; ``--apply``
writes the compacted entries, then deletes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from tunefleet import GROUP, PLURAL, VERSION, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.contracts.admission import Admission
from tunefleet.contracts.artifact import ArtifactRecord
from tunefleet.storage import cli as storage_cli
from tunefleet.storage.filesystem import DirStore
from tunefleet.storage.registry import open_store, parse_uri
from tunefleet.storage.store import (
    Listed,
    Location,
    NotFoundError,
    Store,
    StoreError,
    StoreOptions,
    check_key_parts,
)
from tuner_job.files import sha256_hex
from tuner_job.library import EntrySource, LibraryEntryError, make_entry, parse_entry
from tuner_job.output import MANIFEST_NAME, RESULTS_NAME
from tuner_job.results import ResultRow, ResultsFile, ResultsMerger, format_results

from ..library import (
    CHECKPOINTS_DIR,
    LIBRARY_DIR,
    MAX_ENTRY_BYTES,
    SHARDS_DIR,
    check_revision,
    entry_sha256,
)

PROG = "tunefleet-gc"
T = TypeVar("T")
R = TypeVar("R")

DEFAULT_KEEP = 3
DEFAULT_GRACE_S = 6 * 3600.0
# --apply refuses a shorter grace: a publish runs up to ~4 minutes between its results.csv and
# its manifest (the imageID wait), a library read takes up to 240 s, and the operator writes an
# artifact into status only after publish ends.
MIN_APPLY_GRACE_S = 600.0
# gc lists everything before deciding (a partial listing could make an old artifact look like
# the newest): past this many objects it stops and asks for --namespace.
MAX_OBJECTS = 1_000_000
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
WORKERS = 8  # concurrent store requests (reads of entries, deletions of groups)
READ_BATCH = 64  # entries fetched at once: bounds the bytes held while they are parsed
HELD_BYTES = 64 << 20  # entry bytes kept between the two passes over a library
PROFILE_PAGE = 500
REQUEST_TIMEOUT = (5, 60)  # (connect, read) seconds per API request

ARTIFACT_FILES = (MANIFEST_NAME, RESULTS_NAME)  # deletion order: no manifest without results
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_CHECKPOINT_RE = re.compile(r"^[0-9]+-of-[0-9]+\.json$")
_SHARD_RE = re.compile(r"^[0-9]+-of-[0-9]+$")
_DURATION_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd]?)$")


def clock() -> float:
    """Now, for the ages the rules judge (the tests move it)."""
    return time.time()


class GcError(Exception):
    """An expected failure: one line saying what happened and what to fix (exit 1)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class UsageError(GcError):
    """A bad argument (exit 2)."""


# --- what the store holds ---------------------------------------------------------------------

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


def store_uri(location: Location) -> str:
    """The store's own URI, prefix included (Location.uri() alone is the bucket's)."""
    return location.uri(location.prefix)


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
    if not names_ok or not _SHA_RE.match(key) or entry_sha256(name) is None:
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
    if len(parts) == 5 and _SHA_RE.match(parts[3]) and parts[4] in ARTIFACT_FILES:
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


# --- what the profiles say --------------------------------------------------------------------

# (namespace, profile, GPU model, sha256) of an artifact directory.
ArtifactId = tuple[str, str, str, str]


@dataclass(frozen=True)
class ProfileFacts:
    namespace: str
    name: str
    revisions: frozenset[str]  # current: the status's and the spec's (both, when they differ)
    models: frozenset[str] | None  # the spec's GPU models; None when the spec does not parse
    published: frozenset[tuple[str, str]]  # (model, revision) of status.artifacts and history


@dataclass
class Fleet:
    profiles: dict[tuple[str, str], ProfileFacts] = field(default_factory=dict)
    referenced: set[ArtifactId] = field(default_factory=set)
    pinned: set[ArtifactId] = field(default_factory=set)  # by model pods that still run
    using_store: int = 0  # profiles whose spec.storage.uri is this store


def _artifact_ids(record: ArtifactRecord, namespace: str, name: str) -> set[ArtifactId]:
    """Both readings of a status entry: its URI's last four segments, and the profile's own
    names with the entry's model and SHA-256. Either one keeps the artifact."""
    ids: set[ArtifactId] = set()
    tail = record.uri.rstrip("/").split("/")[-4:]
    if len(tail) == 4 and _SHA_RE.match(tail[3]):
        ids.add((tail[0], tail[1], tail[2], tail[3]))
    if record.gpu_model and _SHA_RE.match(record.sha256):
        ids.add((namespace, name, record.gpu_model, record.sha256))
    return ids


def _spec_facts(spec: Any) -> tuple[str | None, frozenset[str] | None]:
    """(revision, GPU models) of a spec the operator can read; Nones otherwise."""
    try:
        parsed = TuningProfileSpec.model_validate(spec or {})
        return naming.revision(parsed), frozenset(parsed.gpu.models)
    except (ValidationError, ValueError):
        return None, None


def _same_store(spec: Any, location: Location) -> bool:
    """Whether spec.storage.uri is this store (read as it is: an invalid spec still says)."""
    storage = spec.get("storage") if isinstance(spec, dict) else None
    uri = storage.get("uri") if isinstance(storage, dict) else None
    try:
        return isinstance(uri, str) and parse_uri(uri) == location
    except ValueError:
        return False


def add_profile(fleet: Fleet, doc: dict[str, Any], location: Location) -> None:
    meta = doc.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    raw = doc.get("status")
    status: dict[str, Any] = raw if isinstance(raw, dict) else {}
    spec_revision, models = _spec_facts(doc.get("spec"))
    revisions = {r for r in (status.get("revision"), spec_revision) if isinstance(r, str) and r}
    published: set[tuple[str, str]] = set()
    for where in ("artifacts", "history"):
        for entry in status.get(where) or []:
            record = ArtifactRecord.from_status(entry) if isinstance(entry, dict) else None
            if record is None:
                continue
            published.add((record.gpu_model, record.revision))
            fleet.referenced |= _artifact_ids(record, namespace, name)
    fleet.profiles[(namespace, name)] = ProfileFacts(
        namespace, name, frozenset(revisions), models, frozenset(published)
    )
    fleet.using_store += _same_store(doc.get("spec"), location)


def pinned_ids(uris: Iterable[str]) -> set[ArtifactId]:
    """The artifacts model pods were pinned to at admission, by their URIs' last four
    segments (`<ns>/<profile>/<model>/<sha256>`)."""
    ids: set[ArtifactId] = set()
    for uri in uris:
        tail = uri.rstrip("/").split("/")[-4:]
        if len(tail) == 4 and _SHA_RE.match(tail[3]):
            ids.add((tail[0], tail[1], tail[2], tail[3]))
    return ids


def fleet_of(
    docs: Iterable[dict[str, Any]], location: Location, pinned: Iterable[str] = ()
) -> Fleet:
    fleet = Fleet()
    for doc in docs:
        add_profile(fleet, doc, location)
    fleet.pinned = pinned_ids(pinned)
    return fleet


def read_profiles(
    kubeconfig: str | None, context: str | None, namespaces: Sequence[str] | None
) -> list[dict[str, Any]]:
    """Every TuningProfile (cluster-wide, or in each of `namespaces`), page by page."""
    from tunefleet.plugin.cluster import connect
    from tunefleet.plugin.errors import PluginError

    try:
        cluster = connect(kubeconfig, context, None)
    except PluginError as e:
        raise GcError(str(e)) from None
    docs: list[dict[str, Any]] = []
    for namespace in namespaces if namespaces is not None else [None]:
        docs += _list_profiles(cluster.api, cluster.host, namespace)
    return docs


def read_pinned(
    kubeconfig: str | None, context: str | None, namespaces: Sequence[str] | None
) -> list[str]:
    """The artifact URIs that model pods not yet ended were pinned to at admission (their
    annotations, read by the contract's owner). A pod that restarts (its init containers run
    again) or whose fetch has not run yet still reads its artifact, however old: status and
    history are bounded, pods are not. A pod can only keep an artifact, never remove one."""
    from tunefleet.plugin.cluster import connect
    from tunefleet.plugin.errors import PluginError

    try:
        cluster = connect(kubeconfig, context, None)
    except PluginError as e:
        raise GcError(str(e)) from None
    uris: list[str] = []
    for namespace in namespaces if namespaces is not None else [None]:
        path = "/api/v1/" + (f"namespaces/{namespace}/" if namespace else "") + "pods"
        where = f"in namespace {namespace}" if namespace else "cluster-wide"
        query = [
            ("labelSelector", naming.PROFILE_LABEL),
            ("fieldSelector", "status.phase!=Succeeded,status.phase!=Failed"),
        ]
        for pod in _pages(cluster.api, cluster.host, path, query, f"pods {where}"):
            admitted = Admission.read(pod)
            if admitted is not None and admitted.uri:
                uris.append(admitted.uri)
    return uris


def _pages(
    api: Any, host: str, path: str, query: list[tuple[str, str]], what: str
) -> Iterator[dict[str, Any]]:
    """Every item of a list, a page at a time (only one page is held)."""
    token = ""
    while True:
        paged = [*query, ("limit", str(PROFILE_PAGE))] + ([("continue", token)] if token else [])
        page = _api_get(api, host, path, paged, what)
        yield from (d for d in page.get("items") or [] if isinstance(d, dict))
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            return


def _list_profiles(api: Any, host: str, namespace: str | None) -> list[dict[str, Any]]:
    where = f"in namespace {namespace}" if namespace else "cluster-wide"
    path = f"/apis/{GROUP}/{VERSION}/" + (f"namespaces/{namespace}/" if namespace else "") + PLURAL
    return list(_pages(api, host, path, [], f"tuningprofiles.{GROUP} {where}"))


def _api_get(api: Any, host: str, path: str, query: list[tuple[str, str]], what: str) -> Any:
    import urllib3
    from kubernetes.client.exceptions import ApiException

    try:
        resp = api.call_api(
            path, "GET", query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _return_http_data_only=True, _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )  # fmt: skip
        return json.loads(resp.data)
    except ApiException as e:
        raise GcError(_api_refusal(e, host, what)) from None
    except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise GcError(
            f"cannot read {what} from the API server at {host} ({reason}): check --kubeconfig/"
            "--context and that the cluster is up; nothing was deleted"
        ) from None


def _api_refusal(e: Any, host: str, what: str) -> str:
    status = int(e.status or 0)
    try:
        message = str(json.loads(e.body or "{}").get("message") or e.reason)
    except (ValueError, AttributeError):
        message = str(e.reason)
    fixes = {
        401: "log in again or pick another --context",
        403: f"grant get/list on tuningprofiles.{GROUP} and list on pods (the chart's gc RBAC "
        "does), or restrict gc to namespaces it may read with --namespace",
        404: "is the TuningProfile CRD installed in this cluster?",
    }
    fix = fixes.get(status, "try again; if it persists, check the API server")
    return f"listing {what} at {host} failed ({status} {message}): {fix}; nothing was deleted"


# --- the rules --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rules:
    keep: int = DEFAULT_KEEP
    grace_s: float = DEFAULT_GRACE_S
    now: float = 0.0  # 0: the time of the run

    def young(self, modified: float) -> bool:
        return self.now - modified < self.grace_s


@dataclass(frozen=True)
class Delete:
    kind: str
    where: str  # the group's URI
    keys: tuple[str, ...]  # in the order they are deleted
    size: int
    newest: float
    reason: str


@dataclass(frozen=True)
class Write:
    where: str  # the library's URI
    key: str
    data: bytes
    gemms: int


@dataclass
class Plan:
    location: Location
    rules: Rules
    writes: list[Write] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)
    kept: Counter[str] = field(default_factory=Counter)  # why -> objects
    notes: list[str] = field(default_factory=list)
    listed: int = 0
    listed_bytes: int = 0
    profiles: int = 0
    using_store: int = 0

    def keep(self, why: str, objects: int) -> None:
        self.kept[why] += objects


def kept_young(rules: Rules) -> str:
    return f"written within the grace period ({duration_text(rules.grace_s)})"


KEPT_REFERENCED = "artifacts referenced by a profile's status"
KEPT_PINNED = "artifacts a model pod still running was pinned to"
KEPT_CURRENT = "scratch of a current revision not yet published"
KEPT_UNKNOWN = "objects of no layout tunefleet writes (left alone)"
KEPT_ENTRY = "library entries holding a GEMM row no older entry has"
KEPT_COMPACT = "library entries already compact (one row per GEMM)"
KEPT_FOREIGN = "library objects that are not entries this gc can merge (left alone)"


def kept_newest(rules: Rules) -> str:
    return f"artifacts among the newest {rules.keep} of their profile and GPU model"


def plan_artifacts(plan: Plan, inv: Inventory, fleet: Fleet) -> None:
    rules = plan.rules
    for owner, dirs in sorted(inv.artifacts.items()):
        complete = sorted((-g.newest, sha) for sha, g in dirs.items() if g.complete)
        newest = {sha for _, sha in complete[: rules.keep]}
        for sha, group in sorted(dirs.items()):
            reason = _artifact_verdict(plan, group, (*owner, sha), fleet, sha in newest)
            if reason:
                plan.deletes.append(_delete(plan, group, reason))


def _artifact_verdict(
    plan: Plan, group: Group, ident: ArtifactId, fleet: Fleet, among_newest: bool
) -> str:
    """Why the artifact goes; "" when it stays (counted under its reason)."""
    count = len(group.objects)
    if ident in fleet.referenced:
        plan.keep(KEPT_REFERENCED, count)
    elif ident in fleet.pinned:
        plan.keep(KEPT_PINNED, count)
    elif among_newest:
        plan.keep(kept_newest(plan.rules), count)
    elif plan.rules.young(group.newest):
        plan.keep(kept_young(plan.rules), count)
    elif not group.complete:
        return "incomplete (no manifest.json: a publish that never finished), not referenced"
    else:
        return (
            f"not referenced by any profile's status or running pod, not among the newest "
            f"{plan.rules.keep} of {ident[0]}/{ident[1]}/{ident[2]}"
        )
    return ""


def plan_scratch(plan: Plan, inv: Inventory, fleet: Fleet) -> None:
    for (ns, profile, model, _kind, revision), group in sorted(inv.scratch.items()):
        if plan.rules.young(group.newest):
            plan.keep(kept_young(plan.rules), len(group.objects))
            continue
        reason = _scratch_verdict(fleet.profiles.get((ns, profile)), model, revision)
        if reason:
            plan.deletes.append(_delete(plan, group, reason))
        else:
            plan.keep(KEPT_CURRENT, len(group.objects))


def _scratch_verdict(facts: ProfileFacts | None, model: str, revision: str) -> str:
    """Why a revision's checkpoints or shard outputs are no longer needed; "" if they are."""
    if facts is None:
        return "its profile is gone"
    if (model, revision) in facts.published:
        return f"revision {revision} is published (its artifact is in the profile's status)"
    if facts.models is not None and model not in facts.models:
        return f"GPU model {model} is no longer in the profile's spec"
    if revision not in facts.revisions:
        current = ", ".join(sorted(facts.revisions)) or "unknown"
        return f"revision {revision} is superseded (current: {current})"
    return ""


def _delete(plan: Plan, group: Group, reason: str) -> Delete:
    return Delete(
        group.kind,
        plan.location.uri(group.base),
        group.ordered_keys(),
        group.size,
        group.newest,
        reason,
    )


# --- compacting a library ---------------------------------------------------------------------


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
        plan.deletes.append(_delete(plan, group, reason))


def _reread(store: Store, lib: LibraryDir, e: Entry) -> ResultsFile | None:
    data = e.data if e.data is not None else _fetch(store, e.listed)
    if data is None:
        return None
    try:
        return verify_entry(lib, e.listed, data).results
    except LibraryEntryError:
        return None  # replaced by something else under the same name: leave it


# --- one run ----------------------------------------------------------------------------------


def collect(
    store: Store,
    location: Location,
    profiles: Iterable[dict[str, Any]],
    rules: Rules,
    namespaces: Sequence[str] | None = None,
    pinned: Iterable[str] = (),
) -> Plan:
    """Decide everything (reads only). Profiles and pods come first: read before the store
    is listed, an artifact published (or pinned by a new pod) in between is younger than the
    grace period. `pinned`: artifact URIs running model pods were pinned to (read_pinned)."""
    docs = list(profiles)
    fleet = fleet_of(docs, location, pinned)
    inv = list_store(store, location, namespaces)
    if not rules.now:
        rules = Rules(rules.keep, rules.grace_s, clock())
    plan = Plan(location, rules, listed=inv.listed, listed_bytes=inv.listed_bytes)
    plan.profiles, plan.using_store = len(docs), fleet.using_store
    plan_artifacts(plan, inv, fleet)
    plan_scratch(plan, inv, fleet)
    for base in sorted(inv.libraries):
        plan_library(plan, store, inv.libraries[base])
    plan.keep(KEPT_UNKNOWN, len(inv.unknown))
    if not fleet.using_store:
        plan.notes.append(
            f"none of the {len(docs)} profiles read names {store_uri(location)} in "
            "spec.storage.uri: is --uri (or the kubeconfig context) right? Artifacts here are "
            "kept only by the newest-N rule and status references"
        )
    return plan


def apply(plan: Plan, store: Store, report: Callable[[str], None]) -> None:
    """Compacted entries first (create-only): no entry is deleted unless they are all in.
    Then the deletions, a group per worker; each is reported when done, and the first failure
    is raised once the groups already started have ended."""
    for w in plan.writes:
        store.put_if_absent(w.key, w.data, "application/json")
        report(write_line(w, applied=True))

    def delete(d: Delete) -> None:
        for key in d.keys:  # in order: a manifest never outlives its results
            store.delete(key)

    failed: list[BaseException] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = {pool.submit(delete, d): d for d in plan.deletes}
        for future in concurrent.futures.as_completed(futures):
            if future.cancelled():
                continue
            exc = future.exception()
            if exc is None:
                report(delete_line(futures[future], plan.rules, applied=True))
            elif not failed:
                failed.append(exc)
                for pending in futures:
                    pending.cancel()  # those not started yet; the running ones finish
    if failed:
        raise failed[0]


def _batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _parallel(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    if len(items) < 2:
        return [fn(i) for i in items]
    with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return list(pool.map(fn, items))


# --- the report -------------------------------------------------------------------------------


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


_UNITS = (("d", 86400), ("h", 3600), ("m", 60))


def duration_text(seconds: float) -> str:
    """A setting, exactly: 6h, 90s."""
    for unit, scale in _UNITS:
        if seconds >= scale and seconds % scale == 0:
            return f"{seconds / scale:.0f}{unit}"
    return f"{seconds:g}s"


def age_text(seconds: float) -> str:
    """An age, roughly (whole units, rounded down): 3d, 5h, 12m, 40s."""
    for unit, scale in _UNITS:
        if seconds >= scale:
            return f"{seconds // scale:.0f}{unit}"
    return f"{max(seconds, 0.0):.0f}s"


def counted(n: int, what: str, many: str = "") -> str:
    return f"{n} {what if n == 1 else many or what + 's'}"


def delete_line(d: Delete, rules: Rules, *, applied: bool) -> str:
    verb = "deleted" if applied else "would delete"
    age = age_text(rules.now - d.newest)
    return (
        f"{verb} {d.kind} {d.where} ({counted(len(d.keys), 'object')}, {size_text(d.size)}, "
        f"newest written {age} ago): {d.reason}"
    )


def write_line(w: Write, *, applied: bool) -> str:
    verb = "wrote" if applied else "would write"
    return f"{verb} compacted library entry {w.where}/{w.key.rsplit('/', 1)[-1]} ({w.gemms} GEMMs)"


def report_lines(plan: Plan, *, applied: bool, verbose: bool = False) -> Iterator[str]:
    """What a dry run would do (an applied run reports each step as it is done)."""
    if not applied:
        for w in plan.writes:
            yield write_line(w, applied=False)
        for d in plan.deletes:
            yield delete_line(d, plan.rules, applied=False)
            if verbose:
                yield from (f"  {plan.location.uri(k)}" for k in d.keys)
    yield from (f"note: {n}" for n in plan.notes)
    yield from totals_lines(plan, applied=applied)


def totals_lines(plan: Plan, *, applied: bool) -> Iterator[str]:
    objects = sum(len(d.keys) for d in plan.deletes)
    size = sum(d.size for d in plan.deletes)
    by_kind: Counter[str] = Counter()
    for d in plan.deletes:
        by_kind[d.kind] += len(d.keys)
    verb = "deleted" if applied else "would delete"
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items()))
    entries = counted(len(plan.writes), "compacted library entry", "compacted library entries")
    yield (
        f"total: listed {counted(plan.listed, 'object')} ({size_text(plan.listed_bytes)}) under "
        f"{store_uri(plan.location)}; read {counted(plan.profiles, 'profile')}, "
        f"{plan.using_store} naming this store"
    )
    yield (
        f"total: {verb} {counted(objects, 'object')} ({size_text(size)})"
        f"{': ' + kinds if kinds else ''}; {'wrote' if applied else 'would write'} {entries}; "
        f"kept {counted(sum(plan.kept.values()), 'object')}:"
    )
    for why, n in sorted(plan.kept.items(), key=lambda kv: (-kv[1], kv[0])):
        if n:
            yield f"  kept {n}: {why}"


# --- the command ------------------------------------------------------------------------------


def parse_duration(text: str) -> float:
    """Seconds of "90s", "15m", "6h", "2d" or a bare number of seconds."""
    m = _DURATION_RE.match(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a duration such as 90s, 15m, 6h or 2d")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


_HELP = {
    "uri": "the store: s3://bucket/prefix, pvc://claim/prefix or file:///dir (what the "
    "profiles' spec.storage.uri says)",
    "apply": "write and delete (default: report only)",
    "keep": "unreferenced artifacts kept per (namespace, profile, GPU model), newest first "
    "(default: %(default)s)",
    "grace": "nothing younger is deleted (90s, 15m, 6h, 2d; default: %(default)s; --apply "
    f"needs at least {duration_text(MIN_APPLY_GRACE_S)})",
    "namespace": "read profiles and collect artifacts only in this namespace (repeatable; "
    "default: all); the cluster-scope library is compacted either way",
    "kubeconfig": "default: $KUBECONFIG, ~/.kube/config, else in-cluster",
    "context": "the kubeconfig context (default: its current one)",
    "unused-store-ok": "apply even though no profile names this store in spec.storage.uri (a "
    "wrong --context or --uri would make everything here look unreferenced, so --apply "
    "refuses that by default)",
    "verbose": "list every object to delete",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Delete what the artifact store no longer needs and compact each GEMM "
        "library. A dry run unless --apply: it reports what it would delete and why.",
    )
    h = _HELP
    p.add_argument("--uri", required=True, help=h["uri"])
    p.add_argument("--apply", action="store_true", help=h["apply"])
    p.add_argument("--keep", type=int, metavar="N", default=DEFAULT_KEEP, help=h["keep"])
    grace = duration_text(DEFAULT_GRACE_S)
    p.add_argument("--grace", metavar="DURATION", default=grace, help=h["grace"])
    p.add_argument(
        "--namespace", action="append", dest="namespaces", metavar="NS", help=h["namespace"]
    )
    p.add_argument("--kubeconfig", metavar="FILE", help=h["kubeconfig"])
    p.add_argument("--context", metavar="NAME", help=h["context"])
    p.add_argument("--unused-store-ok", action="store_true", help=h["unused-store-ok"])
    p.add_argument("-v", "--verbose", action="store_true", help=h["verbose"])
    storage_cli.add_arguments(p, timeout_s=3600.0)
    return p


@dataclass(frozen=True)
class Args:
    location: Location
    rules: Rules
    namespaces: list[str] | None
    options: StoreOptions


def check_args(args: argparse.Namespace) -> Args:
    """Everything the command line can get wrong, before any request is made."""
    try:
        location = parse_uri(args.uri)
        grace = parse_duration(args.grace)
        for ns in args.namespaces or []:
            check_key_parts(ns, "x", "x")
    except ValueError as e:
        raise UsageError(f"{e}: fix the argument") from None
    if args.keep < 0:
        raise UsageError(f"--keep {args.keep} is negative: give 0 or more")
    if args.apply and grace < MIN_APPLY_GRACE_S:
        raise UsageError(
            f"--grace {args.grace} is under {duration_text(MIN_APPLY_GRACE_S)}: with --apply it "
            "would race publishes in flight (up to ~4 minutes between their two uploads) and "
            "library readers (240 s); give a longer --grace"
        )
    rules = Rules(keep=args.keep, grace_s=grace)
    return Args(location, rules, args.namespaces, storage_cli.options(args))


def open_checked(location: Location, options: StoreOptions) -> Store:
    """The store; a directory that is not there is an error (it would list as empty)."""
    store = open_store(location, options)
    if isinstance(store, DirStore) and not store.root.is_dir():
        raise GcError(
            f"{store_uri(location)}: {store.root} is not a directory: check --uri/--pvc-root"
        )
    return store


def run(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    a = check_args(args)
    profiles = read_profiles(args.kubeconfig, args.context, a.namespaces)
    pinned = read_pinned(args.kubeconfig, args.context, a.namespaces)
    store = open_checked(a.location, a.options)
    plan = collect(store, a.location, profiles, a.rules, a.namespaces, pinned)
    if args.apply and plan.deletes and not plan.using_store and not args.unused_store_ok:
        raise GcError(
            f"refusing to apply: none of the {plan.profiles} profiles read names "
            f"{store_uri(a.location)} in spec.storage.uri, so nothing there looks referenced "
            "(a wrong --context or --uri?); check with a dry run, then pass --unused-store-ok "
            "if so"
        )
    mode = "applying" if args.apply else "dry run, nothing is deleted (--apply deletes)"
    out(f"{PROG}: {store_uri(a.location)}: {mode}")
    if args.apply:
        apply(plan, store, out)
    for line in report_lines(plan, applied=args.apply, verbose=args.verbose):
        out(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def out(line: str) -> None:
        print(line, flush=True)

    try:
        return run(args, out)
    except GcError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    except StoreError as e:
        line = " ".join(str(e).split())
        fix = "check --uri, the endpoint and the credentials"
        print(f"{PROG}: error: {line}: {fix}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
