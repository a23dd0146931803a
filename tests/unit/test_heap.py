"""heap.compacted: a table a burst grew is rebuilt once emptied; the cache, the queue and what
is remembered swap theirs in at housekeeping without losing an entry."""

from __future__ import annotations

import sys

from testbed.builders.wrappers import make_job
from tunefleet.runtime import heap
from tunefleet.runtime.workqueue import WorkQueue
from tunefleet.watched.cache import ProfileCache


def test_a_table_emptied_by_a_burst_is_rebuilt_small_and_a_full_one_is_kept() -> None:
    table = {f"uid-{i}": i for i in range(10_000)}
    peak = sys.getsizeof(table)
    assert heap.compacted(table) is table  # full: a copy would be no smaller
    for k in list(table)[:9_990]:
        del table[k]
    assert sys.getsizeof(table) == peak  # what the fix is for: dicts never shrink
    small = heap.compacted(table)
    assert small == table and small is not table
    assert sys.getsizeof(small) < peak / 100
    tiny: dict[str, int] = {"a": 1}
    assert heap.compacted(tiny) is tiny


# A Job of namespace ns, its metadata alone (each event gives it a uid and an owning profile):
# as small as the Jobs this test has always cached, since it measures the cache's tables.
JOB = make_job(ns="ns").without("apiVersion").without("kind").without("spec").without("status")


def test_the_cache_compacts_and_keeps_following_events() -> None:
    cache = ProfileCache()
    for i in range(5_000):
        cache.follow("jobs", "ADDED", JOB.name(f"j{i}").uid(f"j{i}").owner(f"p{i}").obj())
    before = sys.getsizeof(cache._at)
    for i in range(4_990):
        cache.follow("jobs", "DELETED", JOB.name(f"j{i}").uid(f"j{i}").owner(f"p{i}").obj())
    cache.compact()
    assert sys.getsizeof(cache._at) < before / 10
    assert cache.sizes()["jobs"] == 10 and cache.sizes()["placed"] == 10
    # Events after the swap land in the new tables: nothing written to the old ones.
    cache.follow("jobs", "ADDED", JOB.name("new").uid("new").owner("p-new").obj())
    assert [j["metadata"]["uid"] for j in cache.jobs("ns", "p-new")] == ["new"]
    cache.follow("jobs", "DELETED", JOB.name("j4999").uid("j4999").owner("p4999").obj())
    assert cache.jobs("ns", "p4999") == []


def test_the_queue_compacts_its_tables_on_prune() -> None:
    q: WorkQueue[str] = WorkQueue()
    for i in range(5_000):
        q.add(f"k{i}")
    while q.get(timeout=0) is not None:
        pass
    peak = sys.getsizeof(q._lane)
    q.prune(lambda k: True)
    assert sys.getsizeof(q._lane) < peak / 10
    q.add("again")
    assert q.get(timeout=0) == "again"


def test_a_full_collection_follows_a_rebuild_once_and_not_every_pass(monkeypatch) -> None:
    """After a mass deletion Python's free lists keep objects scattered over the burst's slabs;
    the pass after a table was rebuilt collects fully (which empties them), later passes don't."""
    calls: list[int] = []
    monkeypatch.setattr(heap.gc, "collect", lambda *a: calls.append(1) or 0)
    monkeypatch.setattr(heap, "_shrunk", False)
    table = {i: i for i in range(10_000)}
    heap.compacted(table)
    heap.release_memory()
    assert calls == []  # nothing rebuilt: no collection
    for k in range(9_990):
        del table[k]
    heap.compacted(table)
    heap.release_memory()
    heap.release_memory()
    assert calls == [1]


def test_a_cached_view_takes_its_length_not_the_serializer_s_buffer() -> None:
    """orjson's output is its whole write buffer (4 KiB for 1 KB of JSON); the cache keeps a
    view for the object's life, so it must keep the bytes alone."""
    import tracemalloc

    from tunefleet.informers.view_cache import _pack

    view = {"metadata": {"name": "p" * 40, "uid": "u" * 36}, "spec": {"x": "y" * 900}}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        blob = _pack(view)
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 1000 < len(blob) < 1100
    assert taken < len(blob) + 256, f"{taken} bytes held for {len(blob)} bytes of view"


def test_a_spec_s_revision_is_kept_while_the_spec_lives_and_goes_with_it(monkeypatch) -> None:
    """naming.revision is asked ~10 times a reconcile: computed once per parsed spec, and
    nothing of a spec outlives it (a table of the last specs kept them past a deletion)."""
    import gc

    from tunefleet import naming
    from tunefleet.reconciler.gather import parse_spec

    raw = {
        "image": "registry.example.com/serve:1",
        "gpu": {"vendor": "nvidia", "models": ["NVIDIA-H100-80GB-HBM3"]},
        "workload": {"command": ["python3", "serve.py"]},
        "storage": {"uri": "s3://bucket/prefix", "credentialsSecret": {"name": "s3"}},
    }
    computed: list[int] = []
    real = naming._revision
    monkeypatch.setattr(naming, "_revision", lambda s: computed.append(1) or real(s))
    spec, problems = parse_spec(raw)
    assert spec is not None, problems
    first = naming.revision(spec)
    assert naming.revision(spec) == first and len(computed) == 1
    other, _ = parse_spec(raw)
    assert other is not None and naming.revision(other) == first and len(computed) == 2
    assert other == spec  # the memo is not part of the model: equal specs stay equal
    held = len(naming._REVISIONS)
    del spec, other
    gc.collect()
    assert len(naming._REVISIONS) == held - 2
