"""Status from observed Jobs: conditions, phase, artifacts, history, failure messages."""

from __future__ import annotations

import json
from typing import Any

from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.status import JobObservation, Observed, compute_status, observe_job, status_changed

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
    st = compute_status(Observed(generation=3, spec=SPEC, jobs=jobs), "2026-11-29T11:00:00Z")
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
    st = compute_status(Observed(generation=1, spec=SPEC, jobs=jobs), "t")
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
    st = compute_status(Observed(generation=1, spec=SPEC, jobs=jobs), "t")
    assert st["phase"] == "Failed"
    failed = cond(st, "Failed")
    assert failed["status"] == "True" and "no GPU" in failed["message"]


def test_new_artifact_moves_old_to_history_and_transition_time_is_kept() -> None:
    old = {"gpuModel": MODELS[0], "uri": "s3://b/old", "sha256": "f" * 64, "revision": "old"}
    prev = compute_status(Observed(generation=1, spec=SPEC, previous={"artifacts": [old]}), "t1")
    assert prev["artifacts"] == [old]
    jobs = [JobObservation("j0", MODELS[0], REV, "Succeeded", result=result("a" * 64))]
    st = compute_status(Observed(generation=1, spec=SPEC, jobs=jobs, previous=prev), "t2")
    assert st["history"][0]["sha256"] == "f" * 64
    assert st["artifacts"][0]["sha256"] == "a" * 64
    # Ready stayed False (MI325X has nothing): its transition time must not move.
    assert cond(st, "Ready")["lastTransitionTime"] == "t1"
    again = compute_status(Observed(generation=1, spec=SPEC, jobs=jobs, previous=st), "t3")
    assert not status_changed(st, again)


def test_jobs_of_another_revision_are_ignored() -> None:
    jobs = [JobObservation("old", MODELS[0], "0000000000", "Failed", "old failure")]
    st = compute_status(Observed(generation=2, spec=SPEC, jobs=jobs), "t")
    assert cond(st, "Failed")["status"] == "False"
    assert st["phase"] == "Pending"


def test_invalid_spec_is_reported() -> None:
    st = compute_status(Observed(generation=1, spec=None, problems=["gpu.models: bad"]), "t")
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
    assert obs.state == "Succeeded" and obs.result is not None and obs.result["sha256"] == "c" * 64


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


def test_observe_running() -> None:
    assert observe_job(_job([], active=1), []).state == "Running"
    assert observe_job(_job([]), []).state == "Pending"
