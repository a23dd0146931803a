"""The TuningProfile API as Python types; crds/ is the schema source they mirror."""

from tunefleet.api.models import (
    Artifact,
    CaptureSpec,
    CaptureStatus,
    Condition,
    GpuSpec,
    PromotionSpec,
    RetuneSpec,
    ServingSpec,
    Shape,
    StorageSpec,
    TuningLimits,
    TuningProfileSpec,
    WorkloadSpec,
)

__all__ = [
    "Artifact",
    "CaptureSpec",
    "CaptureStatus",
    "Condition",
    "GpuSpec",
    "PromotionSpec",
    "RetuneSpec",
    "ServingSpec",
    "Shape",
    "StorageSpec",
    "TuningLimits",
    "TuningProfileSpec",
    "WorkloadSpec",
]
