"""A complete manifest.json (tuner_job.manifest.Manifest) for unit tests, any field overridden:
an MI300X artifact of profile ml/llama with outcomes counted (test_manifest,
test_artifact_kinds)."""

from __future__ import annotations

from typing import Any

from tuner_job.manifest import Manifest
from tuner_job.results import Outcomes


def manifest(**over: Any) -> Manifest:
    fields: dict[str, Any] = {
        "namespace": "ml",
        "profile": "llama",
        "revision": "3f2a9c01de",
        "gpu_model": "AMD_Instinct_MI300X_OAM",
        "results_sha256": "ab" * 32,
        "gemms": 12,
        "recorded": 14,
        "validators": {"PT_VERSION": "2.11.0", "GCN_ARCH_NAME": "gfx942:sramecc+:xnack-"},
        "identity": {"gpuName": "AMD Instinct MI300X", "arch": "gfx942", "gpuCount": "8"},
        "tuning_seconds": 812.5,
        "tuned_at": "2026-11-29T20:00:00Z",
        "tool_version": "0.1.0",
        "outcomes": Outcomes(tuned=9, default=3),
    }
    fields.update(over)
    return Manifest(**fields)
