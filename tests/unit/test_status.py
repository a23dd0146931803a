"""Status from observed Jobs: conditions, phase, artifacts, history, failure messages."""

from __future__ import annotations

import json
from typing import Any

from testbed.builders.wrappers import (
    make_artifact,
    make_job,
    make_observation,
    make_pod,
    make_profile,
)
from tunefleet import naming
from tunefleet.reconciler.diagnose import Hints, pull_secrets_missing
from tunefleet.reconciler.observe import observe_job
from tunefleet.reconciler.status import Observed, compute_status, status_changed

MODELS = ["AMD_Instinct_MI300X_OAM", "AMD_Instinct_MI325X_OAM"]
SPEC = make_profile().image("img:1").gpu("amd", *MODELS).spec_model()
REV = naming.revision(SPEC)
# What a publish step writes of an artifact (its termination message names no GPU model), one
# for each digest the tests use ("a" * 64 at RESULTS["a"]).
RESULTS = {
    c: make_artifact("m", c * 64, "x", "ns")
    .without("gpuModel")
    .fields(gemms=3, tunedAt="2026-11-29T10:00:00Z")
    .identity({"gpuName": "MI300X", "torch": "2.11"})
    for c in "01abcd"
}
# The tuning Job of MODELS[0] as its informer sees it, and pods of it: one whose steps ended
# (`.terminated(...)`), and one alive: Pending, and on node n1 once SCHEDULED.
JOB = make_job().uid("u").revision(REV).gpu_model(MODELS[0]).conditions().active(0)
ENDED = make_pod("p").created("2026-11-29T10:00:00Z")
LIVE = make_pod("p").uid("pu").created("t").phase("Pending").status(conditions=[])
SCHEDULED = LIVE.spec(nodeName="n1").status(conditions=[{"type": "PodScheduled", "status": "True"}])
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}


def cond(status: dict[str, Any], t: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == t)


def test_all_models_published_is_ready() -> None:
    jobs = [
        make_observation(f"j{i}", m, REV, "Succeeded").record(RESULTS[str(i)]).obj()
        for i, m in enumerate(MODELS)
    ]
    st = compute_status(
        Observed(generation=3, spec=SPEC, jobs=jobs), "2026-11-29T11:00:00Z"
    ).to_status()
    assert st["phase"] == "Ready"
    assert cond(st, "Ready")["status"] == "True"
    assert cond(st, "Ready")["observedGeneration"] == 3
    assert [a["gpuModel"] for a in st["artifacts"]] == MODELS
    assert st["gemms"] == 6
    assert st["artifacts"][0]["identity"]["gpuName"] == "MI300X"
    assert st["shortSha256"] == "0" * 12 + "," + "1" * 12


def test_partial_progress_and_waiting_message() -> None:
    jobs = [
        make_observation("j0", MODELS[0], REV, "Succeeded").record(RESULTS["a"]).obj(),
        make_observation("j1", MODELS[1], REV, "Running").obj(),
    ]
    st = compute_status(Observed(generation=1, spec=SPEC, jobs=jobs), "t").to_status()
    assert st["phase"] == "Tuning"
    assert cond(st, "Ready")["status"] == "False"
    assert MODELS[1] in cond(st, "Ready")["message"]
    assert cond(st, "Progressing")["status"] == "True"


def test_failure_carries_the_pods_message() -> None:
    jobs = [
        make_observation("j0", MODELS[0], REV, "Failed")
        .fields(message="Job j0 failed; container tune exited 1: no GPU")
        .obj(),
        make_observation("j1", MODELS[1], REV, "Running").obj(),
    ]
    st = compute_status(Observed(generation=1, spec=SPEC, jobs=jobs), "t").to_status()
    assert st["phase"] == "Failed"
    failed = cond(st, "Failed")
    assert failed["status"] == "True" and "no GPU" in failed["message"]


def test_new_artifact_moves_old_to_history_and_transition_time_is_kept() -> None:
    old = make_artifact(MODELS[0], "f" * 64).uri("s3://b/old").revision("old").obj()
    prev = compute_status(
        Observed(generation=1, spec=SPEC, previous={"artifacts": [old]}), "t1"
    ).to_status()
    assert prev["artifacts"] == [old]
    jobs = [make_observation("j0", MODELS[0], REV, "Succeeded").record(RESULTS["a"]).obj()]
    st = compute_status(
        Observed(generation=1, spec=SPEC, jobs=jobs, previous=prev), "t2"
    ).to_status()
    assert st["history"][0]["sha256"] == "f" * 64
    assert st["artifacts"][0]["sha256"] == "a" * 64
    # Ready stayed False (MI325X has nothing): its transition time must not move.
    assert cond(st, "Ready")["lastTransitionTime"] == "t1"
    again = compute_status(
        Observed(generation=1, spec=SPEC, jobs=jobs, previous=st), "t3"
    ).to_status()
    assert not status_changed(st, again)


def test_jobs_of_another_revision_are_ignored() -> None:
    jobs = [
        make_observation("old", MODELS[0], "0000000000", "Failed")
        .fields(message="old failure")
        .obj()
    ]
    st = compute_status(Observed(generation=2, spec=SPEC, jobs=jobs), "t").to_status()
    assert cond(st, "Failed")["status"] == "False"
    assert st["phase"] == "Pending"


def test_invalid_spec_is_reported() -> None:
    st = compute_status(
        Observed(generation=1, spec=None, problems=["gpu.models: bad"]), "t"
    ).to_status()
    assert st["phase"] == "Invalid"
    assert "gpu.models: bad" in cond(st, "Ready")["message"]
    assert cond(st, "Ready")["reason"] == "InvalidSpec"


def test_observe_completed_job_reads_the_publish_message() -> None:
    msg = json.dumps(RESULTS["c"].obj())
    obs = observe_job(JOB.condition("Complete").obj(), [ENDED.terminated("publish", 0, msg).obj()])
    assert obs.state == "Succeeded" and obs.record is not None and obs.record.sha256 == "c" * 64


def test_observe_completed_job_without_record_is_a_failure() -> None:
    obs = observe_job(JOB.condition("Complete").obj(), [ENDED.terminated("publish", 0, "").obj()])
    assert obs.state == "Failed" and "termination message" in obs.message


def test_observe_failed_job_quotes_the_failing_container() -> None:
    failed = JOB.condition("Failed", reason="BackoffLimitExceeded", message="limit").obj()
    pod = ENDED.terminated(
        "tune", 2, "tuner_job: error: TunableOp needs a ROCm or CUDA GPU", init=True
    ).obj()
    obs = observe_job(failed, [pod])
    assert obs.state == "Failed"
    assert (
        "container tune exited 2: tuner_job: error: TunableOp needs a ROCm or CUDA GPU"
        in obs.message
    )
    assert "kubectl delete job -n ml tune-x" in obs.message


def test_observe_running_needs_a_scheduled_pod() -> None:
    scheduled = SCHEDULED.obj()
    assert observe_job(JOB.active(1).obj(), [scheduled]).state == "Running"
    # A Job's "active" counts pods that are not even scheduled: that is not tuning.
    assert observe_job(JOB.active(1).obj(), []).state == "Pending"
    assert observe_job(JOB.obj(), []).state == "Pending"


SCHED = Hints(
    label_key="amd.com/gpu.product-name",
    resource="amd.com/gpu",
    credentials_secret="s3",
    credentials_kind="S3 credentials",
    credential_keys=("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
)


def test_no_node_with_the_model_is_named_with_the_fix() -> None:
    msg = "0/7 nodes are available: 7 node(s) didn't match Pod's node affinity/selector. preemption: 0/7 nodes are available: 7 Preemption is not helpful for scheduling."
    pod = LIVE.status(conditions=[{**UNSCHEDULABLE, "message": msg}]).obj()
    obs = observe_job(JOB.active(1).obj(), [pod], SCHED)
    assert obs.state == "Pending" and obs.reason == "Unschedulable"
    assert f"no node has amd.com/gpu.product-name={MODELS[0]}" in obs.message
    assert "kubectl label node" in obs.message and "scheduler: 0/7 nodes" in obs.message


def test_no_node_with_the_model_is_named_where_other_pools_are_tainted() -> None:
    # GPU pools tainted as on real clusters: the scheduler names the other pools' taints, not
    # their labels, for the nodes the tuning pod does not tolerate.
    msg = "0/7 nodes are available: 3 node(s) didn't match Pod's node affinity/selector, 4 node(s) had untolerated taint(s). no new claims to deallocate, preemption: 0/7 nodes are available: 7 Preemption is not helpful for scheduling."
    pod = LIVE.status(conditions=[{**UNSCHEDULABLE, "message": msg}]).obj()
    obs = observe_job(JOB.active(1).obj(), [pod], SCHED)
    assert obs.reason == "Unschedulable"
    assert f"no node has amd.com/gpu.product-name={MODELS[0]} among those" in obs.message
    assert "4 more have a taint it does not tolerate: it tolerates amd.com/gpu only" in obs.message
    assert "kubectl label node" in obs.message


def test_a_taint_on_every_node_is_named() -> None:
    msg = "0/3 nodes are available: 3 node(s) had untolerated taint {dedicated: team-a}. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    pod = LIVE.status(conditions=[{**UNSCHEDULABLE, "message": msg}]).obj()
    obs = observe_job(JOB.active(1).obj(), [pod], SCHED)
    assert "have a taint the tuning pod does not tolerate" in obs.message, obs.message


def test_all_gpus_taken_is_named() -> None:
    msg = "0/7 nodes are available: 1 Insufficient amd.com/gpu, 6 node(s) didn't match Pod's node affinity/selector. preemption: 0/7 nodes are available: 1 No preemption victims found for incoming pod, 6 Preemption is not helpful for scheduling."
    pod = LIVE.status(conditions=[{**UNSCHEDULABLE, "message": msg}]).obj()
    obs = observe_job(JOB.active(1).obj(), [pod], SCHED)
    assert obs.reason == "Unschedulable" and "has its amd.com/gpu in use" in obs.message


def test_missing_credentials_secret_is_named_with_the_fix() -> None:
    waiting = {"reason": "CreateContainerConfigError", "message": 'secret "s3" not found'}
    pod = SCHEDULED.container_state("publish", {"waiting": waiting}, init=True, image="img:1").obj()
    obs = observe_job(JOB.active(1).obj(), [pod], SCHED)
    assert obs.state == "Pending" and obs.reason == "SecretMissing"
    assert "Secret s3 (S3 credentials for publishing) does not exist in namespace ml" in obs.message
    assert "kubectl create secret generic s3 -n ml" in obs.message
    waiting = {"reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}
    pod = SCHEDULED.container_state("tune", {"waiting": waiting}, init=True, image="img:1").obj()
    obs = observe_job(JOB.active(1).obj(), [pod], SCHED)
    assert (
        "Secret hf-token, referenced by spec.workload.env or spec.template.tune.envFrom"
        in obs.message
    )
    waiting = {
        "reason": "CreateContainerConfigError",
        "message": "couldn't find key AWS_SECRET_ACCESS_KEY in Secret ml/s3",
    }
    pod = SCHEDULED.container_state("publish", {"waiting": waiting}, init=True, image="img:1").obj()
    obs = observe_job(JOB.active(1).obj(), [pod], SCHED)
    assert obs.reason == "SecretMissing" and "has no key AWS_SECRET_ACCESS_KEY" in obs.message


def test_image_pull_failure_names_missing_pull_secrets() -> None:
    waiting = {
        "reason": "ImagePullBackOff",
        "message": 'Back-off pulling image "reg.example.com/x:1"',
    }
    pod = SCHEDULED.container_state("tune", {"waiting": waiting}, init=True, image="img:1").obj()
    obs = observe_job(JOB.active(1).obj(), [pod], SCHED)
    assert obs.reason == "ImagePullFailed" and "spec.imagePullSecrets" in obs.message
    events = [
        {
            "reason": "FailedToRetrieveImagePullSecret",
            "message": "Unable to retrieve some image pull secrets (regcred, other); attempting to pull the image may not succeed.",
        }
    ]
    missing = pull_secrets_missing(events)
    assert missing == ("regcred", "other")
    hints = Hints(
        **{**SCHED.__dict__, "pull_secrets": ("regcred", "other"), "missing_pull_secrets": missing}
    )
    obs = observe_job(JOB.active(1).obj(), [pod], hints)
    assert "image pull Secret(s) regcred, other do not exist in namespace ml" in obs.message


def test_blocked_jobs_make_the_profile_pending_with_the_reason() -> None:
    jobs = [
        make_observation("j0", MODELS[0], REV, "Pending")
        .fields(message="no node has X", reason="Unschedulable")
        .obj(),
        make_observation("j1", MODELS[1], REV, "Running").obj(),
    ]
    st = compute_status(Observed(generation=1, spec=SPEC, jobs=jobs), "t").to_status()
    assert st["phase"] == "Pending"
    assert cond(st, "Ready")["reason"] == "Unschedulable"
    assert "no node has X" in cond(st, "Ready")["message"]
    assert cond(st, "Progressing")["reason"] == "Unschedulable"
    assert st["jobs"][0]["reason"] == "Unschedulable"


def test_outcomes_show_as_tuned_over_total_and_default_only_is_said() -> None:
    cuda = {"torch": "2.11.0+cu130", "cuda": "13.0", "gpuName": "H100"}
    jobs = [
        make_observation("j0", MODELS[0], REV, "Succeeded")
        .record(RESULTS["a"].fields(gemms=4, outcomes={"tuned": 0, "default": 4}, identity=cuda))
        .obj(),
        make_observation("j1", MODELS[1], REV, "Succeeded")
        .record(RESULTS["b"].fields(gemms=5, outcomes={"tuned": 3, "default": 2}))
        .fields(image_id="reg.example.com/img@sha256:" + "c" * 64)
        .obj(),
    ]
    st = compute_status(Observed(generation=1, spec=SPEC, jobs=jobs), "t").to_status()
    assert st["tunedGemms"] == "3/9"
    assert st["note"] == f"Default only on {MODELS[0]}"
    ready = cond(st, "Ready")["message"]
    assert "torch 2.11.0+cu130 on CUDA offers only Default" in ready
    assert "TunableOp chooses cuBLASLt kernels from torch 2.14" in ready
    assert st["artifacts"][0]["outcomes"] == {"tuned": 0, "default": 4}
    # The pod's imageID stands in when publish could not learn it.
    assert st["artifacts"][1]["image"]["id"].endswith("c" * 64)


def test_artifacts_from_before_outcomes_show_unknown() -> None:
    jobs = [make_observation("j0", MODELS[0], REV, "Succeeded").record(RESULTS["a"]).obj()]
    st = compute_status(Observed(generation=1, spec=SPEC, jobs=jobs), "t").to_status()
    assert st["tunedGemms"] == "?/3"


def test_a_merge_jobs_record_is_the_artifact() -> None:
    merge = JOB.condition("Complete").role("merge").obj()
    msg = json.dumps(RESULTS["d"].fields(shards=2).obj())
    obs = observe_job(merge, [ENDED.terminated("merge", 0, msg).obj()])
    assert obs.state == "Succeeded" and obs.role == "merge" and obs.record is not None


# --- the read side: a status as the API server holds it, typed ------------------------------


def test_a_status_the_model_wrote_reads_back_as_itself() -> None:
    from tunefleet.api.profile_status import TuningProfileStatus

    jobs = [
        make_observation(f"j{i}", m, REV, "Succeeded").record(RESULTS[str(i)]).obj()
        for i, m in enumerate(MODELS)
    ]
    ready = compute_status(Observed(generation=3, spec=SPEC, jobs=jobs), "2026-11-29T11:00:00Z")
    tuning = compute_status(
        Observed(generation=4, spec=SPEC, jobs=[make_observation("j", MODELS[0], REV).obj()]),
        "2026-11-29T11:00:00Z",
    )
    invalid = compute_status(
        Observed(generation=1, spec=None, problems=["spec.gpu: x"]), "2026-11-29T11:00:00Z"
    )
    for status in (ready, tuning, invalid):
        written = status.to_status()
        assert TuningProfileStatus.from_status(written).to_status() == written


def test_a_status_of_any_shape_reads_without_raising_and_trusts_nothing_odd() -> None:
    from tunefleet.api.conditions import Phase
    from tunefleet.api.profile_status import TuningProfileStatus

    odd = {
        "observedGeneration": "3",
        "phase": "Exploded",
        "conditions": [{"type": "Ready"}, "x", None],
        "jobs": [{"name": 1}],
        "artifacts": [{"gpuModel": "H100"}, 7],
        "unadmittedPods": "9",
        "gemms": True,
        "capture": [{"nope": 1}],
    }
    for raw in (odd, {}, None, [], "status"):
        read = TuningProfileStatus.from_status(raw)
        assert read.phase == Phase.PENDING and read.conditions == [] and read.jobs == []
        assert read.artifacts == [] and read.unadmitted_pods == 0 and read.capture is None
        assert read.observed_generation == 0 and read.summary.gemms is None
