"""What the other clusters on the store say, read from its ``_fleet/`` folder (contracts/fleet.py)
before the store is listed: the artifacts each cluster's profiles reference (their refs docs,
until each expires) and the artifacts the fleet's published entries name; and the fleet's
objects that have outlived their use (claims long expired, expired refs docs, entries whose
artifact is gone), for the rules to delete.

Only what parses as ours is trusted or deleted. A refs doc that does not parse (oversized,
forged, another schema) keeps nothing; an entry that does not parse keeps nothing either (no
cluster adopts it, and its next publisher replaces it). Neither, nor a claim that does not
parse, is deleted: see `_claim`.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field

from tunefleet.contracts import fleet as contract
from tunefleet.storage.store import Listed, Location, NotFoundError, Store, TooLargeError

from .common import WORKERS

# The fleet's folder is listed whole (claims, entries, refs docs) with this cap; past it, what
# other clusters reference is not known, and no artifact is deleted (rules.KEPT_FLEET_UNLISTED).
MAX_FLEET_OBJECTS = 100_000
# How long past its expiry a claim stays: a holder whose clock runs behind ours still renews
# one it sees as live, and a claim released a moment ago is what its waiters read next.
CLAIM_MARGIN_S = 3600.0
# Skipped docs are named in the report up to this many; the rest are counted.
NAMED_SKIPS = 20

# The kinds of fleet object a deletion names, as the report says them.
FLEET_CLAIM = "fleet claim"
FLEET_REFS = "fleet refs doc"
FLEET_ENTRY = "fleet entry"


@dataclass(frozen=True)
class Found:
    """A fleet object read, with the bytes it held (a deletion goes only if they still are)."""

    listed: Listed
    data: bytes


@dataclass(frozen=True)
class Entry:
    """A published entry that parses, and the artifact it names (None: outside any store)."""

    found: Found
    uri: str
    artifact: contract.ArtifactId | None


@dataclass
class FleetObjects:
    """What `read` found under ``_fleet/``."""

    refs: set[contract.ArtifactId] = field(default_factory=set)  # named by unexpired refs docs
    entries: list[Entry] = field(default_factory=list)  # the entries that parse
    expired_claims: list[tuple[Found, str]] = field(default_factory=list)  # (claim, why)
    expired_refs: list[tuple[Found, str]] = field(default_factory=list)  # (doc, why)
    skipped: list[str] = field(default_factory=list)  # what was not trusted, and why
    listed: int = 0
    truncated: bool = False


def _place(location: Location, key: str) -> list[str]:
    """The parts of a key below ``<prefix>/_fleet/``."""
    return key[len(location.key(contract.FLEET_DIR)) + 1 :].split("/")


def read(store: Store, location: Location, now: float) -> FleetObjects:
    """List ``_fleet/`` (at most MAX_FLEET_OBJECTS) and read each refs doc, claim and entry,
    several at once. A store without fleet objects lists none: nothing changes then."""
    out = FleetObjects()
    listed = store.list(location.key(contract.FLEET_DIR), MAX_FLEET_OBJECTS + 1)
    out.truncated = len(listed) > MAX_FLEET_OBJECTS
    listed = listed[:MAX_FLEET_OBJECTS]
    out.listed = len(listed)
    with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool:
        got = list(pool.map(lambda o: _get(store, location, o), listed))
    for o, data in zip(listed, got, strict=True):
        _judge(out, location, o, data, now)
    return out


def _limit(location: Location, o: Listed) -> int:
    """How many bytes an object at this key may be to be ours (0: no kind of ours)."""
    parts = _place(location, o.key)
    if len(parts) == 4 and parts[0] == contract.REFS_DIR:
        return contract.MAX_REFS_BYTES
    if len(parts) == 3 and parts[2] in (contract.CLAIM, contract.PUBLISHED):
        return contract.MAX_BYTES
    return 0


def _get(store: Store, location: Location, o: Listed) -> bytes | None:
    """The object's bytes; None when it is of no kind of ours, larger than its kind may be
    (never downloaded) or gone since the listing."""
    limit = _limit(location, o)
    if not limit or o.size > limit:
        return None
    try:
        return store.get(o.key, limit)
    except (NotFoundError, TooLargeError):
        return None


def _judge(
    out: FleetObjects, location: Location, o: Listed, data: bytes | None, now: float
) -> None:
    parts = _place(location, o.key)
    uri = location.uri(o.key)
    if len(parts) == 4 and parts[0] == contract.REFS_DIR:
        _refs(out, parts, Found(o, data) if data is not None else None, uri, now)
    elif len(parts) == 3 and parts[2] == contract.CLAIM and data is not None:
        _claim(out, parts, Found(o, data), now)
    elif len(parts) == 3 and parts[2] == contract.PUBLISHED:
        _entry(out, parts, Found(o, data) if data is not None else None, uri)


def _refs(out: FleetObjects, parts: list[str], found: Found | None, uri: str, now: float) -> None:
    """A refs doc keeps what it names until it expires; one that is not a doc, or that says
    another cluster or profile than its key (a forgery, or one copied), keeps nothing."""
    doc = contract.Refs.from_bytes(found.data) if found is not None else None
    if doc is None or found is None:
        out.skipped.append(f"{uri}: not a refs doc (over {contract.MAX_REFS_BYTES} bytes, not "
                           "JSON, or another schema): it keeps nothing")  # fmt: skip
        return
    cluster, namespace, name = parts[1], parts[2], parts[3].removesuffix(contract.REFS_SUFFIX)
    if (doc.cluster, doc.namespace, doc.profile) != (cluster, namespace, name):
        out.skipped.append(
            f"{uri}: a refs doc of {doc.cluster}/{doc.namespace}/{doc.profile} under another "
            "key: it keeps nothing"
        )
        return
    if doc.expires > now:
        out.refs |= doc.ids()
        return
    out.skipped.append(f"{uri}: expired; it keeps nothing")
    out.expired_refs.append(
        (found, f"expired (its cluster {doc.cluster} stopped renewing it for "
                f"{doc.namespace}/{doc.profile})")
    )  # fmt: skip


def _claim(out: FleetObjects, parts: list[str], found: Found, now: float) -> None:
    """A claim long expired goes: nobody holds it, and the next taker creates one (a claim's
    absence and an expired claim read alike, fleet/claims.py). A claim.json that is not a claim
    stays: under the fleet's own key it never blocks the identity (the next taker takes it over
    with an If-Match write on the version read, and a log line says what was there), and
    deleting what we cannot read would delete on a guess; an oversized one is never even
    downloaded."""
    claim = contract.Claim.from_bytes(found.data, parts[1])
    if claim is None or claim.expires + CLAIM_MARGIN_S > now:
        return
    why = f"expired, held last by {claim.holder.describe()}"
    out.expired_claims.append((found, why))


def _entry(out: FleetObjects, parts: list[str], found: Found | None, uri: str) -> None:
    """A published entry that parses keeps the artifact it names (another cluster may adopt it
    at any time); one that does not keeps nothing and stays: no cluster adopts it, and the
    identity's next publisher replaces it."""
    model, identity = parts[0], parts[1]
    entry = (
        contract.Published.from_bytes(found.data, identity, model) if found is not None else None
    )
    if entry is None or found is None:
        out.skipped.append(f"{uri}: not an entry for its identity and GPU model: it keeps nothing")
        return
    out.entries.append(Entry(found, entry.record.uri, contract.artifact_id(entry.record.uri)))


def refs_namespace(location: Location, key: str) -> str:
    """The namespace a refs doc's key names."""
    parts = _place(location, key)
    return parts[2] if len(parts) == 4 else ""


def skipped_notes(fleet: FleetObjects) -> list[str]:
    """The report's words for what was not trusted (the first few named, the rest counted)."""
    notes = list(fleet.skipped[:NAMED_SKIPS])
    if len(fleet.skipped) > NAMED_SKIPS:
        notes.append(f"and {len(fleet.skipped) - NAMED_SKIPS} more fleet objects not trusted")
    return notes
