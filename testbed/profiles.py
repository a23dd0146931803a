"""A TuningProfile as users apply it (apiVersion, kind, name, spec): the envelope the real-node,
torch.compile, vLLM and kwok-fleet profiles share, each with a spec of its own."""

from __future__ import annotations

from typing import Any


def tuning_profile(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "tunefleet.io/v1alpha1",
        "kind": "TuningProfile",
        "metadata": {"name": name},
        "spec": spec,
    }
