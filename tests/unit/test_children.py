"""children.py: the reconcile's decisions about a profile's children, from plain views, with no
API at all (no FakeKube, no monkeypatch): what is missing, superseded, re-queued, due to merge."""

from __future__ import annotations

from testbed.builders.wrappers import make_job, make_observation
from tunefleet import naming
from tunefleet.builders.kueue import QUEUE_LABEL
from tunefleet.reconciler import children

H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"


# A tuning Job of each model, as decide reads it (labels, model annotation, spec.suspend,
# status): tests set its revision and whatever else they depend on.
H100_JOB = make_job("tune-hbm3").uid("uid-h100").role("tune").gpu_model(H100).suspend(False)
H200_JOB = make_job("tune-h200").uid("uid-h200").role("tune").gpu_model(H200).suspend(False)


def same(rev: str) -> children.Revision:
    return lambda model: rev


def test_models_to_tune_are_those_without_a_job_or_artifact_of_their_revision() -> None:
    # H200's Job is of an earlier revision
    jobs = [H100_JOB.revision("r2").obj(), H200_JOB.revision("r1").obj()]
    assert children.models_to_tune([H100, H200], same("r2"), jobs, [], []) == [H200]
    # Served already (its Job was removed after its record was read): not made again.
    assert children.models_to_tune([H100, H200], same("r2"), jobs, [H200], []) == []
    # Too few nodes for its parallelism: nothing is made, status says why.
    assert children.models_to_tune([H100, H200], same("r2"), [], [], [H100]) == [H200]
    # A model retuned under its own revision (capture) needs a Job of that revision.
    per_model = {H100: "r2-retune", H200: "r2"}.__getitem__
    assert children.models_to_tune([H100, H200], per_model, jobs, [], []) == [H100, H200]
    # A merge Job does not stand for the tuning Job; the old model label still counts.
    merges = [
        H100_JOB.revision("r2").role("merge").obj(),
        # versions before the annotation: the model label
        H200_JOB.revision("r2").annotations({}).label(naming.MODEL_LABEL, H200).obj(),
    ]
    assert children.models_to_tune([H100, H200], same("r2"), merges, [], []) == [H100]


def test_superseded_jobs_are_those_of_an_earlier_revision_not_already_going() -> None:
    old, current = H100_JOB.revision("r1").obj(), H200_JOB.revision("r2").obj()
    going = H200_JOB.uid("uid-h200-r1").revision("r1").deleting("2026-12-03T00:00:00Z").obj()
    assert children.superseded([old, current, going], same("r2")) == [old]
    assert children.superseded([old, current], same("r1")) == [current]


def test_queue_moves_touch_only_suspended_jobs_that_never_started() -> None:
    waiting = H100_JOB.revision("r2").label(QUEUE_LABEL, "team-a").suspend().obj()
    running = H200_JOB.revision("r2").label(QUEUE_LABEL, "team-a").suspend().started().obj()
    unqueued = H200_JOB.name("tune-h200-2").uid("uid-h200-2").revision("r2").suspend().obj()
    old = H100_JOB.uid("uid-h100-r1").revision("r1").label(QUEUE_LABEL, "team-a")
    old = old.suspend().obj()
    jobs = [waiting, running, unqueued, old]
    assert children.queue_moves(jobs, "team-b", "r2") == [
        children.QueueMove("relabel", waiting, "team-b")
    ]
    assert children.queue_moves(jobs, None, "r2") == [children.QueueMove("remake", waiting)]
    assert children.queue_moves(jobs, "", "r2") == [children.QueueMove("remake", waiting)]
    assert children.queue_moves(jobs, "team-a", "r2") == []  # where it is already


def test_merges_are_due_once_every_share_is_in_and_none_exists() -> None:
    done = make_observation(f"j-{H100}", H100, "r2", "Succeeded").fields(shards=2).obj()
    unsharded = make_observation(f"j-{H200}", H200, "r2", "Succeeded").fields(shards=1).obj()
    running = make_observation(f"j-{H200}", H200, "r2", "Running").fields(shards=2).obj()
    old = make_observation(f"j-{H200}", H200, "r1", "Succeeded").fields(shards=2).obj()
    assert children.merges_due([done, unsharded, running, old], same("r2"), []) == [H100]
    merge = H100_JOB.revision("r2").role("merge").obj()
    assert children.merges_due([done], same("r2"), [merge]) == []


def test_a_job_the_gpu_gate_holds_is_started_once_let_go_and_moves_to_a_queue_named_later() -> None:
    held = H100_JOB.revision("r2").annotation(naming.GPU_GATE_ANNOTATION, "true").suspend()
    let_go = {"uid-h100"}.__contains__
    assert children.admitted([held.obj()], let_go, same("r2")) == [held.obj()]
    assert children.admitted([held.obj()], lambda uid: False, same("r2")) == []
    assert children.admitted([held.obj()], let_go, same("r3")) == []  # an earlier revision's
    started = H100_JOB.revision("r2").annotation(naming.GPU_GATE_ANNOTATION, "true")
    assert children.admitted([started.obj()], let_go, same("r2")) == []
    kueues = held.label(QUEUE_LABEL, "team-a").obj()
    assert children.admitted([kueues], let_go, same("r2")) == []  # Kueue's now
    # A queue named while it waits: Kueue takes it; no queue: it stays the gate's.
    assert children.queue_moves([held.obj()], "team-a", "r2") == [
        children.QueueMove("relabel", held.obj(), "team-a")
    ]
    assert children.queue_moves([held.obj()], None, "r2") == []
