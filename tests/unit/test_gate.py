"""The GPU gate (placement/gate.py): tuning Jobs wait suspended while our own Jobs hold every
GPU of their model, start oldest first as they free, and are never held where the scheduler
would have a word to say (no GPUs advertised, never enough); and the reconcile that makes and
starts them (unit tier: the API is the recording stand-in)."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.builders.profiles import CFG, MODELS, bound_pod_of, profile, watched_job
from tests.support.fake_kube import RECONCILE_WRITERS, FakeKube
from tunefleet import kube, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.builders.job import Child, build_tuning_job, held_for_gpu
from tunefleet.builders.kueue import QUEUE_LABEL
from tunefleet.placement import gate as g
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.observe import observe_job
from tunefleet.reconciler.reconcile import Around, sync_profile
from tunefleet.watched.views import job_view

SPEC = TuningProfileSpec.model_validate(profile()["spec"])
MODEL = MODELS[0]


def job(n: int, *, held: bool = False, done: bool = False) -> dict[str, Any]:
    """Profile p<n>'s tuning Job of MODEL as the watch brings it (made n seconds in)."""
    return watched_job(
        SPEC, f"p{n}", MODEL, uid=f"job-{n}", created=f"2026-12-05T00:00:{n:02d}Z", held=held,
        done=done,
    )  # fmt: skip


def gate_of(capacity: int) -> tuple[g.Gate, list[g.Pool]]:
    asked: list[g.Pool] = []

    def nodes(pool: g.Pool) -> int:
        asked.append(pool)
        return capacity

    return g.Gate(nodes), asked


def test_a_jobs_demand_is_its_pods_gpus_on_its_models_nodes() -> None:
    d = g.demand(job(1))
    assert d is not None
    assert d.pool == g.Pool(naming.label_key(SPEC), MODEL, naming.resource_name(SPEC))
    assert d.gpus == SPEC.gpu.count
    wide = TuningProfileSpec.model_validate(
        {**profile()["spec"], "gpu": {**profile()["spec"]["gpu"], "count": 2, "parallelism": 3}}
    )
    sharded = g.demand(build_tuning_job(Child(wide, "ml", "p", "u", MODEL, CFG)))
    assert sharded is not None and sharded.gpus == 6
    assert g.demand({"metadata": {}, "spec": {}}) is None  # no model, no GPU: not gated


def test_jobs_start_up_to_the_models_gpus_and_the_rest_wait() -> None:
    gate, _ = gate_of(capacity=2)
    d = g.demand(job(1))
    assert d is not None
    assert [gate.may_start(d) for _ in range(3)] == [True, True, False]


def test_a_model_with_no_gpus_advertised_or_too_few_is_never_held() -> None:
    # The scheduler's word then says in status why the pod does not start.
    d = g.demand(job(1))
    assert d is not None
    for capacity in (0, d.gpus - 1):
        gate, _ = gate_of(capacity)
        assert all(gate.may_start(d) for _ in range(5))


def test_node_gpus_leave_out_cordoned_and_unready_nodes() -> None:
    def node(gpus: str, ready: str = "True", cordoned: bool = False) -> dict[str, Any]:
        return {
            "spec": {"unschedulable": cordoned},
            "status": {
                "allocatable": {"amd.com/gpu": gpus},
                "conditions": [{"type": "Ready", "status": ready}],
            },
        }

    nodes = [node("8"), node("8", ready="False"), node("8", cordoned=True), node("x"), node("4")]
    assert g.node_gpus(nodes, "amd.com/gpu") == 12


def test_waiting_jobs_start_oldest_first_as_running_ones_end() -> None:
    gate, _ = gate_of(capacity=1)
    running = job(1)
    gate.follow_job("ADDED", running)
    gate.follow_pod("ADDED", bound_pod_of(running))
    for n in (4, 2, 3):  # made in that order, but p2 is the oldest
        gate.follow_job("ADDED", job(n, held=True))
    assert gate.tick() == []  # the one GPU is held
    gate.follow_job("MODIFIED", job(1, done=True))
    assert gate.tick() == [("ml", "p2")]
    assert gate.admitted("job-2") and not gate.admitted("job-3")
    assert gate.tick() == []  # p2 counts as holding the GPU until its Job says it runs
    started = job(2)
    gate.follow_job("MODIFIED", started)
    assert not gate.admitted("job-2")
    assert gate.tick() == []
    gate.follow_job("DELETED", started)
    assert gate.tick() == [("ml", "p3")]


def test_a_job_whose_pod_no_node_took_stops_holding_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A pod stuck on a taint must not keep the model's queue shut.
    gate, _ = gate_of(capacity=1)
    gate.follow_job("ADDED", job(1))
    gate.follow_job("ADDED", job(2, held=True))
    assert gate.tick() == []
    monkeypatch.setattr(g, "GRACE_S", 0.0)
    assert gate.tick() == [("ml", "p2")]


def test_a_job_on_a_node_holds_past_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    gate, _ = gate_of(capacity=1)
    gate.follow_job("ADDED", job(1))
    gate.follow_pod("ADDED", bound_pod_of(job(1)))
    gate.follow_job("ADDED", job(2, held=True))
    monkeypatch.setattr(g, "GRACE_S", 0.0)
    assert gate.tick() == []


def test_a_forged_job_with_our_labels_neither_holds_nor_waits() -> None:
    gate, _ = gate_of(capacity=1)
    forged = job(1)
    forged["metadata"]["ownerReferences"] = []  # labels say p1's, no profile controls it
    gate.follow_job("ADDED", forged)
    d = g.demand(job(9))
    assert d is not None and gate.may_start(d)
    waiting = job(2, held=True)
    waiting["metadata"]["labels"][naming.PROFILE_UID_LABEL] = "someone-else"
    gate.follow_job("ADDED", waiting)
    assert gate.waiting() == 0


def test_the_node_list_is_read_once_a_ttl() -> None:
    gate, asked = gate_of(capacity=8)
    d = g.demand(job(1))
    assert d is not None
    for _ in range(5):
        gate.may_start(d)
    assert len(asked) == 1


# --- the reconcile ------------------------------------------------------------------------


def test_a_job_made_while_our_jobs_hold_every_gpu_waits_suspended_and_says_why() -> None:
    p = profile(gpu={"vendor": "amd", "models": [MODEL]})
    full, _ = gate_of(capacity=1)
    full.follow_job("ADDED", job(1))  # another profile's Job holds the one GPU
    api = FakeKube(writers=RECONCILE_WRITERS)
    status = sync_profile(p, [], [], CFG, Memory(), Around(api, gate=full)).status.to_status()
    made = [c[2] for c in api.calls if c[0] == "Job" and c[1] == "create"]
    assert len(made) == 1 and made[0]["spec"]["suspend"] is True
    assert made[0]["metadata"]["annotations"][naming.GPU_GATE_ANNOTATION] == "true"
    # No pod mounts its ConfigMap yet: made when it starts (one API write fewer a profile).
    assert not [c for c in api.calls if c[0] == "ConfigMap" and c[1] == "create"]
    # Said in the very status that lists it: one write, no Warning.
    assert len(api.patches) == 1 and status["phase"] == "Queued"
    assert status["jobs"][0]["reason"] == "WaitingForGPU"
    assert "held by tunefleet's tuning Jobs" in status["jobs"][0]["message"]
    assert api.events == []  # its Event is its start (TuningJobStarted)


def test_a_job_the_gate_let_go_is_started_by_its_profiles_reconcile() -> None:
    p = profile(gpu={"vendor": "amd", "models": [MODEL]})
    gate, _ = gate_of(capacity=1)
    api = FakeKube(writers=RECONCILE_WRITERS)
    waiting = build_tuning_job(Child(SPEC, "ml", "p", "uid-1", MODEL, CFG))
    waiting = held_for_gpu(waiting)
    waiting["metadata"]["uid"] = "juid-w"
    view = job_view(waiting)
    sync_profile(p, [view], [], CFG, Memory(), Around(api, gate=gate))
    assert not [c for c in api.calls if c[1] == "patch"]  # not let go: it waits
    gate.follow_job("ADDED", waiting)
    assert gate.tick() == [("ml", "p")]  # the one GPU is free: let go
    status = sync_profile(p, [view], [], CFG, Memory(), Around(api, gate=gate)).status.to_status()
    writes = [(c[0], c[1]) for c in api.calls if c[1] in ("create", "patch") and c[0] != "events"]
    # Its ConfigMap first (the gate made it without one), then the start.
    assert writes == [("ConfigMap", "create"), ("Job", "patch")]
    assert ("Job", "patch", {"spec": {"suspend": False}}) in api.calls
    cm = next(c[2] for c in api.calls if c[0] == "ConfigMap")
    assert cm["metadata"]["name"] == waiting["metadata"]["name"]
    assert status["phase"] == "Pending"
    assert [r for r, _ in api.events] == ["TuningJobStarted"]


def test_a_let_go_job_whose_configmap_name_is_taken_by_a_forged_one_stays_held() -> None:
    # Started, its pod would mount someone else's configuration: it waits until the forged
    # ConfigMap is gone (the next pass tries again).
    p = profile(gpu={"vendor": "amd", "models": [MODEL]})
    gate, _ = gate_of(capacity=1)
    waiting = held_for_gpu(build_tuning_job(Child(SPEC, "ml", "p", "uid-1", MODEL, CFG)))
    waiting["metadata"]["uid"] = "juid-w"
    gate.follow_job("ADDED", waiting)
    assert gate.tick() == [("ml", "p")]

    def forged(obj: dict[str, Any]) -> Any:
        if obj["kind"] == "ConfigMap":
            raise kube.NotOurs(f"ConfigMap ml/{obj['metadata']['name']} is not ours")
        return FakeKube.DEFAULT

    api = FakeKube(writers=RECONCILE_WRITERS, intercept={"create_owned": forged})
    sync_profile(p, [job_view(waiting)], [], CFG, Memory(), Around(api, gate=gate))
    assert not [c for c in api.calls if c[1] == "patch"]
    assert api.events == []


def test_a_kueue_job_is_never_gated() -> None:
    p = profile(gpu={"vendor": "amd", "models": [MODEL]}, tuning={"queueName": "gpus"})
    full, _ = gate_of(capacity=1)
    full.follow_job("ADDED", job(1))
    api = FakeKube(writers=RECONCILE_WRITERS)
    sync_profile(p, [], [], CFG, Memory(), Around(api, gate=full))
    made = [c[2] for c in api.calls if c[0] == "Job" and c[1] == "create"]
    assert naming.GPU_GATE_ANNOTATION not in (made[0]["metadata"].get("annotations") or {})


def test_a_held_job_moved_to_a_kueue_queue_says_kueues_word_not_the_gates() -> None:
    view = job_view(held_for_gpu(build_tuning_job(Child(SPEC, "ml", "p", "u", MODEL, CFG))))
    assert observe_job(view, []).reason == "WaitingForGPU"
    view["metadata"]["labels"][QUEUE_LABEL] = "team-a"
    assert observe_job(view, []).reason == "Queued"


def test_jobs_the_gate_held_start_once_the_gate_is_turned_off() -> None:
    # operator.gpuGate: false (a helm upgrade) leaves no gate to let them go: they must not
    # wait for nobody.
    p = profile(gpu={"vendor": "amd", "models": [MODEL]})
    waiting = held_for_gpu(build_tuning_job(Child(SPEC, "ml", "p", "uid-1", MODEL, CFG)))
    waiting["metadata"]["uid"] = "juid-w"
    api = FakeKube(writers=RECONCILE_WRITERS)
    status = sync_profile(p, [job_view(waiting)], [], CFG, Memory(), Around(api)).status.to_status()
    assert ("Job", "patch", {"spec": {"suspend": False}}) in api.calls
    assert ("ConfigMap", waiting["metadata"]["name"]) in api.created
    assert status["jobs"][0].get("reason") != "WaitingForGPU"


def test_a_held_job_moved_to_a_kueue_queue_gets_its_configmap_before_kueue_may_start_it() -> None:
    p = profile(gpu={"vendor": "amd", "models": [MODEL]}, tuning={"queueName": "team-a"})
    waiting = held_for_gpu(build_tuning_job(Child(SPEC, "ml", "p", "uid-1", MODEL, CFG)))
    waiting["metadata"]["uid"] = "juid-w"
    api = FakeKube(writers=RECONCILE_WRITERS)
    sync_profile(p, [job_view(waiting)], [], CFG, Memory(), Around(api, gate=gate_of(8)[0]))
    writes = [(c[0], c[1]) for c in api.calls if c[1] in ("create", "patch")]
    assert writes[:2] == [("ConfigMap", "create"), ("Job", "patch")]
    assert ("Job", "patch", {"metadata": {"labels": {QUEUE_LABEL: "team-a"}}}) in api.calls


def test_the_echo_of_a_job_its_reconcile_made_and_observed_needs_no_reconcile() -> None:
    # In a burst every held Job's ADDED echo queued a reconcile that found nothing new.
    from tunefleet.reconciler.controller import Controller, Indexes

    p = profile(gpu={"vendor": "amd", "models": [MODEL]})
    full, _ = gate_of(capacity=1)
    full.follow_job("ADDED", job(1))
    api = FakeKube(writers=RECONCILE_WRITERS)
    nothing = Indexes(lambda k: None, list, lambda ns, u: [], lambda ns, u: [])
    c = Controller(api, CFG, nothing, sync_profile)
    memory = c.memory
    sync_profile(p, [], [], CFG, memory, Around(api, gate=full))
    made = next(c[2] for c in api.calls if c[0] == "Job" and c[1] == "create")
    echo = {**made, "metadata": {**made["metadata"], "uid": f"juid-{made['metadata']['name']}"}}
    assert c.echoes_made("ADDED", echo) is True
    assert c.echoes_made("ADDED", echo) is False  # only its first event
    # A Kueue Job is not observed by the pass that makes it (Kueue has not spoken yet).
    q = profile(gpu={"vendor": "amd", "models": [MODEL]}, tuning={"queueName": "a"})
    api = FakeKube(writers=RECONCILE_WRITERS)
    nothing = Indexes(lambda k: None, list, lambda ns, u: [], lambda ns, u: [])
    c = Controller(api, CFG, nothing, sync_profile)
    sync_profile(q, [], [], CFG, c.memory, Around(api, gate=full))
    (queued,) = [c[2] for c in api.calls if c[0] == "Job" and c[1] == "create"]
    assert queued["spec"]["suspend"] is True
    queued = {**queued, "metadata": {**queued["metadata"], "uid": "juid-q"}}
    assert c.echoes_made("ADDED", queued) is False
