"""The TuningProfile API as Python types; crds/ is the schema source they mirror."""

from tunefleet.api.models import (
    Artifact,
    Condition,
    GpuSpec,
    ServingSpec,
    Shape,
    StorageSpec,
    TuningLimits,
    TuningProfileSpec,
    WorkloadSpec,
)

__all__ = [
    "Artifact",
    "Condition",
    "GpuSpec",
    "ServingSpec",
    "Shape",
    "StorageSpec",
    "TuningLimits",
    "TuningProfileSpec",
    "WorkloadSpec",
]
