"""A fleet-aware gc (docs/fleet.md, "Collecting a shared store"): each cluster's operator
records, per profile, what it references (a refs doc under ``_fleet/refs/``) and renews it;
tunefleet-gc, in any cluster on the store, keeps what an unexpired refs doc or a published
entry names, and collects expired claims, expired refs docs and entries whose artifact is gone.

The gc half runs on a file:// store in a tmp dir (as tests/unit/test_gc.py); the operator's
half is sync_profile with FakeKube and a directory store standing where the profiles' s3://
bucket is (as tests/unit/test_fleet.py)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.wrappers import make_artifact, make_profile
from tests.support.fake_kube import RECONCILE_WRITERS, FakeKube
from tunefleet import naming
from tunefleet.artifacts import gc
from tunefleet.artifacts.gc import fleet_objects
from tunefleet.artifacts.gc.fleet_state import fleet_of
from tunefleet.config import Config
from tunefleet.contracts import fleet as contract
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.reconcile import Around, sync_profile
from tunefleet.storage.filesystem import DirStore
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import Location, Store, StoreOptions
from tunefleet.watched.views import profile_view

MODEL = "AMD_Instinct_MI300X_OAM"
CLUSTER_A = "11111111-aaaa-4aaa-8aaa-111111111111"
CLUSTER_B = "22222222-bbbb-4bbb-8bbb-222222222222"
DAY = 86400.0
GRACE = 3600.0
NOW = time.time() + 30 * DAY  # every object a gc test writes is 30 days old unless aged
IDENT = "c" * 64


def sha(i: int) -> str:
    return f"{i:064x}"


class Shared:
    """The store two clusters share, as file:///dir: artifacts written as publish lays them
    out, and the fleet's objects under _fleet/."""

    def __init__(self, tmp: Path) -> None:
        root = tmp / "store"
        root.mkdir()
        self.uri = f"file://{root}"
        self.location = parse_uri(self.uri)
        self.store = DirStore(self.location, root)
        self.root = root

    def artifact(self, i: int, profile: str = "llama", ns: str = "ml", age: float = 0.0) -> str:
        """An artifact of `profile`, written `age` seconds before NOW; its URI."""
        base = self.location.key(ns, profile, MODEL, sha(i))
        for name in ("results.csv", "manifest.json"):
            self.put(f"{base}/{name}", b"x", NOW - age)
        return self.location.uri(base)

    def put(self, key: str, data: bytes, at: float = NOW - DAY) -> str:
        self.store.put(key, data, "application/json")
        os.utime(self.root / key, (at, at))
        return key

    def refs(self, uris: list[str], expires: float, cluster: str = CLUSTER_B) -> str:
        doc = contract.Refs(cluster, "ml", "llama", "uid-b", tuple(sorted(uris)), expires)
        return self.put(doc.key(self.location), doc.to_bytes())

    def claim(self, expires: float, identity: str = IDENT) -> str:
        holder = contract.Holder(CLUSTER_B, "ml", "llama", "uid-b")
        claim = contract.Claim(identity, holder, expires - 600, expires)
        return self.put(contract.claim_key(self.location, MODEL, identity), claim.to_bytes())

    def entry(self, uri: str, identity: str = IDENT) -> str:
        record = make_artifact(MODEL, uri.rsplit("/", 1)[-1]).uri(uri).revision("3f2a9c01de")
        found = ArtifactRecord.from_status(record.obj())
        assert found is not None
        holder = contract.Holder(CLUSTER_B, "ml", "llama", "uid-b")
        entry = contract.Published(identity, MODEL, found, holder, "2024-01-01T00:00:00Z")
        return self.put(contract.published_key(self.location, MODEL, identity), entry.to_bytes())

    def collect(
        self, *, keep: int = 1, namespaces: list[str] | None = None, apply: bool = True
    ) -> gc.Plan:
        """Cluster A's gc: none of its own profiles reference anything here."""
        plan = gc.collect(self.store, self.location, [], gc.Rules(keep, GRACE, NOW), namespaces)
        if apply:
            gc.apply(plan, self.store, lambda line: None)
        return plan

    def has(self, uri_or_key: str) -> bool:
        """Whether an object, or any object of an artifact's folder, is there."""
        path = self.root / uri_or_key.removeprefix(self.uri + "/")
        return path.is_file() or (path.is_dir() and any(p.is_file() for p in path.rglob("*")))


@pytest.fixture
def shared(tmp_path: Path) -> Shared:
    return Shared(tmp_path)


def deleted(plan: gc.Plan) -> set[str]:
    return {d.where for d in plan.deletes}


# --- gc: what other clusters reference is kept ---------------------------------------------


def test_an_artifact_another_clusters_refs_doc_names_is_kept_until_the_doc_expires(
    shared: Shared,
) -> None:
    adopted = shared.artifact(1, age=20 * DAY)  # B adopted it; A has no profile naming it
    newest = shared.artifact(2, age=DAY)
    doc = shared.refs([adopted], expires=NOW + DAY)

    plan = shared.collect(keep=1)

    assert shared.has(adopted) and shared.has(newest) and shared.has(doc)
    assert plan.kept[gc.KEPT_FLEET_REFS] == 2
    assert plan.kept[gc.KEPT_FLEET] == 1  # the doc itself

    # B stopped renewing it (its operator gone for days): it expires, keeps nothing, and
    # goes with the artifact, which is neither among the newest nor young.
    shared.refs([adopted], expires=NOW - 1)
    plan = shared.collect(keep=1)
    assert not shared.has(adopted) and not shared.has(doc) and shared.has(newest)
    kinds = {d.kind for d in plan.deletes}
    assert kinds == {gc.ARTIFACT, fleet_objects.FLEET_REFS}
    assert any("expired" in n for n in plan.notes)


def test_an_artifact_a_published_entry_names_is_kept_and_an_entry_whose_artifact_is_gone_goes(
    shared: Shared,
) -> None:
    published = shared.artifact(1, age=20 * DAY)
    shared.artifact(2, age=DAY)
    entry = shared.entry(published)
    gone = shared.location.uri(shared.location.key("ml", "old", MODEL, sha(9)))
    dangling = shared.entry(gone, identity="d" * 64)
    junk = shared.put(contract.published_key(shared.location, MODEL, "e" * 64), b"not json")

    plan = shared.collect(keep=1)

    assert shared.has(published) and shared.has(entry)
    assert plan.kept[gc.KEPT_FLEET_ENTRY] == 2
    assert not shared.has(dangling)  # names an artifact no longer in the store
    (why,) = [d.reason for d in plan.deletes if d.kind == fleet_objects.FLEET_ENTRY]
    assert gone in why
    assert shared.has(junk)  # not an entry: keeps nothing, left for its next publisher
    assert any(junk.rsplit("/", 3)[-3] in n and "not an entry" in n for n in plan.notes)


def test_a_namespaced_run_keeps_entries_whose_artifact_it_did_not_list(shared: Shared) -> None:
    gone = shared.location.uri(shared.location.key("other", "old", MODEL, sha(9)))
    dangling = shared.entry(gone)
    plan = shared.collect(namespaces=["ml"])
    assert shared.has(dangling) and not plan.deletes


# --- gc: stale fleet objects ----------------------------------------------------------------


def test_claims_expired_past_the_margin_go_live_and_unreadable_ones_stay(shared: Shared) -> None:
    old = shared.claim(NOW - fleet_objects.CLAIM_MARGIN_S - 60, identity="1" * 64)
    recent = shared.claim(NOW - 60, identity="2" * 64)  # released a minute ago
    live = shared.claim(NOW + 600, identity="3" * 64)
    junk = shared.put(contract.claim_key(shared.location, MODEL, "4" * 64), b"{}")

    dry = shared.collect(apply=False)
    assert deleted(dry) == {shared.location.uri(old)}  # listed in the plan...
    assert shared.has(old)  # ...and nothing deleted by a dry run
    lines = list(gc.report_lines(dry, applied=False))
    assert any(line.startswith("would delete fleet claim") and "expired" in line for line in lines)

    shared.collect()
    assert not shared.has(old)
    assert shared.has(recent) and shared.has(live) and shared.has(junk)


def test_a_namespaced_run_collects_no_claim_and_only_its_namespaces_refs_docs(
    shared: Shared,
) -> None:
    claim = shared.claim(NOW - 2 * fleet_objects.CLAIM_MARGIN_S)
    doc = shared.refs([], expires=NOW - 1)
    shared.collect(namespaces=["other"])
    assert shared.has(claim) and shared.has(doc)
    shared.collect(namespaces=["ml"])
    assert shared.has(claim) and not shared.has(doc)


def test_a_fleet_object_written_again_after_gc_read_it_is_left(shared: Shared) -> None:
    doc = shared.refs([], expires=NOW - 1)
    plan = shared.collect(apply=False)
    assert deleted(plan) == {shared.location.uri(doc)}
    shared.refs([], expires=NOW + DAY)  # its cluster renewed it meanwhile
    lines: list[str] = []
    gc.apply(plan, shared.store, lines.append)
    assert shared.has(doc)
    assert lines and lines[0].startswith("left fleet refs doc")


# --- gc: what is not trusted ---------------------------------------------------------------


@pytest.mark.parametrize("forgery", ["oversized", "not json", "another profile", "bad uris"])
def test_refs_docs_that_are_not_ours_are_skipped_and_keep_nothing(
    shared: Shared, forgery: str
) -> None:
    old = shared.artifact(1, age=20 * DAY)
    shared.artifact(2, age=DAY)
    good = contract.Refs(CLUSTER_B, "ml", "llama", "uid-b", (old,), NOW + DAY)
    key = good.key(shared.location)
    doc = json.loads(good.to_bytes())
    if forgery == "oversized":
        data = json.dumps({**doc, "pad": "x" * contract.MAX_REFS_BYTES}).encode()
    elif forgery == "not json":
        data = b"\x00" * 100
    elif forgery == "another profile":  # copied from another's key: says another profile
        data = json.dumps({**doc, "profile": "mistral"}).encode()
    else:
        data = json.dumps({**doc, "artifacts": [old] * (contract.MAX_REFS + 1)}).encode()
    shared.put(key, data)

    plan = shared.collect(keep=1)

    assert not shared.has(old)  # kept by nothing
    assert shared.has(key)  # not ours to delete: not read as a doc at all
    assert plan.kept[gc.KEPT_FLEET_REFS] == 0
    assert any(shared.location.uri(key) in n and "keeps nothing" in n for n in plan.notes)


def test_gc_works_the_same_without_any_fleet_object(shared: Shared) -> None:
    shared.artifact(1, age=20 * DAY)
    newest = shared.artifact(2, age=DAY)
    plan = shared.collect(keep=1)
    assert len(plan.deletes) == 1 and shared.has(newest) and plan.fleet_listed == 0
    assert not any(n for n in plan.notes if "fleet" in n)


def test_past_the_listing_cap_no_artifact_is_deleted(
    shared: Shared, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = shared.artifact(1, age=20 * DAY)
    shared.artifact(2, age=DAY)
    for i in range(3):
        shared.claim(NOW + 600, identity=f"{i}" * 64)
    monkeypatch.setattr(fleet_objects, "MAX_FLEET_OBJECTS", 2)
    plan = shared.collect(keep=1)
    assert shared.has(old) and not plan.deletes
    assert plan.kept[gc.KEPT_FLEET_UNLISTED] == 4  # objects: two artifacts of two each
    assert any("over 2 objects" in n for n in plan.notes)


# --- the operator: each profile's refs doc ---------------------------------------------------

DIGEST = "sha256:" + "a" * 64
FLEET_A = Config(image="tunefleet:1", fleet=True, fleet_cluster=CLUSTER_A)
BASE = (
    make_profile("p", "ml").uid("uid-p").generation(1)
    .image(f"registry.example.com/serve@{DIGEST}").gpu("amd", MODEL).storage("s3://bkt/fleet")
)  # fmt: skip
BUCKET = parse_uri("s3://bkt/fleet")


class Counting(DirStore):
    """The bucket as a directory, counting the refs docs written."""

    writes: list[str]

    def put(self, key: str, data: bytes, content_type: str) -> None:
        if "/_fleet/refs/" in key:
            Counting.writes.append(key)
        super().put(key, data, content_type)


def sync(p: dict[str, Any], tmp_path: Path, memory: Memory, config: Config = FLEET_A) -> int:
    """One reconcile of `p`; how many refs docs it wrote."""
    Counting.writes = []

    def open_store(location: Location, options: StoreOptions) -> Store:
        return Counting(location, tmp_path / location.bucket)

    api = FakeKube(writers=RECONCILE_WRITERS)
    sync_profile(p, [], [], config, memory, Around(api, open_store=open_store))
    return len(Counting.writes)


def refs_of(tmp_path: Path) -> contract.Refs | None:
    key = contract.refs_key(BUCKET, CLUSTER_A, "ml", "p")
    path = tmp_path / "bkt" / key
    return contract.Refs.from_bytes(path.read_bytes()) if path.exists() else None


def serving(i: int, *, history: int | None = None) -> dict[str, Any]:
    """p serving artifact i of its current revision (and artifact `history` in its history)."""
    rev = naming.revision(BASE.spec_model())
    art = make_artifact(MODEL, sha(i)).uri(BUCKET.uri(BUCKET.key("ml", "p", MODEL, sha(i))))
    p = BASE.revision(rev).artifacts(art.revision(rev))
    if history is not None:
        old = make_artifact(MODEL, sha(history)).uri(
            BUCKET.uri(BUCKET.key("ml", "q", MODEL, sha(history)))
        )
        p = p.history(old.revision("0000000000"))
    return profile_view(p.obj())


def test_the_refs_doc_is_written_once_names_what_gc_keeps_and_is_not_rewritten(
    tmp_path: Path,
) -> None:
    p = serving(1, history=2)
    memory = Memory()
    assert sync(p, tmp_path, memory) == 1
    doc = refs_of(tmp_path)
    assert doc is not None and doc.cluster == CLUSTER_A and doc.uid == "uid-p"
    assert doc.expires > time.time() + contract.REFS_TTL_SECONDS - 60
    # Exactly what this cluster's own gc keeps for the profile: the same notion, one source.
    assert doc.ids() == fleet_of([p], BUCKET).referenced
    assert (("ml", "q", MODEL, sha(2))) in doc.ids()  # the history, a rollback may pin
    assert sync(p, tmp_path, memory) == 0  # unchanged, far from expiry
    assert sync(p, tmp_path, memory) == 0


def test_the_refs_doc_is_renewed_when_under_half_its_life_is_left(tmp_path: Path) -> None:
    p = serving(1)
    memory = Memory()
    sync(p, tmp_path, memory)
    mine = memory.of("uid-p")
    assert mine.refs is not None
    mine.refs = (mine.refs[0], time.time() + contract.REFS_TTL_SECONDS / 2 - 60)
    assert sync(p, tmp_path, memory) == 1
    doc = refs_of(tmp_path)
    assert doc is not None and doc.expires > time.time() + contract.REFS_TTL_SECONDS - 60
    assert sync(p, tmp_path, memory) == 0


def test_the_refs_doc_is_rewritten_when_what_the_profile_serves_changes(tmp_path: Path) -> None:
    memory = Memory()
    sync(serving(1), tmp_path, memory)
    assert sync(serving(3), tmp_path, memory) == 1
    doc = refs_of(tmp_path)
    assert doc is not None and ("ml", "p", MODEL, sha(3)) in doc.ids()
    assert ("ml", "p", MODEL, sha(1)) not in doc.ids()


def test_a_restarted_or_new_leader_rewrites_the_refs_doc_at_most_once(tmp_path: Path) -> None:
    p = serving(1)
    sync(p, tmp_path, Memory())
    fresh = Memory()  # a restart, or the other replica took the Lease: nothing remembered
    assert [sync(p, tmp_path, fresh) for _ in range(3)] == [1, 0, 0]


def test_no_refs_doc_for_a_profile_that_references_nothing_or_without_fleet_mode(
    tmp_path: Path,
) -> None:
    assert sync(profile_view(BASE.obj()), tmp_path, Memory()) == 0
    assert sync(serving(1), tmp_path, Memory(), replace(FLEET_A, fleet=False)) == 0
    assert sync(serving(1), tmp_path, Memory(), replace(FLEET_A, fleet_cluster="")) == 0
    assert refs_of(tmp_path) is None


def test_a_refs_doc_the_operator_wrote_keeps_its_artifacts_from_another_clusters_gc(
    tmp_path: Path,
) -> None:
    """End to end on one store: A's operator writes p's refs doc; B's gc (no profile of its
    own names anything) keeps p's old artifact for it."""
    root = tmp_path / "bkt"
    loc = parse_uri(f"file://{root}/fleet")
    store = DirStore(loc, root / "fleet")
    old = make_artifact(MODEL, sha(1))
    base = loc.key("ml", "p", MODEL, sha(1))
    for name in ("results.csv", "manifest.json"):
        store.put(f"{base}/{name}", b"x", "text/plain")
    for name in ("results.csv", "manifest.json"):
        store.put(f"{loc.key('ml', 'p', MODEL, sha(2))}/{name}", b"x", "text/plain")
    rev = naming.revision(BASE.spec_model())
    p = profile_view(BASE.revision(rev).history(
        old.uri(BUCKET.uri(BUCKET.key("ml", "p", MODEL, sha(1)))).revision("0000000000")
    ).obj())  # fmt: skip
    assert sync(p, tmp_path, Memory()) == 1
    now = time.time() + DAY  # the doc lives; both artifacts are old
    for path in (root / "fleet" / "ml").rglob("*"):
        os.utime(path, (now - 20 * DAY, now - 20 * DAY))
    plan = gc.collect(store, loc, [], gc.Rules(0, GRACE, now))
    gone = {d.where for d in plan.deletes if d.kind == gc.ARTIFACT}
    assert gone == {loc.uri(loc.key("ml", "p", MODEL, sha(2)))}
    assert plan.kept[gc.KEPT_FLEET_REFS] == 2
