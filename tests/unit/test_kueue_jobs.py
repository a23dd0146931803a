"""Tuning Jobs under Kueue: spec.tuning.queueName makes them suspended in a LocalQueue (the
label, the same name, the same revision); a suspended Job is Queued with Kueue's reason, never
failed and never resumed by tunefleet; a Job that has not started follows the queue name."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.builders.profiles import CFG, MODELS, jobs_for, profile
from testbed.builders.wrappers import make_profile, make_workload
from tests.support.fake_kube import RECONCILE_WRITERS, FakeKube, Generated, OverGenerated, raw
from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.api.conditions import Reason, Type, find
from tunefleet.builders.job import Child, build_merge_job, build_tuning_job, tuning_config
from tunefleet.builders.kueue import QUEUE_LABEL
from tunefleet.reconciler import workloads
from tunefleet.reconciler.diagnose import Hints
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.observe import Gathered, observe, observe_job, observe_wanting
from tunefleet.reconciler.reconcile import Around, sync_profile
from tunefleet.reconciler.status import Observed, compute_status

QUEUED = {"backoffLimit": 0, "queueName": "gpu-team"}


# testbed.builders.profiles.profile()'s spec, as a wrapper
BASE = make_profile().image("registry.example.com/serve:1").gpu("amd", *MODELS)
# A Workload, as Kueue makes one for a Job; `.owner(job uid, name, "Job", "batch/v1")` names
# the Job its controller.
WORKLOAD = make_workload("job-x-1")


def test_a_queue_name_makes_suspended_jobs_in_it_under_the_same_name_and_revision() -> None:
    plain, queued = BASE.tuning(backoffLimit=0).spec_model(), BASE.tuning(**QUEUED).spec_model()
    assert naming.revision(plain) == naming.revision(queued)
    for build in (build_tuning_job, build_merge_job):
        a = build(Child(plain, "ml", "p", "uid-1", MODELS[0], CFG))
        b = build(Child(queued, "ml", "p", "uid-1", MODELS[0], CFG))
        assert a["metadata"]["name"] == b["metadata"]["name"]
        assert b["metadata"]["labels"][QUEUE_LABEL] == "gpu-team"
        assert b["spec"]["suspend"] is True
        # Not on the pods: their labels select them, and Kueue reads the Job's.
        assert QUEUE_LABEL not in b["spec"]["template"]["metadata"]["labels"]
        assert "suspend" not in a["spec"] and QUEUE_LABEL not in a["metadata"]["labels"]
    config = tuning_config(queued, "ml", "p", MODELS[0], naming.revision(queued))
    assert "queueName" not in config["tuning"]


def test_the_queue_name_is_a_local_queue_name() -> None:
    with pytest.raises(ValueError):
        BASE.tuning(queueName="Not_A_Queue").spec_model()
    with pytest.raises(ValueError):
        BASE.tuning(queueName="q" * 64).spec_model()


def suspended_job(queue: str | None = "gpu-team") -> dict[str, Any]:
    p = profile(tuning={"queueName": queue} if queue else {})
    (job,) = jobs_for(p, MODELS[:1])
    job["spec"]["suspend"] = True
    return job


def test_a_suspended_job_is_queued_with_kueues_reason_never_failed() -> None:
    job = suspended_job()
    short = "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu"
    owned = WORKLOAD.owner(job["metadata"]["uid"], job["metadata"]["name"], "Job", "batch/v1")
    wl = owned.condition("QuotaReserved", "False", short).obj()
    obs = observe_job(job, [], queued=workloads.why_queued(job, [wl]))
    assert (obs.state, obs.reason) == ("Pending", Reason.QUEUED)
    assert obs.message == f"queued in Kueue LocalQueue gpu-team: {short}"
    # Suspended again after a pod failed (Kueue evicted it): still queued, not failed.
    job["status"]["failed"] = 1
    evicted = owned.condition("Evicted", "True", "Preempted to accommodate a workload").obj()
    obs = observe_job(job, [], queued=workloads.why_queued(job, [evicted]))
    assert obs.state == "Pending" and "evicted by Kueue" in obs.message


def test_observing_a_queued_job_wants_kueues_word_and_reads_nothing_itself() -> None:
    """observe is pure: Kueue's word is read by the reconcile's gather step, which asks
    observe_wanting what to read; with it gathered, the message is Kueue's."""
    job = suspended_job()
    (obs,), wants = observe_wanting([job], [], Hints())
    assert wants == [("workload", job)]
    assert (obs.reason, obs.message) == (Reason.QUEUED, "the Job is suspended")
    said = "queued in Kueue LocalQueue gpu-team: waiting for quota"
    gathered = Gathered(queued={job["metadata"]["uid"]: said})
    (obs,), wants = observe_wanting([job], [], Hints(), None, gathered)
    assert wants == [] and obs.message == said
    assert observe([job], [], Hints(), None, gathered) == [obs]
    running = {**job, "spec": {**job.get("spec", {}), "suspend": False}}
    assert observe_wanting([running], [], Hints())[1] == []  # not queued: nothing to read


def test_why_a_job_waits_when_kueue_cannot_say() -> None:
    job = suspended_job()
    assert "no Kueue" in workloads.why_queued(job, workloads.NOT_INSTALLED)
    assert "no Workload" in workloads.why_queued(job, [])
    # A Workload that names the Job by label but is not controlled by it does not speak for it.
    other = (
        WORKLOAD.owner("someone-else", job["metadata"]["name"], "Job", "batch/v1")
        .condition("QuotaReserved", "False", "forged")
        .obj()
    )
    assert "forged" not in workloads.why_queued(job, [other])
    assert "not in a Kueue queue" in workloads.why_queued(suspended_job(None), [])


def test_status_says_queued_and_the_phase_follows() -> None:
    p = profile(tuning=QUEUED)
    parsed = TuningProfileSpec.model_validate(p["spec"])
    job = suspended_job()
    queued = observe_job(job, [], queued="queued in Kueue LocalQueue gpu-team: x")
    st = compute_status(Observed(generation=1, spec=parsed, jobs=[queued]), "now").to_status()
    assert st["phase"] == "Queued"
    prog, ready = find(st, Type.PROGRESSING), find(st, Type.READY)
    assert (prog["status"], prog["reason"]) == ("True", Reason.QUEUED)
    assert "are queued in Kueue" in prog["message"] and "LocalQueue gpu-team" in prog["message"]
    assert ready["reason"] == Reason.QUEUED
    assert find(st, Type.FAILED)["status"] == "False"
    assert st["jobs"][0]["reason"] == Reason.QUEUED


def test_a_queued_job_reads_its_workload_now_and_then(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    found: list[dict[str, Any]] = []

    def kueue_workloads(*args: Any) -> list[dict[str, Any]]:  # Kueue's Workloads of the Job
        calls.append(args[-1])
        return found

    api = FakeKube(writers=RECONCILE_WRITERS, intercept={"list_custom": kueue_workloads})
    p = profile(tuning=QUEUED, gpu={"vendor": "amd", "models": MODELS[:1]})
    job = suspended_job()
    memory = Memory()
    for _ in range(2):  # no Workload yet (Kueue makes it moments after the Job): asked again
        status = sync_profile(p, [job], [], CFG, memory, Around(api)).status.to_status()
    assert len(calls) == 2 and "no Workload" in status["jobs"][0]["message"]
    owned = WORKLOAD.owner(job["metadata"]["uid"], job["metadata"]["name"], "Job", "batch/v1")
    found.append(owned.condition("QuotaReserved", "False", "insufficient unused quota").obj())
    for _ in range(3):
        status = sync_profile(p, [job], [], CFG, memory, Around(api)).status.to_status()
    assert len(calls) == 3  # Kueue's answer: cached for QUEUED_TTL
    assert status["jobs"][0]["reason"] == Reason.QUEUED
    assert "insufficient unused quota" in status["jobs"][0]["message"]


def test_a_job_that_has_not_started_follows_the_queue_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one = {"vendor": "amd", "models": MODELS[:1]}
    job = suspended_job("old-queue")
    api = FakeKube(writers=RECONCILE_WRITERS)
    sync_profile(profile(tuning=QUEUED, gpu=one), [job], [], CFG, Memory(), Around(api))
    assert api.owned_patches == [
        ("Job", job["metadata"]["name"], {"metadata": {"labels": {QUEUE_LABEL: "gpu-team"}}})
    ]
    # No queue any more: a suspended Job nobody would admit is made again outside Kueue.
    api = FakeKube(writers=RECONCILE_WRITERS)
    sync_profile(
        profile(tuning={"backoffLimit": 0}, gpu=one), [job], [], CFG, Memory(), Around(api)
    )
    assert api.deleted == [("Job", job["metadata"]["name"])]
    # A Job that runs keeps its queue; tunefleet never resumes or moves it.
    running = suspended_job("old-queue")
    running["spec"]["suspend"] = False
    api = FakeKube(writers=RECONCILE_WRITERS)
    sync_profile(profile(tuning=QUEUED, gpu=one), [running], [], CFG, Memory(), Around(api))
    assert not api.owned_patches and not api.deleted


def test_workloads_are_read_in_the_newest_version_served_or_kueue_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    from kubernetes.client.exceptions import ApiException

    served: set[str] = {"v1beta1"}
    asked: list[tuple[str, str]] = []

    def list_workloads(group: str, version: str, *a: Any, **kw: Any) -> Any:
        asked.append((version, kw["label_selector"]))
        if version not in served:
            raise ApiException(status=404, reason="Not Found")
        return raw({"items": [{"v": version}]})

    client = OverGenerated(custom=Generated(list_namespaced_custom_object=list_workloads))
    assert workloads.workloads_of(client, "ml", "u-1") == [{"v": "v1beta1"}]
    assert asked == [
        ("v1beta2", "kueue.x-k8s.io/job-uid=u-1"),
        ("v1beta1", "kueue.x-k8s.io/job-uid=u-1"),
    ]
    served.clear()
    assert workloads.workloads_of(client, "ml", "u-1") == workloads.NOT_INSTALLED
