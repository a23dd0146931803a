"""tunefleet-gc on a file:// store (tmp dirs): every rule, dry run and apply, a second run, the
compaction's rows, what it leaves alone, the command's errors, the chart's CronJob; and the
library reader's newest-first order past its bounds.

Profiles are given as dicts shaped like the API server's (the e2e test, tests/e2e/test_gc_s3.py,
reads real ones). Ages are set with os.utime and judged against Rules.now.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.builders.wrappers import make_artifact, make_profile
from tests.support.chart import rendered, template
from tests.support.results import VALIDATORS, rows
from tunefleet import naming
from tunefleet.artifacts import gc
from tunefleet.artifacts import publish as publish_mod
from tunefleet.artifacts.gc import command
from tunefleet.artifacts.library import (
    Library,
    checkpoint_key,
    library_prefix,
    read_library,
    shard_base,
)
from tunefleet.artifacts.publish import Output
from tunefleet.storage.filesystem import DirStore
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import Location
from tuner_job.library import CheckpointId, EntrySource, library_key, make_entry
from tuner_job.manifest import ArtifactId, ManifestExtra
from tuner_job.output import RunFacts, write_output
from tuner_job.results import ResultsFile, format_results, merge_results

MODEL = "AMD_Instinct_MI300X_OAM"
OTHER_MODEL = "AMD_Instinct_MI325X_OAM"
IDENTITY = {"gpuName": "AMD Instinct MI300X", "arch": "gfx942:sramecc+:xnack-"}
KEY = library_key(MODEL, VALIDATORS, IDENTITY)
DAY = 86400.0
GRACE = 3600.0
OLD = 10 * DAY  # how far past the files' mtimes "now" is, unless a test makes a file young


# Profile llama as the API server hands it over, its status's artifacts and history empty; each
# World's `profile` is it with spec.storage.uri set to that world's spec_uri.
LLAMA = (
    make_profile("llama")
    .uid("uid-llama")
    .image("registry.example.com/serve:1")
    .gpu("amd", MODEL)
    .shapes((64, 64, 64))
    .artifacts()
    .history()
)


class World:
    """A directory store in a tmp dir, as file:///dir (the default) or as pvc://claim mounted
    there; a profile's spec.storage.uri can only name the latter (the CRD admits s3 and pvc), so
    the file:// store's profiles name another store and the command needs --unused-store-ok."""

    def __init__(self, tmp: Path, scheme: str = "file") -> None:
        self.root = tmp / "store"
        self.root.mkdir()
        self.uri = f"file://{self.root}" if scheme == "file" else "pvc://claim"
        self.location = parse_uri(self.uri)
        self.store = DirStore(self.location, self.root)
        self.spec_uri = "s3://tunefleet/unit" if scheme == "file" else self.uri
        self.profile = LLAMA.storage(self.spec_uri)
        self.tmp = tmp
        self.n = 0

    # --- publishing, as the tuning Job does -----------------------------------------------

    def publish(
        self,
        profile: str,
        results: ResultsFile,
        *,
        ns: str = "ml",
        model: str = MODEL,
        revision: str = "3f2a9c01de",
    ) -> dict[str, Any]:
        """An artifact and its library entry; returns its status.artifacts[] entry."""
        self.n += 1
        out = self.tmp / f"out{self.n}"
        write_output(
            out,
            results,
            ArtifactId(namespace=ns, profile=profile, revision=revision, gpu_model=model),
            RunFacts(
                recorded=results.gemms,
                identity=IDENTITY,
                seconds=1.0,
                extra=ManifestExtra(library_key=library_key(model, VALIDATORS, IDENTITY), shards=1),
            ),
        )
        pub = publish_mod.publish(Output(out, self.uri, ns, profile, model), store=self.store)
        assert pub.library is not None, pub.library_error
        return make_artifact(model, pub.sha256).uri(pub.uri).revision(revision).obj()

    def checkpoint(self, profile: str, revision: str, *, ns: str = "ml", model: str = MODEL) -> str:
        ident = CheckpointId(ns, profile, model, revision, 0, 1)
        key = checkpoint_key(self.location, ident)
        self.store.put(key, b"{}\n", "application/json")
        return key

    def shard(self, profile: str, revision: str, *, ns: str = "ml", model: str = MODEL) -> str:
        base = shard_base(self.location, ArtifactId(ns, profile, revision, model), 1, 2)
        self.store.put(f"{base}/results.csv", b"Validator,PT_VERSION,2.11.0\n", "text/csv")
        self.store.put(f"{base}/manifest.json", b"{}\n", "application/json")
        return base

    def entry(self, results: ResultsFile, profile: str = "p", ns: str = "ml") -> str:
        """A library entry placed directly (as publish adds it)."""
        data = make_entry(
            gpu_model=MODEL,
            validators=VALIDATORS,
            identity=IDENTITY,
            source=EntrySource(ns, profile, "3f2a9c01de", "ab" * 32),
            results_text=format_results(results),
        )
        key = f"{self.library()}/{hashlib.sha256(data).hexdigest()}.json"
        self.store.put(key, data, "application/json")
        return key

    def library(self, ns: str = "ml") -> str:
        return library_prefix(self.location, "namespace", ns, MODEL, KEY)

    # --- ages -----------------------------------------------------------------------------

    def age(self, key_or_prefix: str, seconds_before_now: float, now: float) -> None:
        path = self.root / key_or_prefix
        paths = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        for p in paths:
            os.utime(p, (now - seconds_before_now, now - seconds_before_now))

    # --- what is there --------------------------------------------------------------------

    def objects(self) -> set[str]:
        return {o.key for o in self.store.list("", 1_000_000)}

    def read(self, ns: str = "ml") -> Any:
        return read_library(
            self.store, Library(self.location, "namespace", ns, MODEL, KEY), dict(VALIDATORS)
        )

    # --- gc -------------------------------------------------------------------------------

    def collect(
        self, profiles: list[dict[str, Any]], *, grace: float = GRACE, keep: int = 1, now: float
    ) -> gc.Plan:
        return gc.collect(self.store, self.location, profiles, gc.Rules(keep, grace, now))

    def run(
        self, profiles: list[dict[str, Any]], *, grace: float = GRACE, keep: int = 1, now: float
    ) -> gc.Plan:
        plan = self.collect(profiles, grace=grace, keep=keep, now=now)
        gc.apply(plan, self.store, lambda line: None)
        return plan


def deleted_keys(plan: gc.Plan) -> set[str]:
    return {k for d in plan.deletes for k in d.keys}


def artifact_keys(entry: dict[str, Any], world: World) -> set[str]:
    base = entry["uri"].removeprefix(world.uri + "/")
    return {f"{base}/results.csv", f"{base}/manifest.json"}


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


NOW = time.time() + OLD  # everything written by a test is OLD old, unless aged otherwise


# --- artifacts --------------------------------------------------------------------------------


def test_referenced_artifacts_are_kept_and_old_unreferenced_ones_deleted(world: World) -> None:
    served = world.publish("llama", rows(1))
    earlier = world.publish("llama", rows(2))
    dropped = [world.publish("llama", rows(i)) for i in (3, 4)]
    newest = world.publish("llama", rows(5))
    for i, e in enumerate([served, earlier, *dropped, newest]):
        world.age(e["uri"].removeprefix(world.uri + "/"), OLD - i * 60, NOW)
    llama = world.profile.artifacts(served).history(earlier).obj()

    plan = world.run([llama], keep=1, now=NOW)

    gone = deleted_keys(plan)
    for e in dropped:
        assert artifact_keys(e, world) <= gone
    kept = world.objects()
    for e in (served, earlier, newest):  # referenced (status, history), and the newest one
        assert artifact_keys(e, world) <= kept
    why = {d.where: d.reason for d in plan.deletes if d.kind == gc.ARTIFACT}
    assert (
        "not referenced by any profile's status or running pod, not among the newest 1"
        in why[dropped[0]["uri"]]
    )
    assert plan.kept[gc.KEPT_REFERENCED] == 4 and plan.kept[gc.kept_newest(plan.rules)] == 2


def test_an_artifact_a_running_pod_was_pinned_to_is_kept_however_old(world: World) -> None:
    """Status and history are bounded; a model pod pinned to an artifact that fell out of
    both still reads it when its init containers run again."""
    served = world.publish("llama", rows(1))
    pinned = world.publish("llama", rows(2))
    other = world.publish("llama", rows(3))
    for i, e in enumerate([served, pinned, other]):
        world.age(e["uri"].removeprefix(world.uri + "/"), OLD + 600 - i * 60, NOW)
    llama = world.profile.artifacts(served).obj()
    pods = [pinned["uri"], "s3://elsewhere/not-an-artifact"]

    plan = gc.collect(world.store, world.location, [llama], gc.Rules(0, GRACE, NOW), None, pods)

    gone = {d.where for d in plan.deletes if d.kind == gc.ARTIFACT}
    assert gone == {other["uri"]}
    assert plan.kept[gc.KEPT_PINNED] == 2


def test_the_newest_n_are_kept_per_profile_and_model_even_when_the_profile_is_gone(
    world: World,
) -> None:
    a = [world.publish("gone", rows(i)) for i in range(4)]
    b = [world.publish("gone", rows(10 + i), model=OTHER_MODEL) for i in range(2)]
    for i, e in enumerate(a + b):
        world.age(e["uri"].removeprefix(world.uri + "/"), OLD - i * 60, NOW)

    plan = world.run([], keep=2, now=NOW)  # no profile at all: "gone" was deleted

    kept = world.objects()
    assert all(artifact_keys(e, world) <= kept for e in a[2:] + b)
    assert all(not artifact_keys(e, world) & kept for e in a[:2])
    assert len([d for d in plan.deletes if d.kind == gc.ARTIFACT]) == 2


def test_an_artifact_manifest_is_deleted_before_its_results_and_an_unfinished_one_goes(
    world: World,
) -> None:
    keep = world.publish("llama", rows(1))
    old = world.publish("llama", rows(2))
    world.age(old["uri"].removeprefix(world.uri + "/"), OLD + 60, NOW)
    unfinished = f"ml/llama/{MODEL}/{'cd' * 32}/results.csv"  # publish died before the manifest
    world.store.put(unfinished, b"x", "text/csv")
    # A signed artifact's signature (storage.signing) goes with it, after its manifest.
    world.store.put(f"{old['uri'].removeprefix(world.uri + '/')}/manifest.json.sig", b"s", "x")
    world.age(old["uri"].removeprefix(world.uri + "/"), OLD + 60, NOW)
    plan = world.collect([world.profile.artifacts(keep).obj()], keep=1, now=NOW)
    (deleted,) = [d for d in plan.deletes if d.where == old["uri"]]
    assert deleted.keys[0].endswith("/manifest.json") and deleted.keys[1].endswith(
        "/manifest.json.sig"
    )
    assert deleted.keys[2].endswith("/results.csv")
    (half,) = [d for d in plan.deletes if d.keys == (unfinished,)]
    assert "incomplete (no manifest.json" in half.reason


def test_cache_archives_go_and_stay_with_their_artifact(world: World) -> None:
    """An artifact's caches (<base>/caches/<sha256>.tar.gz) are part of it: kept while it is,
    deleted after its manifest when it goes; a stray name under caches/ is not ours."""
    keep = world.publish("llama", rows(1))
    old = world.publish("llama", rows(2))
    world.age(old["uri"].removeprefix(world.uri + "/"), OLD + 60, NOW)
    cache = "ef" * 32 + ".tar.gz"
    for e in (keep, old):
        world.store.put(f"{e['uri'].removeprefix(world.uri + '/')}/caches/{cache}", b"z", "x")
    stray = f"{keep['uri'].removeprefix(world.uri + '/')}/caches/notes.txt"
    world.store.put(stray, b"z", "x")
    world.age(old["uri"].removeprefix(world.uri + "/"), OLD + 60, NOW)
    plan = world.collect([world.profile.artifacts(keep).obj()], keep=1, now=NOW)
    (deleted,) = [d for d in plan.deletes if d.where == old["uri"]]
    assert deleted.keys[0].endswith("/manifest.json")
    assert any(k.endswith(f"/caches/{cache}") for k in deleted.keys)
    assert not any(
        keep["uri"].removeprefix(world.uri + "/") in k for d in plan.deletes for k in d.keys
    )
    assert stray in world.objects()  # not ours to judge: left alone


# --- the grace period -------------------------------------------------------------------------


def test_nothing_younger_than_the_grace_period_is_deleted(world: World) -> None:
    served = world.publish("llama", rows(1))
    in_flight = world.publish("llama", rows(2))  # published, not yet in status
    older = world.publish("llama", rows(3))
    world.age(older["uri"].removeprefix(world.uri + "/"), OLD + 60, NOW)
    world.age(in_flight["uri"].removeprefix(world.uri + "/"), GRACE - 5, NOW)
    world.age(world.library(), GRACE - 5, NOW)  # every library entry just added
    scratch = world.checkpoint("gone", "0123456789")  # of a profile that is gone...
    world.age(scratch, GRACE - 5, NOW)  # ...but still being written
    llama = world.profile.artifacts(served).obj()

    plan = world.run([llama], keep=0, now=NOW)

    kept = world.objects()
    assert artifact_keys(in_flight, world) <= kept and scratch in kept
    assert deleted_keys(plan) == artifact_keys(older, world)  # no library entry either
    assert plan.kept[gc.kept_young(plan.rules)] == 2 + 1 + 3  # artifact, checkpoint, entries


# --- scratch ----------------------------------------------------------------------------------


def test_scratch_of_published_superseded_dropped_or_gone_revisions_is_deleted(world: World) -> None:
    s = world.profile
    current = naming.revision(s.spec_model())
    published = "aaaaaaaaaa"
    art = world.publish("llama", rows(1), revision=published)
    llama = s.artifacts(art).revision(current).obj()
    keys = {
        "published checkpoint": world.checkpoint("llama", published),
        "published shards": world.shard("llama", published),
        "superseded": world.checkpoint("llama", "bbbbbbbbbb"),
        "dropped model": world.checkpoint("llama", current, model=OTHER_MODEL),
        "gone": world.shard("gone", "cccccccccc"),
        "current checkpoint": world.checkpoint("llama", current),
        "current shards": world.shard("llama", current),
    }

    plan = world.run([llama], now=NOW)

    kept = world.objects()
    assert keys["current checkpoint"] in kept
    assert {
        f"{keys['current shards']}/results.csv",
        f"{keys['current shards']}/manifest.json",
    } <= kept
    reasons = {d.where.removeprefix(world.uri + "/"): d.reason for d in plan.deletes}
    assert (
        "revision aaaaaaaaaa is published" in reasons[f"ml/llama/{MODEL}/_checkpoints/{published}"]
    )
    assert "is published" in reasons[f"ml/llama/{MODEL}/_shards/{published}"]
    assert (
        f"superseded (current: {current})" in reasons[f"ml/llama/{MODEL}/_checkpoints/bbbbbbbbbb"]
    )
    assert (
        "no longer in the profile's spec"
        in reasons[f"ml/llama/{OTHER_MODEL}/_checkpoints/{current}"]
    )
    assert reasons[f"ml/gone/{MODEL}/_shards/cccccccccc"] == "its profile is gone"
    assert plan.kept[gc.KEPT_CURRENT] == 3


def test_a_profile_being_deleted_keeps_what_it_references_and_its_current_scratch(
    world: World,
) -> None:
    s = world.profile.name("leaving").uid("uid-leaving")
    art = world.publish("leaving", rows(1))
    other = world.publish("leaving", rows(2))
    world.age(other["uri"].removeprefix(world.uri + "/"), OLD + 60, NOW)
    scratch = world.checkpoint("leaving", naming.revision(s.spec_model()))
    leaving = s.artifacts(art).deleting().obj()
    world.run([leaving], keep=0, now=NOW)
    assert artifact_keys(art, world) | {scratch} <= world.objects()
    assert not artifact_keys(other, world) & world.objects()


def test_the_status_revision_counts_as_current_beside_the_specs(world: World) -> None:
    """A spec edited but not yet reconciled: the revision still tuning (status) keeps its
    scratch, as does the spec's (nothing has started for it yet)."""
    s = world.profile.shapes((128, 64, 64))
    tuning = world.checkpoint("llama", "dddddddddd")
    llama = s.revision("dddddddddd").obj()
    plan = world.run([llama], now=NOW)
    assert tuning in world.objects() and not plan.deletes


# --- compaction -------------------------------------------------------------------------------


def test_compaction_keeps_exactly_the_gemms_and_their_fastest_rows(world: World) -> None:
    inputs = [rows(i) for i in range(5)]
    for i, r in enumerate(inputs):
        world.entry(r, profile=f"p{i}")
    before = world.read()
    plan = world.run([], grace=0.0, now=NOW)

    after = world.read()
    expected = merge_results(inputs)
    assert (
        format_results(after.results) == format_results(expected) == format_results(before.results)
    )
    assert after.entries == 1 and after.gemms == 5 * 10 + 5
    common = [r for r in after.results.rows if "_77_" in r.params]
    assert {r.solution for r in common} == {"Gemm_Rocblas_0"}  # the fastest of each shared GEMM
    (written,) = plan.writes
    assert written.gemms == 55
    (gone,) = [d for d in plan.deletes if d.kind == gc.ENTRIES]
    assert len(gone.keys) == 5
    doc = json.loads((world.root / written.key).read_bytes())
    assert doc["source"] == {
        "namespace": "ml",
        "profile": "",
        "revision": gc.COMPACTED_REVISION,
        "sha256": hashlib.sha256(doc["results"].encode()).hexdigest(),
    }


def test_compaction_writes_first_and_deletes_what_it_supersedes_only_after_the_grace(
    world: World,
) -> None:
    for i in range(3):
        world.entry(rows(i, shared=0), profile=f"p{i}")  # disjoint: none covers another
    entries = {k for k in world.objects() if "/_library/" in k}

    first = world.run([], now=NOW)  # old entries, but the compacted one is new
    (written,) = first.writes
    assert not first.deletes and entries | {written.key} == {
        k for k in world.objects() if "/_library/" in k
    }
    assert world.read().gemms == 30

    later = NOW + GRACE  # the compacted entry has been there for the grace period
    second = world.run([], now=later)
    assert not second.writes
    assert {k for d in second.deletes for k in d.keys} == entries
    assert {k for k in world.objects() if "/_library/" in k} == {written.key}
    assert world.read().gemms == 30


def test_an_entry_that_repeats_an_older_ones_rows_replaces_it_without_waiting(
    world: World,
) -> None:
    """Each entry repeats the rows it reused: the older entry is covered by the newer one,
    which is older than the grace too, so it goes in the same run."""
    first = rows(1, n=4, shared=0)
    second = ResultsFile(dict(VALIDATORS), first.rows + rows(2, n=4, shared=0).rows)
    a = world.entry(first, profile="a")
    b = world.entry(second, profile="b")
    world.age(a, OLD + 60, NOW)
    plan = world.collect([], now=NOW)
    (gone,) = [d for d in plan.deletes if d.kind == gc.ENTRIES]
    assert gone.keys == (a,) and b not in gone.keys


def test_a_second_run_deletes_nothing(world: World) -> None:
    s = world.profile
    served = world.publish("llama", rows(1), revision=naming.revision(s.spec_model()))
    for i in range(2, 6):
        world.publish("llama", rows(i))
    world.publish("other", rows(9))
    world.checkpoint("llama", naming.revision(s.spec_model()))
    world.shard("gone", "eeeeeeeeee")
    profiles = [s.artifacts(served).obj()]

    first = world.run(profiles, grace=0.0, now=NOW)
    assert first.deletes and first.writes
    listing = world.objects()
    second = world.run(profiles, grace=0.0, now=NOW + 1)
    assert (second.deletes, second.writes) == ([], [])
    assert world.objects() == listing


def test_a_dry_run_deletes_and_writes_nothing(world: World) -> None:
    for i in range(4):
        world.publish("llama", rows(i))
    world.checkpoint("gone", "ffffffffff")
    listing = world.objects()
    plan = world.collect([], grace=0.0, keep=1, now=NOW)
    lines = list(gc.report_lines(plan, applied=False))
    assert world.objects() == listing
    assert plan.deletes and plan.writes
    assert sum(line.startswith("would delete artifact ") for line in lines) == 3
    assert any(line.startswith("would write compacted library entry ") for line in lines)
    assert lines[-1].startswith("  kept ") and any(line.startswith("total: ") for line in lines)


def test_an_entry_published_while_gc_runs_is_never_lost(world: World, tmp_path: Path) -> None:
    """A publisher adds an entry after gc listed the library: gc never deletes what it did not
    list, and the library then reads every row of both."""
    for i in range(3):
        world.entry(rows(i), profile=f"p{i}")
    late = rows(7, n=12)

    class Racing(DirStore):
        def list(self, prefix: str, limit: int) -> Any:
            got = super().list(prefix, limit)
            if not prefix.endswith("_fleet"):  # the store's listing, not the fleet folder's
                world.entry(late, profile="late")  # lands right after the listing
            return got

    store = Racing(world.location)
    plan = gc.collect(store, world.location, [], gc.Rules(1, 0.0, NOW))
    gc.apply(plan, store, lambda line: None)
    view = world.read()
    assert view.results is not None
    expected = merge_results([*[rows(i) for i in range(3)], late])
    assert format_results(view.results) == format_results(expected)
    assert view.entries == 2  # the compacted entry and the late one


def test_entries_gc_cannot_merge_and_unknown_objects_are_left_alone(world: World) -> None:
    world.entry(rows(1))
    world.entry(rows(2))
    library = world.library()
    bad = f"{library}/{'0' * 64}.json"
    world.store.put(bad, b"not an entry", "application/json")
    doc = json.loads(make_entry(
        gpu_model=MODEL, validators=VALIDATORS, identity=IDENTITY,
        source=EntrySource("ml", "p", "3f2a9c01de", "ab" * 32),
        results_text=format_results(rows(3)),
    ))  # fmt: skip
    doc["settings"] = {"maxIterations": 100}  # a later schema's field
    newer = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    newer_key = f"{library}/{hashlib.sha256(newer).hexdigest()}.json"
    world.store.put(newer_key, newer, "application/json")
    strays = [f"{library}/notes.txt", "ml/llama/README", f"ml/llama/{MODEL}/_checkpoints/x.json"]
    for key in strays:
        world.store.put(key, b"x", "text/plain")

    plan = world.run([], grace=0.0, now=NOW)

    assert {bad, newer_key, *strays} <= world.objects()
    assert not {bad, newer_key, *strays} & deleted_keys(plan)
    assert plan.kept[gc.KEPT_FOREIGN] == 2 and plan.kept[gc.KEPT_UNKNOWN] == 3


def test_a_cluster_scope_library_is_compacted_too(world: World) -> None:
    prefix = library_prefix(world.location, "cluster", "", MODEL, KEY)
    for i in range(2):
        data = make_entry(
            gpu_model=MODEL, validators=VALIDATORS, identity=IDENTITY,
            source=EntrySource(f"ns{i}", "p", "3f2a9c01de", "ab" * 32),
            results_text=format_results(rows(i)),
        )  # fmt: skip
        world.store.put(f"{prefix}/{hashlib.sha256(data).hexdigest()}.json", data, "x")
    plan = world.run([], grace=0.0, now=NOW)
    (written,) = plan.writes
    assert written.key.startswith(f"_library/{MODEL}/{KEY}/")
    view = read_library(world.store, Library(world.location, "cluster", "", MODEL, KEY), VALIDATORS)
    assert (view.entries, view.gemms) == (1, 25)


def test_a_big_library_compacts_into_entries_readers_take(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gc.compaction, "CHUNK_BYTES", 2000)
    inputs = [rows(i, n=40) for i in range(3)]
    for r in inputs:
        world.entry(r)
    plan = world.run([], grace=0.0, now=NOW)
    assert len(plan.writes) > 2
    view = world.read()
    assert view.entries == len(plan.writes) and not view.skipped
    assert format_results(view.results) == format_results(merge_results(inputs))
    again = world.collect([], grace=0.0, now=NOW + 1)  # the same rows cut the same way
    assert (again.writes, again.deletes) == ([], [])


def test_a_store_nested_under_the_collected_prefix_is_left_alone(tmp_path: Path) -> None:
    """Another profile's storage.uri may be a longer prefix of the same bucket: its keys have
    one more segment, so none of them reads as an artifact, scratch or library here."""
    root = tmp_path / "claim"
    outer = DirStore(Location("pvc", "claim", "base"), root)
    inner = Location("pvc", "claim", "base/team")
    inner_store = DirStore(inner, root)
    w = World(tmp_path)
    w.store, w.location, w.root = inner_store, inner, root
    w.uri = inner.uri(inner.prefix)
    w.n = 0
    art = w.publish("llama", rows(1))
    w.checkpoint("llama", "0123456789")
    nested = {o.key for o in outer.list("base", 1000)}
    plan = gc.collect(outer, outer.location, [], gc.Rules(0, 0.0, NOW))
    assert art and (plan.deletes, plan.writes) == ([], [])
    assert plan.kept[gc.KEPT_UNKNOWN] == len(nested) == 4  # artifact (2), entry, checkpoint


# --- the reader: newest first past every bound ----------------------------------------------


def test_library_reads_past_the_byte_cap_prefer_the_newest_entries(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tunefleet.artifacts.library as lib

    a = world.entry(rows(1, shared=0), profile="a")
    b = world.entry(rows(2, shared=0), profile="b")
    older, newer = sorted([a, b])  # the first by key is the older: key order would read it
    now = time.time()
    world.age(older, 600, now)
    world.age(newer, 60, now)
    monkeypatch.setattr(lib, "MAX_TOTAL_BYTES", (world.root / newer).stat().st_size + 10)
    view = world.read()
    assert view.entries == 1
    assert [o for o, _ in view.skipped] == [older]
    newest_rows = rows(1 if newer == a else 2, shared=0)
    assert format_results(view.results) == format_results(newest_rows)


def test_the_whole_store_lists_with_an_empty_prefix(world: World) -> None:
    world.publish("llama", rows(1))
    keys = world.objects()
    assert any(k.startswith("ml/llama/") for k in keys)
    assert any("/_library/" in k for k in keys)


# --- the command ------------------------------------------------------------------------------


def cli(monkeypatch: pytest.MonkeyPatch, capsys: Any, *argv: str, profiles: Any = ()) -> Any:
    if profiles is not None:
        monkeypatch.setattr(gc.command, "read_profiles", lambda *a: list(profiles))
        monkeypatch.setattr(gc.command, "read_pinned", lambda *a: [])
    capsys.readouterr()  # what the test's own publishing printed
    code = gc.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tunefleet-gc: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--uri", "gs://bucket/x"], "is not an s3://, pvc://, file://, oci:// URI"),
        (["--uri", "s3://"], "has no bucket"),
        (["--uri", "file:///tmp", "--grace", "soon"], "is not a duration"),
        (["--uri", "file:///tmp", "--namespace", "Bad_NS"], "is not a Kubernetes namespace name"),
        (["--uri", "file:///tmp", "--apply", "--grace", "60s"], "is under 10m"),
        (["--uri", "file:///tmp", "--keep", "-1"], "is negative"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, argv: list[str], words: str
) -> None:
    code, out, err = cli(monkeypatch, capsys, *argv)
    assert code == 2 and out == ""
    assert words in one_error_line(err)


def test_a_short_grace_applies_only_when_no_publish_is_said_to_be_in_flight() -> None:
    """--apply under 10m races uploads in flight; --no-publish-in-flight (tuning paused in
    every cluster on the store) lifts that floor, and nothing else does."""
    parser = command._parser()
    args = parser.parse_args(["--uri", "file:///tmp", "--apply", "--grace", "0s"])
    with pytest.raises(command.UsageError, match="--no-publish-in-flight"):
        command.check_args(args)
    args = parser.parse_args(
        ["--uri", "file:///tmp", "--apply", "--grace", "0s", "--no-publish-in-flight"]
    )
    assert command.check_args(args).rules.grace_s == 0.0


def test_a_profile_list_it_cannot_read_is_one_line_exit_1_nothing_deleted(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    for i in range(3):
        world.publish("llama", rows(i))
    listing = world.objects()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    code, out, err = cli(
        monkeypatch, capsys, "--uri", world.uri, "--apply", "--keep", "0",
        "--kubeconfig", str(kubeconfig), profiles=None,
    )  # fmt: skip
    assert code == 1 and out == ""
    line = one_error_line(err)
    assert "cannot read tuningprofiles.tunefleet.io cluster-wide" in line
    assert "https://127.0.0.1:1" in line and "nothing was deleted" in line
    assert world.objects() == listing


def test_a_missing_kubeconfig_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, _, err = cli(
        monkeypatch, capsys, "--uri", "file:///tmp",
        "--kubeconfig", str(tmp_path / "nope"), profiles=None,
    )  # fmt: skip
    assert code == 1 and "--kubeconfig" in one_error_line(err)


def test_a_store_it_cannot_reach_is_one_line_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    code, out, err = cli(monkeypatch, capsys, "--uri", f"file://{tmp_path / 'absent'}")
    assert code == 1 and out == "" and "is not a directory" in one_error_line(err)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    code, out, err = cli(
        monkeypatch, capsys, "--uri", "s3://bucket/p", "--endpoint-url", "http://127.0.0.1:1",
        "--timeout-seconds", "4",
    )  # fmt: skip
    line = one_error_line(err)
    assert code == 1 and out == "" and "listing s3://bucket/p/" in line
    assert "check --uri, the endpoint and the credentials" in line


def test_apply_refuses_a_store_no_profile_names(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    for i in range(3):
        world.publish("llama", rows(i))
    listing = world.objects()
    elsewhere = world.profile.name("x").uid("uid-x").storage("s3://other-bucket/prefix").obj()
    monkeypatch.setattr(gc.rules, "clock", lambda: NOW)
    code, _, err = cli(
        monkeypatch, capsys, "--uri", world.uri, "--apply", "--keep", "0", profiles=[elsewhere]
    )
    assert code == 1 and "refusing to apply: none of the 1 profiles read names" in one_error_line(
        err
    )
    assert world.objects() == listing


def test_the_command_reports_a_dry_run_then_applies_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    world = World(tmp_path, "pvc")  # a store a profile can name
    where = ("--uri", world.uri, "--pvc-root", str(world.root))
    s = world.profile
    served = world.publish("llama", rows(1), revision=naming.revision(s.spec_model()))
    for i in range(2, 5):
        world.publish("llama", rows(i))
    llama = s.artifacts(served).obj()
    future = NOW + DAY
    monkeypatch.setattr(gc.rules, "clock", lambda: future)
    listing = world.objects()
    code, out, err = cli(monkeypatch, capsys, *where, "--keep", "1", profiles=[llama])
    print(out)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"tunefleet-gc: {world.uri}: dry run, nothing is deleted (--apply deletes)"
    assert sum(line.startswith("would delete artifact ") for line in lines) == 2
    assert world.objects() == listing
    code, out, err = cli(monkeypatch, capsys, *where, "--keep", "1", "--apply", profiles=[llama])
    assert (code, err) == (0, "")
    assert sum(line.startswith("deleted artifact ") for line in out.splitlines()) == 2
    assert artifact_keys(served, world) <= world.objects()


def test_durations() -> None:
    assert [gc.parse_duration(t) for t in ("90s", "15m", "6h", "2d", "30", "0")] == [
        90, 900, 21600, 172800, 30, 0,
    ]  # fmt: skip
    assert [gc.duration_text(s) for s in (21600, 600, 90, 0)] == ["6h", "10m", "90s", "0s"]
    assert [gc.age_text(s) for s in (3 * DAY + 5, 5400, 59)] == ["3d", "1h", "59s"]


# --- the chart's CronJob ----------------------------------------------------------------------


def test_the_chart_has_no_gc_unless_asked() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in rendered()}
    assert not any(kind == "CronJob" or name.endswith("-gc") for kind, name in kinds)


def test_the_gc_cronjob_runs_a_dry_run_by_default_with_least_rights() -> None:
    docs = rendered("gc.enabled=true", "gc.uri=s3://tunefleet/prod", "gc.credentialsSecret=s3")
    (cron,) = [d for d in docs if d["kind"] == "CronJob"]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"][0] == "tunefleet-gc" and "--apply" not in c["command"]
    assert c["command"][c["command"].index("--uri") + 1] == "s3://tunefleet/prod"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e for e in c["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "s3",
        "key": "AWS_SECRET_ACCESS_KEY",
    }
    role = next(
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "tf-tunefleet-gc"
    )
    # Read only: profiles for what status names, pods for what running model pods pin.
    assert role["rules"] == [
        {"apiGroups": ["tunefleet.io"], "resources": ["tuningprofiles"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    assert pod["serviceAccountName"] == "tf-tunefleet-gc"
    assert any(
        d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "tf-tunefleet-gc"
        for d in docs
    )


def test_the_gc_cronjob_follows_watch_namespaces_and_applies_when_asked() -> None:
    docs = rendered(
        "gc.enabled=true", "gc.uri=s3://tunefleet/prod", "gc.apply=true",
        "operator.watchNamespaces={ml,vision}",
    )  # fmt: skip
    (cron,) = [d for d in docs if d["kind"] == "CronJob"]
    (c,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    cmd = c["command"]
    assert "--apply" in cmd
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--namespace"] == ["ml", "vision"]
    bindings = [
        d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "tf-tunefleet-gc"
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["ml", "vision"]
    assert not any(
        d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "tf-tunefleet-gc"
        for d in docs
    )


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("gc.uri=gs://x", "/gc/uri"),
        ("gc.grace=soon", "/gc/grace"),
        ("gc.keep=-1", "/gc/keep"),
    ],
)
def test_bad_gc_values_are_refused_naming_them(value: str, named: str) -> None:
    out = template("gc.enabled=true", value)
    assert out.returncode != 0 and named in out.stderr, out.stderr


def test_an_enabled_gc_needs_a_uri() -> None:
    out = template("gc.enabled=true")
    assert out.returncode != 0 and "gc.uri" in out.stderr
