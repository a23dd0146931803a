"""TuningProfiles and their Jobs as the operator's views see them, for unit tests that call
sync_profile and friends without an API server: `profile(**spec_over)` (namespace ml, name p,
uid uid-1, two AMD models), `jobs_for(profile, models)` (the Jobs tunefleet builds for it, with
the uid the API server would give them), `CFG` and `MODELS`."""

from __future__ import annotations

from typing import Any

from tests.support.wrappers import make_profile
from tunefleet.api import TuningProfileSpec
from tunefleet.builders.job import Child, build_tuning_job
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
