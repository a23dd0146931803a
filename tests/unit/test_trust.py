"""Trust the API server, not labels or memory: ownership is identity, records outlive pods,
status writes are refereed, superseded Jobs go, failed attempts show, the leader is fenced,
and what the operator remembers is pruned with what it describes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from testbed.builders.profiles import CFG, MODELS, jobs_for, profile
from testbed.builders.records import SHA, completed, pod_body, published_pod, record
from testbed.builders.wrappers import make_job
from tests.support.fake_kube import RECONCILE_WRITERS, FakeKube, HangingLeases
from tunefleet import kube, naming
from tunefleet.reconciler.controller import Controller, Indexes
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.reconcile import Around, sync_profile
from tunefleet.runtime import client
from tunefleet.runtime.leader import Callbacks, LeaseElector, Timing
from tunefleet.watched.cache import ProfileCache

OWNER = {
    "apiVersion": "tunefleet.io/v1alpha1",
    "kind": "TuningProfile",
    "uid": "uid-1",
    "controller": True,
}

# A Job of profile p (uid-1) with tunefleet's labels, with and without its owner reference.
UNOWNED = make_job().managed_by()
OWNED = UNOWNED.meta(ownerReferences=[OWNER])


# --- ownership is identity -------------------------------------------------------------------


def test_only_children_the_profile_controls_in_its_namespace_count() -> None:
    real = OWNED.name("real").uid("uid-real")
    no_owner = UNOWNED.name("no-owner").uid("uid-no-owner")
    elsewhere = OWNED.name("elsewhere").namespace("other").uid("uid-elsewhere")
    cache = ProfileCache()
    cache.follow("jobs", None, real.obj())
    cache.follow("jobs", None, no_owner.obj())
    cache.follow("jobs", None, elsewhere.obj())  # owner uid right, ns wrong
    assert [j["metadata"]["name"] for j in cache.jobs("ml", "uid-1")] == ["real"]
    assert {u.name for u in cache.untrusted("uid-1")} == {"no-owner"}
    cache.follow("pods", None, pod_body("real-0", "uid-real"))
    cache.follow("pods", None, pod_body("forged", None, record()))  # labels only
    cache.follow("pods", None, pod_body("of-forged-job", "uid-no-owner", record()))
    assert [p["metadata"]["name"] for p in cache.pods("ml", "uid-real")] == ["real-0"]
    assert {u.name for u in cache.untrusted("uid-1")} == {"no-owner", "forged"}
    # An owner reference taken away later: no longer a child.
    cache.follow("jobs", "MODIFIED", real.without("metadata", "ownerReferences").obj())
    assert cache.jobs("ml", "uid-1") == []
    cache.follow("jobs", "DELETED", real.without("metadata", "ownerReferences").obj())
    cache.follow("jobs", "DELETED", no_owner.obj())
    cache.follow("pods", "DELETED", pod_body("forged", None))
    assert cache.untrusted("uid-1") == []
    cache.follow("pods", "DELETED", pod_body("real-0", "uid-real"))
    cache.follow("pods", "DELETED", pod_body("of-forged-job", "uid-no-owner"))
    cache.follow("jobs", "DELETED", elsewhere.obj())
    assert cache.sizes() == dict.fromkeys(
        ("profiles", "jobs", "pods", "untrusted", "placed", "bytes"), 0
    )


def test_a_child_event_that_changes_nothing_kept_says_so_and_any_real_change_is_taken() -> None:
    # handlers/startup.follow_child queues no reconcile for the first kind: the Job
    # controller marking each Job the gate holds Suspended cost one reconcile a profile.
    cache = ProfileCache()
    held = OWNED.name("held").uid("uid-held").spec(suspend=True)
    assert cache.follow("jobs", "ADDED", held.obj()) is True
    assert cache.follow("jobs", "MODIFIED", held.obj()) is False
    assert cache.follow("jobs", "MODIFIED", held.condition("Suspended").obj()) is False
    assert cache.follow("jobs", "MODIFIED", held.spec(suspend=False).obj()) is True
    done = held.spec(suspend=False).condition("Complete")
    assert cache.follow("jobs", "MODIFIED", done.obj()) is True
    assert cache.jobs("ml", "uid-1")[0]["status"]["conditions"][0]["type"] == "Complete"
    # Taken from its owner: no longer its child (kept as untrusted), a change.
    assert cache.follow("jobs", "MODIFIED", done.without("metadata", "ownerReferences").obj())
    assert cache.follow("jobs", "DELETED", done.obj()) is True


def test_a_forged_record_never_reaches_status_and_is_reported_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = ProfileCache()
    forged = UNOWNED.name("forged").uid("uid-forged").obj()
    for body in (forged, pod_body("forged-0", None, record())):
        cache.follow("jobs" if "spec" in body and not body["spec"] else "pods", None, body)
    api = FakeKube(writers=RECONCILE_WRITERS)
    memory = Memory()
    p = profile(gpu={"vendor": "amd", "models": MODELS[:1]})
    status = sync_profile(
        p, [], [], CFG, memory, Around(api, untrusted=cache.untrusted("uid-1"))
    ).status.to_status()
    assert status["artifacts"] == [] and status["phase"] == "Pending"
    assert [k for k, _ in api.created] == ["ConfigMap", "Job"]  # the real Job is made
    untrusted = [m for r, m in api.events if r == "UntrustedObject"]
    assert len(untrusted) == 2 and all("is ignored" in m for m in untrusted)
    assert {m.split()[1] for m in untrusted} == {"ml/forged", "ml/forged-0"}
    sync_profile(
        {**p, "status": status},
        [],
        [],
        CFG,
        memory,
        Around(api, untrusted=cache.untrusted("uid-1")),
    )
    assert len([r for r, _ in api.events if r == "UntrustedObject"]) == 2  # said once each


def test_an_object_of_someone_else_under_our_name_is_never_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = profile(gpu={"vendor": "amd", "models": MODELS[:1]})
    (job,) = jobs_for(p, MODELS[:1])
    api = FakeKube(writers=RECONCILE_WRITERS, foreign={job["metadata"]["name"]})
    outcome = sync_profile(p, [], [], CFG, Memory(), Around(api))
    assert isinstance(outcome.error, kube.Temporary)
    assert "not controlled by" in str(outcome.error)
    assert api.created == []
    ready = api.patches[-1]["conditions"][0]
    assert ready["reason"] == "JobCreateFailed" and "delete it" in ready["message"]


# --- records that outlive pods ----------------------------------------------------------------


def test_a_record_read_from_a_pod_is_kept_on_its_job_and_outlives_the_pods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = profile(gpu={"vendor": "amd", "models": MODELS[:1]})
    job = completed(p)
    uri = f"s3://bkt/p/ml/p/{MODELS[0]}/{SHA}"
    api = FakeKube(writers=RECONCILE_WRITERS)
    status = sync_profile(
        p, [job], [published_pod(job, uri)], CFG, Memory(), Around(api)
    ).status.to_status()
    assert status["phase"] == "Ready"
    (kind, name, patch), *_ = api.owned_patches
    assert (kind, name) == ("Job", job["metadata"]["name"])
    kept = patch["metadata"]["annotations"][naming.RECORD_ANNOTATION]
    # The pods are deleted (by hand, by terminated-pod GC, by a drain): still Ready.
    for annotated, previous in ((completed(p, kept), {}), (completed(p), status)):
        again = sync_profile(
            {**p, "status": previous}, [annotated], [], CFG, Memory(), Around(api)
        ).status.to_status()
        assert again["phase"] == "Ready" and again["artifacts"][0]["uri"] == uri
        assert not [r for r, _ in api.events if r == "TuningFailed"]


# --- refereed status writes -------------------------------------------------------------------


def test_status_is_written_over_the_version_read_and_an_invalid_profile_keeps_no_stale_figure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeKube(writers=RECONCILE_WRITERS)
    seen = api.status_versions
    p = profile(gpu={"vendor": "amd", "models": MODELS[:1]})
    job = completed(p)
    p["metadata"]["resourceVersion"] = "7"
    ready = sync_profile(
        p, [job], [published_pod(job, f"s3://bkt/x/{SHA}")], CFG, Memory(), Around(api)
    ).status.to_status()
    assert seen == ["7"] and ready["tunedGemms"] and ready["revision"]
    broken = profile(gpu={"vendor": "amd", "models": ["MI300X OAM"]})
    broken["metadata"]["resourceVersion"] = "9"
    outcome = sync_profile({**broken, "status": ready}, [], [], CFG, Memory(), Around(api))
    assert isinstance(outcome.error, kube.Permanent)
    invalid = api.patches[-1]
    assert invalid["phase"] == "Invalid" and invalid["artifacts"] == ready["artifacts"]
    for stale in ("tunedGemms", "gemms", "note", "revision", "progress", "reuse", "shortSha256"):
        assert stale not in invalid, stale


def test_a_conflict_reads_again_and_memory_never_overrides_the_api_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeKube(
        writers=RECONCILE_WRITERS,
        intercept={"get_profile": lambda ns, name, t: {"metadata": {"name": name}}},
    )
    api.conflict = True
    p = profile()
    refreshed: list[Any] = []
    indexes = Indexes(
        profile=lambda key: p,
        profiles=lambda: [("ml", "p")],
        jobs=lambda ns, uid: [],
        pods=lambda ns, uid: [],
        refresh=refreshed.append,
    )
    c = Controller(api, CFG, indexes, sync_profile, workers=1)
    c.process(("ml", "p"))
    assert refreshed == [{"metadata": {"name": "p"}}]
    assert c.queue.pending() == 1  # computed again from the fresh read, soon


# --- superseded Jobs and failed attempts -------------------------------------------------------


def test_jobs_of_an_earlier_revision_are_removed_with_their_configmaps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = profile(image="registry.example.com/serve:1")
    old_jobs = jobs_for(old, MODELS)
    cm = {"metadata": {"uid": "cm-uid", "ownerReferences": [OWNER]}}
    api = FakeKube(
        writers=RECONCILE_WRITERS,
        intercept={"read": lambda kind, ns, name: cm if kind == "ConfigMap" else None},
    )
    new = profile(image="registry.example.com/serve:2")
    sync_profile(new, old_jobs, [], CFG, Memory(), Around(api))
    names = {j["metadata"]["name"] for j in old_jobs}
    assert {n for k, n in api.deleted if k == "Job"} == names
    assert {n for k, n in api.deleted if k == "ConfigMap"} == names
    assert len([n for k, n in api.created if k == "Job"]) == 2  # the new revision's
    assert [r for r, _ in api.events].count("TuningJobSuperseded") == 2


def test_a_failed_attempt_of_a_retrying_job_shows_with_its_cause_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = profile(gpu={"vendor": "amd", "models": MODELS[:1]})
    (job,) = jobs_for(p, MODELS[:1])
    job = {**job, "status": {"failed": 1, "active": 1, "conditions": []}}
    failed = pod_body("tune-a", job["metadata"]["uid"])
    failed["status"] = {
        "phase": "Failed",
        "containerStatuses": [
            {
                "name": "publish",
                "state": {
                    "terminated": {
                        "exitCode": 1,
                        "message": "tunefleet-publish: error: InternalError (HTTP 500)",
                    }
                },
            }
        ],
    }
    from tunefleet.watched.views import pod_view

    api = FakeKube(writers=RECONCILE_WRITERS)
    memory = Memory()
    status = sync_profile(p, [job], [pod_view(failed)], CFG, memory, Around(api)).status.to_status()
    progressing = status["conditions"][1]
    assert (
        progressing["reason"] == "AttemptFailed"
        and "attempt 1 of 2 failed" in progressing["message"]
    )
    assert "HTTP 500" in progressing["message"] and status["jobs"][0]["failedAttempts"] == 1
    sync_profile({**p, "status": status}, [job], [pod_view(failed)], CFG, memory, Around(api))
    assert len([r for r, _ in api.events if r == "AttemptFailed"]) == 1


# --- the fenced leader --------------------------------------------------------------------------


def test_a_leader_whose_calls_hang_stops_writing_before_its_lease_can_be_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client, "MIN_WRITE_SECONDS", 0.05)
    api = HangingLeases()
    events: list[str] = []
    timing = Timing(duration=1.0, renew_deadline=0.6, retry=0.1, call_timeout=0.2)
    elector = LeaseElector(
        "l",
        "ns",
        "a",
        Callbacks(lambda: events.append("leads"), lambda: events.append("follows")),
        FakeKube(writers=RECONCILE_WRITERS, generated={"coordination": api}),
        timing,
    )
    writer = kube.Kube()  # a process's client: its writes ask this elector's fence
    writer.set_fence(elector.fence)
    try:
        elector.start()
        deadline = time.monotonic() + 5
        while not elector.leading and time.monotonic() < deadline:
            time.sleep(0.02)
        assert elector.leading and writer.write_timeout() > 0
        api.hang.set()
        hung_at = time.monotonic()
        while elector.fence() > 0:
            time.sleep(0.01)
        # Fenced within the renew deadline of the last good renewal, before `duration`.
        assert time.monotonic() - hung_at <= timing.renew_deadline + 0.05
        with pytest.raises(kube.NotLeading):
            writer.write_timeout()
        while "follows" not in events and time.monotonic() < deadline:
            time.sleep(0.02)
        assert events == ["leads", "follows"]
    finally:
        api.hang.clear()
        elector.stop(release=False)


def test_a_replica_that_stops_leading_forgets_what_it_remembered() -> None:
    c = Controller(
        FakeKube(writers=RECONCILE_WRITERS),
        CFG,
        Indexes(lambda k: None, list, lambda ns, u: [], lambda ns, u: []),
        sync_profile,
        workers=1,
    )
    c.memory.of("uid-1").written_rv = "5"
    c.memory.unadmitted[("ml", "p")] = ["x"]
    c.follow()
    assert c.memory.profiles == {} and c.memory.unadmitted == {}


def test_what_is_remembered_of_a_profile_is_pruned_with_its_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeKube(writers=RECONCILE_WRITERS)
    memory = Memory()
    mine = memory.of("uid-1")
    mine.image_ids.update({"gone-job": "x"})
    mine.pod_events.update({"gone-pod": (0.0, [])})
    mine.reported.add("gone-object")
    p = profile()
    jobs = jobs_for(p, MODELS)
    sync_profile(p, jobs, [], CFG, memory, Around(api))
    assert (mine.image_ids, mine.pod_events, mine.reported) == ({}, {}, set())
    memory.node_counts[("k", "m")] = (time.monotonic() - 3600, 1)
    memory.prune_node_counts()
    assert memory.node_counts == {}
    memory.forget("uid-1")
    assert memory.profiles == {}
