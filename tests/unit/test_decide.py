"""decide.py: the reconcile's decisions about a profile's children, from plain views, with no
API at all (no FakeKube, no monkeypatch): what is missing, superseded, re-queued, due to merge."""

from __future__ import annotations

from typing import Any

from tunefleet import naming
from tunefleet.builders.kueue import QUEUE_LABEL
from tunefleet.reconciler import decide
from tunefleet.reconciler.observe import JobObservation

H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"


def job(
    model: str,
    revision: str,
    *,
    role: str = "tune",
    queue: str | None = None,
    suspend: bool = False,
    started: bool = False,
    going: bool = False,
    legacy_label: bool = False,
) -> dict[str, Any]:
    labels = {naming.REVISION_LABEL: revision, naming.ROLE_LABEL: role}
    annotations = {}
    if legacy_label:
        labels[naming.MODEL_LABEL] = model  # versions before the annotation
    else:
        annotations[naming.MODEL_ANNOTATION] = model
    if queue:
        labels[QUEUE_LABEL] = queue
    meta: dict[str, Any] = {
        "name": f"tune-{model[-4:].lower()}-{revision}",
        "uid": f"uid-{model}-{revision}-{role}",
        "labels": labels,
        "annotations": annotations,
    }
    if going:
        meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"suspend": suspend},
        "status": {"startTime": "2026-12-03T00:00:00Z"} if started else {},
    }


def same(rev: str) -> decide.Revision:
    return lambda model: rev


def test_models_to_tune_are_those_without_a_job_or_artifact_of_their_revision() -> None:
    jobs = [job(H100, "r2"), job(H200, "r1")]  # H200's Job is of an earlier revision
    assert decide.models_to_tune([H100, H200], same("r2"), jobs, [], []) == [H200]
    # Served already (its Job was removed after its record was read): not made again.
    assert decide.models_to_tune([H100, H200], same("r2"), jobs, [H200], []) == []
    # Too few nodes for its parallelism: nothing is made, status says why.
    assert decide.models_to_tune([H100, H200], same("r2"), [], [], [H100]) == [H200]
    # A model retuned under its own revision (capture) needs a Job of that revision.
    per_model = {H100: "r2-retune", H200: "r2"}.__getitem__
    assert decide.models_to_tune([H100, H200], per_model, jobs, [], []) == [H100, H200]
    # A merge Job does not stand for the tuning Job; the old model label still counts.
    merges = [job(H100, "r2", role="merge"), job(H200, "r2", legacy_label=True)]
    assert decide.models_to_tune([H100, H200], same("r2"), merges, [], []) == [H100]


def test_superseded_jobs_are_those_of_an_earlier_revision_not_already_going() -> None:
    old, current, going = job(H100, "r1"), job(H200, "r2"), job(H200, "r1", going=True)
    assert decide.superseded([old, current, going], same("r2")) == [old]
    assert decide.superseded([old, current], same("r1")) == [current]


def test_queue_moves_touch_only_suspended_jobs_that_never_started() -> None:
    waiting = job(H100, "r2", queue="team-a", suspend=True)
    running = job(H200, "r2", queue="team-a", suspend=True, started=True)
    unqueued = job(H200, "r2", suspend=True)
    old = job(H100, "r1", queue="team-a", suspend=True)
    jobs = [waiting, running, unqueued, old]
    assert decide.queue_moves(jobs, "team-b", "r2") == [
        decide.QueueMove("relabel", waiting, "team-b")
    ]
    assert decide.queue_moves(jobs, None, "r2") == [decide.QueueMove("remake", waiting)]
    assert decide.queue_moves(jobs, "", "r2") == [decide.QueueMove("remake", waiting)]
    assert decide.queue_moves(jobs, "team-a", "r2") == []  # where it is already


def obs(model: str, revision: str, state: str, shards: int, role: str = "tune") -> JobObservation:
    return JobObservation(
        name=f"j-{model}", model=model, revision=revision, state=state,  # type: ignore[arg-type]
        role=role, shards=shards,
    )  # fmt: skip


def test_merges_are_due_once_every_share_is_in_and_none_exists() -> None:
    done = obs(H100, "r2", "Succeeded", shards=2)
    unsharded = obs(H200, "r2", "Succeeded", shards=1)
    running = obs(H200, "r2", "Running", shards=2)
    old = obs(H200, "r1", "Succeeded", shards=2)
    assert decide.merges_due([done, unsharded, running, old], same("r2"), []) == [H100]
    assert decide.merges_due([done], same("r2"), [job(H100, "r2", role="merge")]) == []
