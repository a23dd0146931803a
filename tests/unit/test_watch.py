"""The reflectors (runtime/reflector.py, the kinds of watch.py) and the cache they fill: lists page by page, watch from the list's
version, resume a dropped stream where it was, list again when the version expired, and after
every list nothing of what the API server no longer has stays in the cache. And the cache's
own lifecycle: compact views in, the same dicts out, every entry gone with its object."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from testbed.builders.wrappers import make_job, make_profile
from tests.support.fake_kube import FakeKube, FakeWatchApi, StopTest
from tunefleet import kube, naming
from tunefleet.config import Config
from tunefleet.reconciler.controller import Controller, Indexes
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.reconcile import sync_profile
from tunefleet.runtime import client, reflector
from tunefleet.watched import kinds
from tunefleet.watched.cache import ProfileCache

# Profile p (uid u, version 1) as the list and the watch hand it over; and a Job it controls.
PROFILE = (
    make_profile()
    .uid("u")
    .resource_version("1")
    .spec_is({})
    .image("x")
    .status(phase="Pending", jobs=[{"state": "Running"}])
)
JOB = (
    make_job()
    .without("spec")
    .labels({naming.PROFILE_UID_LABEL: "u", naming.TUNING_PROFILE_LABEL: "p"})
    .owner("u")
    .active(1)
)


def make_reflector(
    api: FakeWatchApi, cache: ProfileCache, seen: list[tuple[str | None, str]]
) -> reflector.Reflector:
    def handler(kind: str | None, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        seen.append((kind, meta.get("name", "")))
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if kind == "DELETED":
            cache.drop_profile(key)
        else:
            cache.put_profile(body)

    def forget(uid: str) -> None:
        handler("DELETED", cache.stub("tuningprofiles", uid))

    held = reflector.Held(lambda: cache.known("tuningprofiles", "ml"), forget)
    return reflector.Reflector(
        api, kinds.PROFILES, "ml", handler, held, reflector.Clock(sleep=lambda s: False)
    )


def run_until_stop(r: reflector.Reflector) -> None:
    """Run the reflector's loop until the fake runs out of scripted streams."""
    with pytest.raises(StopTest):
        r.run()


def test_the_list_comes_page_by_page_then_the_watch_starts_at_its_version() -> None:
    cache, seen = ProfileCache(), []
    api = FakeWatchApi(
        [PROFILE.name(f"p{i}").uid(f"u{i}").obj() for i in range(5)], page=2, rv="42"
    )
    api.streams = [
        [{"type": "ADDED", "object": PROFILE.name("p5").uid("u5").resource_version("43").obj()}]
    ]
    r = make_reflector(api, cache, seen)
    run_until_stop(r)
    assert [p.get("continue", "") for p in api.lists] == ["", "2", "4"]
    assert all(p["limit"] == str(client.LIST_PAGE) for p in api.lists)
    assert api.watches[0]["resourceVersion"] == "42"
    assert api.watches[0]["allowWatchBookmarks"] == "true"
    # The second watch resumes after the last event seen, without listing again.
    assert api.watches[1]["resourceVersion"] == "43" and len(api.lists) == 3
    assert r.listed.is_set() and sorted(k[1] for k in cache.profiles()) == [
        f"p{i}" for i in range(6)
    ]
    assert seen[:5] == [(None, f"p{i}") for i in range(5)] and seen[5] == ("ADDED", "p5")


def test_an_expired_version_lists_again_and_drops_what_the_list_no_longer_has() -> None:
    cache, seen = ProfileCache(), []
    a, b = PROFILE.name("a").uid("ua"), PROFILE.name("b").uid("ub")
    api = FakeWatchApi([a.obj(), b.obj()], rv="5")
    api.streams = [[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]]
    r = make_reflector(api, cache, seen)

    def relist_without_b(version: str) -> str:
        api.items = [a.resource_version("9").obj()]  # b was deleted while nobody watched
        return reflector.Reflector.watch(r, version)

    r.watch = relist_without_b  # type: ignore[method-assign]
    run_until_stop(r)
    assert r.lists == 2
    assert cache.profiles() == [("ml", "a")]
    assert ("DELETED", "b") in seen


def test_an_expired_continue_token_starts_the_list_over() -> None:
    cache, seen = ProfileCache(), []
    api = FakeWatchApi([PROFILE.name(f"p{i}").uid(f"u{i}").obj() for i in range(3)], page=1)
    api.expire_continue = 1
    r = make_reflector(api, cache, seen)
    assert r.list_all() == "10"
    assert [p.get("continue", "") for p in api.lists] == ["", "1", "", "1", "2"]
    assert len(cache.profiles()) == 3


def test_a_failed_call_backs_off_and_resumes_from_the_version_it_had() -> None:
    cache, seen = ProfileCache(), []
    api = FakeWatchApi([PROFILE.name("a").uid("ua").obj()], rv="7")
    api.streams = [
        [{"type": "MODIFIED", "object": PROFILE.name("a").uid("ua").resource_version("8").obj()}],
        RuntimeError("connection refused"),
        [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}}],
    ]
    slept: list[float] = []
    r = make_reflector(api, cache, seen)
    r._sleep = lambda s: slept.append(s) or False  # type: ignore[assignment, func-returns-value]
    run_until_stop(r)
    assert [w["resourceVersion"] for w in api.watches] == ["7", "8", "8", "12"]
    assert slept == [reflector.BACKOFF[0]] and len(api.lists) == 1
    assert cache.profile(("ml", "a"))["metadata"]["resourceVersion"] == "8"  # type: ignore[index]


def test_a_watch_error_other_than_expiry_is_retried_not_fatal() -> None:
    cache, seen = ProfileCache(), []
    api = FakeWatchApi([], rv="3")
    api.streams = [[{"type": "ERROR", "object": {"code": 500, "message": "etcd"}}], []]
    slept: list[float] = []
    r = make_reflector(api, cache, seen)
    r._sleep = lambda s: slept.append(s) or False  # type: ignore[assignment, func-returns-value]
    run_until_stop(r)
    assert slept and len(api.lists) == 1


def test_wait_listed_waits_for_every_reflector() -> None:
    a, b = threading.Event(), threading.Event()

    class R:
        def __init__(self, e: threading.Event) -> None:
            self.listed = e

    group = reflector.Reflectors([R(a), R(b)])  # type: ignore[list-item]
    a.set()
    assert not group.wait_listed(timeout=0.05)
    b.set()
    assert group.wait_listed(timeout=0.05)


def test_watch_lines_are_split_across_chunks() -> None:
    chunks = [b'{"type":"ADDED","obj', b'ect":{}}\n{"type":"DEL', b'ETED","object":{}}\n']
    assert [e["type"] for e in client.parse_lines(chunks)] == ["ADDED", "DELETED"]


# --- the cache ------------------------------------------------------------------------------


def test_views_go_in_compact_and_come_out_as_the_dicts_they_were() -> None:
    cache = ProfileCache()
    view = cache.put_profile(PROFILE.obj())
    assert cache.profile(("ml", "p")) == view
    cache.follow("jobs", None, JOB.name("j").uid("j1").obj())
    (got,) = cache.jobs("ml", "u")
    assert got["metadata"]["name"] == "j" and got["status"]["active"] == 1
    got["status"]["active"] = 99  # a reader's copy: the cache is not changed through it
    assert cache.jobs("ml", "u")[0]["status"]["active"] == 1
    cache.written(("ml", "p"), "2", {"phase": "Ready", "jobs": []})
    assert cache.profile(("ml", "p"))["metadata"]["resourceVersion"] == "2"  # type: ignore[index]
    assert cache.statuses() == [{"phase": "Ready", "jobs": [], "unadmittedPods": 0}]


def test_known_and_stub_let_a_relist_hand_back_what_is_gone() -> None:
    cache = ProfileCache()
    cache.put_profile(PROFILE.obj())
    cache.put_profile(PROFILE.name("q").namespace("other").uid("v").obj())
    cache.follow("jobs", None, JOB.name("j").uid("j1").obj())
    cache.follow("jobs", None, JOB.name("forged").uid("j2").meta(ownerReferences=[]).obj())
    assert cache.known("tuningprofiles", "ml") == {"u"}
    assert cache.known("tuningprofiles", None) == {"u", "v"}
    assert cache.known("jobs", "ml") == {"j1", "j2"} and cache.known("jobs", "other") == set()
    stub = cache.stub("jobs", "j1")
    assert stub["metadata"]["name"] == "j"
    assert stub["metadata"]["labels"] == {"tunefleet.io/tuning-profile": "p"}
    cache.follow("jobs", "DELETED", stub)
    cache.follow("jobs", "DELETED", cache.stub("jobs", "j2"))
    cache.drop_profile(("ml", "p"))
    cache.drop_profile(("other", "q"))
    assert cache.sizes() == {
        "profiles": 0, "jobs": 0, "pods": 0, "untrusted": 0, "placed": 0, "bytes": 0,
    }  # fmt: skip


def controller_of(cache: ProfileCache) -> Controller:
    """A controller reading `cache`, not started."""
    indexes = Indexes(
        cache.profile, cache.profiles, cache.jobs, cache.pods, has_profile=cache.has_profile_uid
    )
    return Controller(FakeKube(), Config(), indexes, sync_profile, workers=1)


def test_what_is_remembered_follows_what_the_cache_holds() -> None:
    """A reconcile under way when its profile was deleted may remember it after the
    deletion's forget: housekeeping drops it, and the queue's failure count with it."""
    cache = ProfileCache()
    cache.put_profile(PROFILE.obj())
    c = controller_of(cache)
    c.memory.of("u").written_rv = "3"
    c.memory.of("gone-uid").written_rv = "4"
    c.memory.unadmitted[("ml", "gone")] = ["x"]
    c.memory.unadmitted[("ml", "p")] = ["y"]
    c.queue.retry(("ml", "gone"))
    c.queue.retry(("ml", "p"))
    c.housekeeping()
    assert set(c.memory.profiles) == {"u"}
    assert set(c.memory.unadmitted) == {("ml", "p")}
    assert c.queue.failures(("ml", "gone")) == 0 and c.queue.failures(("ml", "p")) == 1


def test_memory_prune_counts_what_went() -> None:
    m = Memory()
    m.of("a")
    m.of("b")
    assert m.prune(lambda uid: uid == "a", set()) == 1 and set(m.profiles) == {"a"}


def test_a_burst_of_events_drops_past_the_queue_and_never_blocks() -> None:
    gate = threading.Event()
    poster = kube._Poster(workers=1, size=2)
    done: list[int] = []

    def post(i: int) -> None:
        gate.wait(5)
        done.append(i)

    for i in range(5):
        poster.submit(lambda i=i: post(i))  # one running, two waiting, two dropped
    assert poster.dropped >= 2
    gate.set()
    deadline = time.monotonic() + 5
    while len(done) < 5 - poster.dropped and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(done) == 5 - poster.dropped


def test_a_relist_hands_back_the_capture_configmaps_it_no_longer_returns() -> None:
    """The capture cache is a reflector's table as the main cache is: its known uids, and a
    stub that its DELETED follow takes."""
    from tunefleet.capture.retune_sets import (
        Batch,
        StoreKey,
        StoreView,
        build_store_config_map,
        merge,
    )
    from tunefleet.capture.retune_sets_cache import CaptureCache

    captures = CaptureCache()
    model = "AMD_Instinct_MI300X_OAM"
    rows = ["GemmTunableOp_BFloat16_NN,nn_8_8_8_ld_8_8_8"]
    view, _ = merge(StoreView(StoreKey("ml", "p", "uid-1", model, "lib-1")), Batch(rows), 100, 64)
    cm = build_store_config_map(view)
    cm["metadata"]["uid"] = "cm-1"
    assert captures.follow("ADDED", cm) == "uid-1"
    assert captures.known("configmaps", "ml") == {"cm-1"}
    assert captures.known("configmaps", "other") == set()
    assert captures.known("configmaps", None) == {"cm-1"}

    stub = captures.stub("configmaps", "cm-1")
    assert stub["metadata"]["name"] == cm["metadata"]["name"]
    assert captures.follow("DELETED", stub) == "uid-1"
    assert captures.known("configmaps", None) == set()
    assert captures.sizes() == {"stores": 0, "retunes": 0}
    assert captures.stub("configmaps", "cm-1") == {}


def test_the_capture_configmaps_are_selected_server_side_by_role() -> None:
    selector = kinds.CAPTURE_CONFIGMAPS.label_selector
    assert "app.kubernetes.io/managed-by=tunefleet" in selector
    assert f"in ({naming.ROLE_CAPTURE},{naming.ROLE_RETUNE})" in selector
    assert kinds.CAPTURE_CONFIGMAPS.path("ml") == "/api/v1/namespaces/ml/configmaps"


def test_one_paginator_follows_continue_tokens_and_holds_one_page() -> None:
    asked: list[str] = []
    answers = {"": "t1", "t1": "t2", "t2": ""}

    def fetch(token: str) -> dict[str, Any]:
        asked.append(token)
        return {"items": [token], "metadata": {"continue": answers[token]}}

    assert [p["items"][0] for p in client.pages(fetch)] == ["", "t1", "t2"]
    assert asked == ["", "t1", "t2"]
