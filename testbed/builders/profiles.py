"""TuningProfiles and their Jobs as the operator's views see them, for unit tests that call
sync_profile and friends without an API server: `profile(**spec_over)` (namespace ml, name p,
uid uid-1, two AMD models), `jobs_for(profile, models)` (the Jobs tunefleet builds for it, with
the uid the API server would give them), `CFG` and `MODELS`."""

from __future__ import annotations

from typing import Any

from testbed.builders.wrappers import make_pod, make_profile
from tunefleet.api import TuningProfileSpec
from tunefleet.builders.job import Child, build_tuning_job, held_for_gpu
from tunefleet.config import Config
from tunefleet.watched.views import job_view, profile_view

CFG = Config(image="tunefleet:1")
MODELS = ["AMD_Instinct_MI300X_OAM", "AMD_Instinct_MI325X_OAM"]


# The profile most reconcile tests start from (sync_profile reads it through profile_view).
PROFILE = (
    make_profile("p", "ml").uid("uid-1").generation(1)
    .image("registry.example.com/serve:1").gpu("amd", *MODELS)
)  # fmt: skip


def profile(**spec_over: Any) -> dict[str, Any]:
    """PROFILE with these spec fields set whole, as the profile informer hands it over."""
    return profile_view(PROFILE.spec(**spec_over).obj())


def jobs_for(p: dict[str, Any], models: list[str]) -> list[dict[str, Any]]:
    spec = TuningProfileSpec.model_validate(p["spec"])
    jobs = [build_tuning_job(Child(spec, "ml", "p", "uid-1", m, CFG)) for m in models]
    for job in jobs:  # as the API server answers: with a uid
        job["metadata"]["uid"] = f"juid-{job['metadata']['name']}"
    return [job_view(job) for job in jobs]


def watched_job(
    spec: TuningProfileSpec,
    profile: str,
    model: str,
    *,
    uid: str,
    created: str = "2026-12-05T00:00:00Z",
    held: bool = False,
    done: bool = False,
) -> dict[str, Any]:
    """A whole tuning Job of `profile` (namespace ml, profile uid uid-<profile>) as its watch
    brings it: made by the builder, then given a uid and a creation time; `held` by the GPU
    gate, `done` (Complete)."""
    body = build_tuning_job(Child(spec, "ml", profile, f"uid-{profile}", model, CFG))
    if held:
        body = held_for_gpu(body)
    body["metadata"]["uid"] = uid
    body["metadata"]["creationTimestamp"] = created
    if done:
        body["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    return body


def bound_pod_of(job: dict[str, Any], node: str = "gpu-0") -> dict[str, Any]:
    """A pod the Job controls, on `node` (what the pod watch brings once it is scheduled)."""
    meta = job["metadata"]
    pod = make_pod(f"{meta['name']}-0").meta(uid=f"pod-{meta['uid']}")
    pod = pod.owner(meta["uid"], meta["name"], kind="Job", api_version="batch/v1")
    return pod.spec(nodeName=node).obj()
