"""Status from observed Jobs: conditions, phase, artifacts, history, failure messages."""

from __future__ import annotations

import json
from typing import Any

from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.contracts.artifact import ArtifactRecord
from tunefleet.reconciler.diagnose import Hints, pull_secrets_missing
from tunefleet.reconciler.observe import JobObservation as _Observation
from tunefleet.reconciler.observe import observe_job
from tunefleet.reconciler.status import Observed, compute_status, status_changed


def JobObservation(*args: Any, result: dict[str, Any] | None = None, **kw: Any) -> _Observation:
    """An observation whose publish step left `result` as its termination message."""
    record = ArtifactRecord.from_message(json.dumps(result)) if result is not None else None
    return _Observation(*args, record=record, **kw)


MODELS = ["AMD_Instinct_MI300X_OAM", "AMD_Instinct_MI325X_OAM"]
SPEC = TuningProfileSpec.model_validate(
    {
        "image": "img:1",
        "gpu": {"vendor": "amd", "models": MODELS},
        "workload": {"shapes": [{"mnk": [8, 8, 8]}]},
        "storage": {"uri": "s3://bkt/p"},
    }
)
REV = naming.revision(SPEC)


def result(sha: str, gemms: int = 3) -> dict[str, Any]:
    return {
        "uri": f"s3://bkt/p/ns/x/m/{sha}",
        "sha256": sha,
        "gemms": gemms,
        "tunedAt": "2026-11-29T10:00:00Z",
        "identity": {"gpuName": "MI300X", "torch": "2.11"},
    }


def cond(status: dict[str, Any], t: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == t)


def test_all_models_published_is_ready() -> None:
    jobs = [
        JobObservation(f"j{i}", m, REV, "Succeeded", result=result(f"{i}" * 64))
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
        JobObservation("j0", MODELS[0], REV, "Succeeded", result=result("a" * 64)),
        JobObservation("j1", MODELS[1], REV, "Running"),
    ]
    st = compute_status(Observed(generation=1, spec=SPEC, jobs=jobs), "t").to_status()
    assert st["phase"] == "Tuning"
    assert cond(st, "Ready")["status"] == "False"
    assert MODELS[1] in cond(st, "Ready")["message"]
    assert cond(st, "Progressing")["status"] == "True"


def test_failure_carries_the_pods_message() -> None:
    jobs = [
        JobObservation(
            "j0", MODELS[0], REV, "Failed", "Job j0 failed; container tune exited 1: no GPU"
        ),
        JobObservation("j1", MODELS[1], REV, "Running"),
    ]
    st = compute_status(Observed(generation=1, spec=SPEC, jobs=jobs), "t").to_status()
    assert st["phase"] == "Failed"
    failed = cond(st, "Failed")
    assert failed["status"] == "True" and "no GPU" in failed["message"]


def test_new_artifact_moves_old_to_history_and_transition_time_is_kept() -> None:
    old = {"gpuModel": MODELS[0], "uri": "s3://b/old", "sha256": "f" * 64, "revision": "old"}
    prev = compute_status(
        Observed(generation=1, spec=SPEC, previous={"artifacts": [old]}), "t1"
    ).to_status()
    assert prev["artifacts"] == [old]
    jobs = [JobObservation("j0", MODELS[0], REV, "Succeeded", result=result("a" * 64))]
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
    jobs = [JobObservation("old", MODELS[0], "0000000000", "Failed", "old failure")]
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


def _job(conditions: list[dict[str, Any]], active: int = 0) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "tune-x",
            "namespace": "ml",
            "uid": "u",
            "labels": {naming.REVISION_LABEL: REV},
            "annotations": {"tunefleet.io/gpu-model": MODELS[0]},
        },
        "status": {"conditions": conditions, "active": active},
    }


def _pod(name: str, code: int, message: str, init: bool = False) -> dict[str, Any]:
    key = "initContainerStatuses" if init else "containerStatuses"
    return {
        "metadata": {"name": "p", "creationTimestamp": "2026-11-29T10:00:00Z"},
        "status": {
            key: [{"name": name, "state": {"terminated": {"exitCode": code, "message": message}}}]
        },
    }


def test_observe_completed_job_reads_the_publish_message() -> None:
    msg = json.dumps(result("c" * 64))
    obs = observe_job(_job([{"type": "Complete", "status": "True"}]), [_pod("publish", 0, msg)])
    assert obs.state == "Succeeded" and obs.record is not None and obs.record.sha256 == "c" * 64


def test_observe_completed_job_without_record_is_a_failure() -> None:
    obs = observe_job(_job([{"type": "Complete", "status": "True"}]), [_pod("publish", 0, "")])
    assert obs.state == "Failed" and "termination message" in obs.message


def test_observe_failed_job_quotes_the_failing_container() -> None:
    failed = [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "limit"}
    ]
    pod = _pod("tune", 2, "tuner_job: error: TunableOp needs a ROCm or CUDA GPU", init=True)
    obs = observe_job(_job(failed), [pod])
    assert obs.state == "Failed"
    assert (
        "container tune exited 2: tuner_job: error: TunableOp needs a ROCm or CUDA GPU"
        in obs.message
    )
    assert "kubectl delete job -n ml tune-x" in obs.message


def _live(conditions: list[dict[str, Any]], node: str = "", **statuses: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ml", "uid": "pu", "creationTimestamp": "t"},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": "Pending", "conditions": conditions, **statuses},
    }


def test_observe_running_needs_a_scheduled_pod() -> None:
    scheduled = _live([{"type": "PodScheduled", "status": "True"}], node="n1")
    assert observe_job(_job([], active=1), [scheduled]).state == "Running"
    # A Job's "active" counts pods that are not even scheduled: that is not tuning.
    assert observe_job(_job([], active=1), []).state == "Pending"
    assert observe_job(_job([]), []).state == "Pending"


SCHED = Hints(
    label_key="amd.com/gpu.product-name",
    resource="amd.com/gpu",
    credentials_secret="s3",
    credentials_kind="S3 credentials",
    credential_keys=("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
)


def unschedulable(message: str) -> dict[str, Any]:
    return _live(
        [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]
    )


def test_no_node_with_the_model_is_named_with_the_fix() -> None:
    msg = "0/7 nodes are available: 7 node(s) didn't match Pod's node affinity/selector. preemption: 0/7 nodes are available: 7 Preemption is not helpful for scheduling."
    obs = observe_job(_job([], active=1), [unschedulable(msg)], SCHED)
    assert obs.state == "Pending" and obs.reason == "Unschedulable"
    assert f"no node has amd.com/gpu.product-name={MODELS[0]}" in obs.message
    assert "kubectl label node" in obs.message and "scheduler: 0/7 nodes" in obs.message


def test_no_node_with_the_model_is_named_where_other_pools_are_tainted() -> None:
    # GPU pools tainted as on real clusters: the scheduler names the other pools' taints, not
    # their labels, for the nodes the tuning pod does not tolerate.
    msg = "0/7 nodes are available: 3 node(s) didn't match Pod's node affinity/selector, 4 node(s) had untolerated taint(s). no new claims to deallocate, preemption: 0/7 nodes are available: 7 Preemption is not helpful for scheduling."
    obs = observe_job(_job([], active=1), [unschedulable(msg)], SCHED)
    assert obs.reason == "Unschedulable"
    assert f"no node has amd.com/gpu.product-name={MODELS[0]} among those" in obs.message
    assert "4 more have a taint it does not tolerate: it tolerates amd.com/gpu only" in obs.message
    assert "kubectl label node" in obs.message


def test_a_taint_on_every_node_is_named() -> None:
    msg = "0/3 nodes are available: 3 node(s) had untolerated taint {dedicated: team-a}. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    obs = observe_job(_job([], active=1), [unschedulable(msg)], SCHED)
    assert "have a taint the tuning pod does not tolerate" in obs.message, obs.message


def test_all_gpus_taken_is_named() -> None:
    msg = "0/7 nodes are available: 1 Insufficient amd.com/gpu, 6 node(s) didn't match Pod's node affinity/selector. preemption: 0/7 nodes are available: 1 No preemption victims found for incoming pod, 6 Preemption is not helpful for scheduling."
    obs = observe_job(_job([], active=1), [unschedulable(msg)], SCHED)
    assert obs.reason == "Unschedulable" and "has its amd.com/gpu in use" in obs.message


def waiting(name: str, reason: str, message: str, image: str = "img:1") -> dict[str, Any]:
    cs = {
        "name": name,
        "image": image,
        "state": {"waiting": {"reason": reason, "message": message}},
    }
    return _live(
        [{"type": "PodScheduled", "status": "True"}], node="n1", initContainerStatuses=[cs]
    )


def test_missing_credentials_secret_is_named_with_the_fix() -> None:
    pod = waiting("publish", "CreateContainerConfigError", 'secret "s3" not found')
    obs = observe_job(_job([], active=1), [pod], SCHED)
    assert obs.state == "Pending" and obs.reason == "SecretMissing"
    assert "Secret s3 (S3 credentials for publishing) does not exist in namespace ml" in obs.message
    assert "kubectl create secret generic s3 -n ml" in obs.message
    pod = waiting("tune", "CreateContainerConfigError", 'secret "hf-token" not found')
    obs = observe_job(_job([], active=1), [pod], SCHED)
    assert (
        "Secret hf-token, referenced by spec.workload.env or spec.template.tune.envFrom"
        in obs.message
    )
    pod = waiting(
        "publish",
        "CreateContainerConfigError",
        "couldn't find key AWS_SECRET_ACCESS_KEY in Secret ml/s3",
    )
    obs = observe_job(_job([], active=1), [pod], SCHED)
    assert obs.reason == "SecretMissing" and "has no key AWS_SECRET_ACCESS_KEY" in obs.message


def test_image_pull_failure_names_missing_pull_secrets() -> None:
    pod = waiting("tune", "ImagePullBackOff", 'Back-off pulling image "reg.example.com/x:1"')
    obs = observe_job(_job([], active=1), [pod], SCHED)
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
    obs = observe_job(_job([], active=1), [pod], hints)
    assert "image pull Secret(s) regcred, other do not exist in namespace ml" in obs.message


def test_blocked_jobs_make_the_profile_pending_with_the_reason() -> None:
    jobs = [
        JobObservation("j0", MODELS[0], REV, "Pending", "no node has X", reason="Unschedulable"),
        JobObservation("j1", MODELS[1], REV, "Running"),
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
        JobObservation(
            "j0",
            MODELS[0],
            REV,
            "Succeeded",
            result={
                **result("a" * 64, 4),
                "outcomes": {"tuned": 0, "default": 4},
                "identity": cuda,
            },
        ),
        JobObservation(
            "j1",
            MODELS[1],
            REV,
            "Succeeded",
            result={**result("b" * 64, 5), "outcomes": {"tuned": 3, "default": 2}},
            image_id="reg.example.com/img@sha256:" + "c" * 64,
        ),
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
    jobs = [JobObservation("j0", MODELS[0], REV, "Succeeded", result=result("a" * 64))]
    st = compute_status(Observed(generation=1, spec=SPEC, jobs=jobs), "t").to_status()
    assert st["tunedGemms"] == "?/3"


def test_a_merge_jobs_record_is_the_artifact() -> None:
    merge = _job([{"type": "Complete", "status": "True"}])
    merge["metadata"]["labels"][naming.ROLE_LABEL] = "merge"
    msg = json.dumps({**result("d" * 64), "shards": 2})
    obs = observe_job(merge, [_pod("merge", 0, msg)])
    assert obs.state == "Succeeded" and obs.role == "merge" and obs.record is not None
