"""The TuningProfile API as Python types; crds/ is the schema source they mirror."""

from tunefleet.api.models import (
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
