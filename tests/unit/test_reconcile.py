"""sync_profile against a recording stand-in for the API (tunefleet.kube): what it creates,
writes and announces, and what it does not (unit tier: the API calls are stubbed)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from testbed.builders.profiles import CFG, MODELS, jobs_for, profile
from tests.support.fake_kube import RECONCILE_WRITERS, FakeKube, Generated, OverGenerated, raw
from tunefleet import kube
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.reconcile import Around, sync_profile
from tunefleet.watched.views import profile_view


def test_every_missing_job_is_made_even_when_an_earlier_one_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The old bug: "already exists" for the first model ended the reconcile with an error,
    # so later models never got their Job.
    p = profile()
    first = jobs_for(p, MODELS[:1])
    api = FakeKube(writers=RECONCILE_WRITERS, existing={first[0]["metadata"]["name"]})
    sync_profile(p, first, [], CFG, Memory(), Around(api))
    made = [n for k, n in api.created if k == "Job"]
    assert made == [jobs_for(p, MODELS[1:])[0]["metadata"]["name"]]
    assert ("ConfigMap", made[0]) in api.created  # its configuration, first


def test_an_existing_job_the_index_has_not_seen_yet_is_success(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = profile()
    names = {j["metadata"]["name"] for j in jobs_for(p, MODELS)}
    api = FakeKube(writers=RECONCILE_WRITERS, existing=names)
    status = sync_profile(
        p, [], [], CFG, Memory(), Around(api)
    ).status.to_status()  # no exception: 409 means done
    assert api.created == []  # both 409: nothing made twice, and no error
    assert status["phase"] == "Pending"


def test_a_settled_profile_costs_no_api_call(monkeypatch: pytest.MonkeyPatch) -> None:
    p = profile()
    jobs = jobs_for(p, MODELS)
    api = FakeKube(writers=RECONCILE_WRITERS)
    memory = Memory()
    sync_profile(p, jobs, [], CFG, memory, Around(api))
    assert api.created == [] and len(api.patches) == 1
    for _ in range(3):  # resyncs, echoes of our own status write
        sync_profile({**p, "status": api.patches[-1]}, jobs, [], CFG, memory, Around(api))
    assert api.created == [] and len(api.patches) == 1 and len(api.events) == 0


def test_the_status_written_with_new_jobs_lists_them_so_their_echo_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = profile()
    api = FakeKube(writers=RECONCILE_WRITERS)
    memory = Memory()
    sync_profile(p, [], [], CFG, memory, Around(api))
    assert len(api.patches) == 1
    names = sorted(j["name"] for j in api.patches[0].get("jobs") or [])
    assert names == sorted(j["metadata"]["name"] for j in jobs_for(p, MODELS))
    # The watch brings the Jobs just made: the status already says what they say.
    sync_profile(
        {**p, "status": api.patches[-1]}, jobs_for(p, MODELS), [], CFG, memory, Around(api)
    )
    assert len(api.patches) == 1


def test_a_job_made_for_kueue_is_not_observed_before_kueue_has_seen_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A suspended Job just made has no Workload yet: saying why it waits is Kueue's, read by
    # the reconcile its echo brings (its status would otherwise blame Kueue for 15 s).
    p = profile(tuning={"queueName": "tuning"})
    asked: list[str] = []
    api = FakeKube(
        writers=RECONCILE_WRITERS, intercept={"list_custom": lambda *a: asked.append(a[-1]) or []}
    )
    sync_profile(p, [], [], CFG, Memory(), Around(api))
    assert [k for k, _ in api.created].count("Job") == 2
    assert not (api.patches[-1].get("jobs") if api.patches else None) and asked == []


def test_invalid_spec_is_a_condition_and_a_permanent_error(monkeypatch: pytest.MonkeyPatch) -> None:
    p = profile(gpu={"vendor": "amd", "models": ["MI300X OAM"]})
    api = FakeKube(writers=RECONCILE_WRITERS)
    outcome = sync_profile(p, [], [], CFG, Memory(), Around(api))
    assert isinstance(outcome.error, kube.Permanent)
    assert re.search("can't be a node label value", str(outcome.error))
    assert api.created == []
    (status,) = api.patches
    assert status["phase"] == "Invalid"
    assert [r for r, _ in api.events] == ["InvalidSpec"]


def test_a_job_the_api_server_refuses_is_reported_not_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeKube(writers=RECONCILE_WRITERS)
    api.fail_job_with = kube.Permanent("creating Job ml/x: the API server refused it: bad")
    outcome = sync_profile(profile(), [], [], CFG, Memory(), Around(api))
    assert isinstance(outcome.error, kube.Permanent)
    (status,) = api.patches
    assert "the API server refused it: bad" in status["conditions"][0]["message"]


def test_unadmitted_pods_are_counted_and_announced_once(monkeypatch: pytest.MonkeyPatch) -> None:
    p = profile()
    jobs = jobs_for(p, MODELS)
    api = FakeKube(writers=RECONCILE_WRITERS)
    memory = Memory()
    memory.unadmitted[("ml", "p")] = ["model-a", "model-b"]
    status = sync_profile(p, jobs, [], CFG, memory, Around(api)).status.to_status()
    assert status["unadmittedPods"] == 2
    (event,) = [m for r, m in api.events if r == "PodsNotAdmitted"]
    assert "model-a" in event and "!tunefleet.io/admission" in event
    sync_profile({**p, "status": status}, jobs, [], CFG, memory, Around(api))
    assert len([r for r, _ in api.events if r == "PodsNotAdmitted"]) == 1


def api_exception(status: int, message: str = "") -> ApiException:
    e = ApiException(status=status, reason="x")
    e.body = json.dumps({"message": message})
    return e


def test_create_owned_reads_already_exists_before_translating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    there: dict[str, Any] = {"metadata": {"ownerReferences": [{"controller": True, "uid": "u"}]}}

    def exists(ns: str, body: Any, **_: Any) -> None:
        raise api_exception(409, "already exists")

    client = OverGenerated(
        batch=Generated(
            create_namespaced_job=exists,
            read_namespaced_job=lambda name, ns, **_: raw(there),
        )
    )
    job = {
        "kind": "Job",
        "metadata": {
            "namespace": "ml",
            "name": "j",
            "ownerReferences": [{"controller": True, "uid": "u", "name": "p"}],
        },
    }
    assert client.create_owned(job) is None  # ours, made earlier: done
    there["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    with pytest.raises(kube.NotOurs, match="not controlled by TuningProfile p"):
        client.create_owned(job)


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (500, "etcd", kube.Temporary),
        (429, "slow down", kube.Temporary),
        (403, "forbidden", kube.Temporary),
        (422, "spec.template: Invalid value", kube.Permanent),
        (
            403,
            "unable to create new content in namespace x because it is being terminated",
            kube.Gone,
        ),
    ],
)
def test_api_errors_are_sorted_for_the_reconciler(
    status: int, message: str, expected: type[Exception]
) -> None:
    assert isinstance(kube.translate("creating Job", api_exception(status, message)), expected)


def test_a_job_that_cannot_be_made_now_is_said_in_status_then_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeKube(writers=RECONCILE_WRITERS)
    api.fail_job_with = kube.Temporary(
        'creating Job ml/x: jobs "x" is forbidden: exceeded quota: no-jobs', delay=30
    )
    outcome = sync_profile(profile(), [], [], CFG, Memory(), Around(api))
    assert isinstance(outcome.error, kube.Temporary)
    (status,) = api.patches
    ready = status["conditions"][0]
    assert ready["reason"] == "JobCreateFailed" and "exceeded quota" in ready["message"]


def sharded(monkeypatch: pytest.MonkeyPatch, nodes: int) -> tuple[dict[str, Any], FakeKube]:
    p = profile(gpu={"vendor": "amd", "models": MODELS[:1], "parallelism": 2})
    api = FakeKube(writers=RECONCILE_WRITERS)
    api.nodes = nodes
    return p, api


def test_parallelism_beyond_the_nodes_of_a_model_starts_nothing_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, api = sharded(monkeypatch, nodes=1)
    status = sync_profile(p, [], [], CFG, Memory(), Around(api)).status.to_status()
    assert api.created == []
    ready = status["conditions"][0]
    assert ready["reason"] == "ParallelismTooHigh"
    assert (
        "spec.gpu.parallelism is 2 but 1 node(s) have amd.com/gpu.product-name=" in ready["message"]
    )


def test_shares_done_bring_a_merge_job_and_progress_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, api = sharded(monkeypatch, nodes=2)
    sync_profile(p, [], [], CFG, Memory(), Around(api))
    assert [k for k, _ in api.created] == ["ConfigMap", "Job"]
    (tune,) = jobs_for(p, MODELS[:1])
    tune = {
        **tune,
        "spec": {"completions": 2},
        "status": {"completedIndexes": "1", "conditions": []},
    }
    memory = Memory()
    status = sync_profile(p, [tune], [], CFG, memory, Around(api)).status.to_status()
    assert status["jobs"][0]["shards"] == "1/2"
    assert status["progress"] == f"{MODELS[0]}: 1/2 shards"
    done = {
        **tune,
        "status": {
            "completedIndexes": "0-1",
            "conditions": [{"type": "Complete", "status": "True"}],
        },
    }
    status = sync_profile(
        {**p, "status": status}, [done], [], CFG, memory, Around(api)
    ).status.to_status()
    merges = [n for k, n in api.created if k == "Job" and n.startswith("merge-")]
    assert len(merges) == 1 and status["progress"] == f"{MODELS[0]}: merging"
    assert status["phase"] != "Failed"  # no artifact record from shares is expected


def test_the_finalizer_of_versions_before_0_2_is_taken_off_even_while_deleting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeKube(writers=RECONCILE_WRITERS)
    removed = api.finalizers_removed
    p = profile()
    raw = {
        "apiVersion": "tunefleet.io/v1alpha1",
        "kind": "TuningProfile",
        "metadata": {
            **p["metadata"],
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "finalizers": ["example.com/keep", "tunefleet.io/finalizer"],
        },
        "spec": p["spec"],
    }
    sync_profile(profile_view(raw), [], [], CFG, Memory(), Around(api))
    assert removed == [
        (
            "ml",
            "p",
            "uid-1",
            ["example.com/keep", "tunefleet.io/finalizer"],
            "tunefleet.io/finalizer",
        )
    ]
    removed.clear()
    sync_profile(profile(), [], [], CFG, Memory(), Around(api))  # none of ours: nothing to take off
    assert removed == []
    assert (
        "finalizers"
        not in profile_view({**raw, "metadata": {**raw["metadata"], "finalizers": ["x"]}})[
            "metadata"
        ]
    )


def test_writes_go_children_then_status_then_events(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeKube(writers=RECONCILE_WRITERS)
    sync_profile(profile(), [], [], CFG, Memory(), Around(api))
    order = [verb for kind, verb, _ in api.calls if verb in ("create", "update_status")]
    kinds = [kind for kind, verb, _ in api.calls if verb in ("create", "update_status")]
    first_event, status_at = kinds.index("events"), kinds.index("TuningProfile")
    assert {"ConfigMap", "Job"} <= set(kinds[:status_at]) and status_at < first_event
    assert set(kinds[first_event:]) == {"events"}, order
    assert [r for r, _ in api.events].count("TuningJobCreated") == len(MODELS)


def test_a_reconcile_never_raises_after_a_write_and_what_it_made_stays_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeKube(writers=RECONCILE_WRITERS)
    api.conflict = True  # the profile changed since it was read: the status write fails
    outcome = sync_profile(profile(), [], [], CFG, Memory(), Around(api))
    assert isinstance(outcome.error, kube.Conflict) and not outcome.terminal
    assert [k for k, _ in api.created].count("Job") == len(MODELS)
    # The Jobs were made: their Events are posted though the status did not land.
    assert [r for r, _ in api.events].count("TuningJobCreated") == len(MODELS)


@pytest.mark.parametrize(
    "case",
    ["new", "settled", "superseded", "sharded", "invalid", "conflict", "finalizer"],
)
def test_every_write_of_a_reconcile_goes_through_its_apply_step(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gather or decide step that wrote would fail here: the fake refuses any write that
    does not come from reconciler/apply.py (the delivery, capture and queue cases are run the
    same way in their own files' tests through `writers`)."""
    api = FakeKube(writers=RECONCILE_WRITERS)
    p, jobs = profile(), []
    if case == "settled":
        jobs = jobs_for(p, MODELS)
    elif case == "superseded":
        jobs = jobs_for(profile(image="registry.example.com/serve:0"), MODELS)
        cm = {"metadata": {"uid": "cm", "ownerReferences": [{"controller": True, "uid": "uid-1"}]}}
        api.intercept["read"] = lambda kind, ns, name: cm if kind == "ConfigMap" else None
    elif case == "sharded":
        p = profile(gpu={"vendor": "amd", "models": MODELS[:1], "parallelism": 2})
        api.nodes = 2
    elif case == "invalid":
        p = profile(gpu={"vendor": "amd", "models": ["MI300X OAM"]})
    elif case == "conflict":
        api.conflict = True
    elif case == "finalizer":
        p["metadata"]["finalizers"] = ["tunefleet.io/finalizer"]
    sync_profile(p, jobs, [], CFG, Memory(), Around(api))
    writes = [c for c in api.calls if c[1] in ("create", "patch", "delete", "update_status")]
    assert writes or case == "settled"


def test_a_reconcile_decides_once_and_carries_out_at_most_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # gather -> plan -> apply: one decision, its two rounds (the second decided from what the
    # first answered), never an interleaving of reads and writes.
    from tunefleet.reconciler import apply, decide

    calls: list[str] = []
    plan, carry_out = decide.plan, apply.carry_out
    monkeypatch.setattr(decide, "plan", lambda i: calls.append("plan") or plan(i))
    monkeypatch.setattr(
        apply, "carry_out", lambda i, a, s: calls.append("carry_out") or carry_out(i, a, s)
    )
    p = profile()
    api = FakeKube(writers=RECONCILE_WRITERS)
    memory = Memory()
    sync_profile(p, [], [], CFG, memory, Around(api))
    assert calls == ["plan", "carry_out", "carry_out"]
    assert [k for k, _ in api.created].count("Job") == len(MODELS)  # the plan was carried out
    calls.clear()
    bad = {**p, "spec": {**p["spec"], "gpu": {"models": []}}}
    sync_profile(bad, [], [], CFG, memory, Around(api))
    assert calls.count("plan") == 1 and calls.count("carry_out") <= 2
