"""TuningProfiles and their Jobs as the operator's views see them, for unit tests that call
sync_profile and friends without an API server: `profile(**spec_over)` (namespace ml, name p,
uid uid-1, two AMD models), `jobs_for(profile, models)` (the Jobs tunefleet builds for it, with
the uid the API server would give them), `CFG` and `MODELS`."""

from __future__ import annotations

from typing import Any

from tunefleet.api import TuningProfileSpec
from tunefleet.builders.job import Child, build_tuning_job
from tunefleet.config import Config
from tunefleet.informers.views import job_view, profile_view

CFG = Config(image="tunefleet:1")
MODELS = ["AMD_Instinct_MI300X_OAM", "AMD_Instinct_MI325X_OAM"]


def profile(**spec_over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": "registry.example.com/serve:1",
        "gpu": {"vendor": "amd", "models": MODELS},
        "workload": {"shapes": [{"mnk": [8, 8, 8]}]},
        "storage": {"uri": "s3://bkt/p"},
    }
    spec.update(spec_over)
    return profile_view(
        {
            "apiVersion": "tunefleet.io/v1alpha1",
            "kind": "TuningProfile",
            "metadata": {"name": "p", "namespace": "ml", "uid": "uid-1", "generation": 1},
            "spec": spec,
        }
    )


def jobs_for(p: dict[str, Any], models: list[str]) -> list[dict[str, Any]]:
    spec = TuningProfileSpec.model_validate(p["spec"])
    jobs = [build_tuning_job(Child(spec, "ml", "p", "uid-1", m, CFG)) for m in models]
    for job in jobs:  # as the API server answers: with a uid
        job["metadata"]["uid"] = f"juid-{job['metadata']['name']}"
    return [job_view(job) for job in jobs]
