"""Plain Kubernetes documents for the testbed and the benchmarks, as the API server takes them:
an object's head (`manifest`), a document with no metadata (`document`: a kubeconfig, a
component's configuration), a v1 List, a kubeconfig that logs in with a token, the benchmarks'
TuningProfile.

Standard library only: the testbed's cluster, operator, Kueue and registry modules and the
benchmarks build their objects here without importing tunefleet (wrappers.py, whose wrappers
start from `manifest`, does). No function in bench/ or in testbed/ outside testbed/builders/ writes
an apiVersion/kind literal of its own (tests/unit/test_layering.py keeps it so)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

GROUP_VERSION = "tunefleet.io/v1alpha1"


def document(api_version: str, kind: str, **fields: Any) -> dict[str, Any]:
    """A document with no metadata (a List, a kubeconfig, an AdmissionReview, a
    configuration file) and its other top-level fields."""
    return {"apiVersion": api_version, "kind": kind, **fields}


def manifest(api_version: str, kind: str, name: str, ns: str = "", **fields: Any) -> dict[str, Any]:
    """An object's head (namespaced when ns is given) and its other top-level fields."""
    meta = {"name": name, "namespace": ns} if ns else {"name": name}
    return document(api_version, kind, metadata=meta, **fields)


def object_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A v1 List of `items` (the list itself, not a copy: the benchmarks list thousands),
    for one `kubectl create -f`."""
    return document("v1", "List", items=items)


def token_kubeconfig(cluster: dict[str, Any], user: str, token: str) -> dict[str, Any]:
    """A kubeconfig for the cluster entry `cluster` (an admin kubeconfig's clusters[0].cluster)
    that logs in as `user` with a bearer token; its one context is named after the user."""
    return document(
        "v1",
        "Config",
        clusters=[{"name": "local", "cluster": cluster}],
        users=[{"name": user, "user": {"token": token}}],
        contexts=[{"name": user, "context": {"cluster": "local", "user": user}}],
        **{"current-context": user},
    )


def bench_profile(
    name: str, model: str = "NVIDIA-H200", mnk: Sequence[int] = (64, 64, 64)
) -> dict[str, Any]:
    """The benchmarks' TuningProfile: one GPU model, one GEMM shape, the bench's store."""
    return manifest(
        GROUP_VERSION,
        "TuningProfile",
        name,
        spec={
            "image": "registry.example.com/serve:1",
            "gpu": {"vendor": "nvidia", "models": [model]},
            "workload": {"shapes": [{"mnk": list(mnk)}]},
            "storage": {"uri": "s3://tunefleet/bench"},
        },
    )
