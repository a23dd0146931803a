"""Which GPU partition a model pod asks for, from what the webhook can see of it (pure).

An artifact tuned on a whole GPU must not be served to a partition of one, or the reverse: the
arch, the validators and usually the product label are the same, but a partition has fewer
compute units and other kernels win on it (ROCm's CPX heuristic returned nothing and forced a
scan of ~2,680 candidates). The tuner records the partition its own device reports (identity
`partition`, `multiProcessorCount`); the webhook compares it with what the pod asks for:

- the pod's nodeSelector, and required node affinity terms of one `In` value:
  - AMD GPU node labeller: `amd.com/gpu.compute-memory-partition` (`cpx_nps1`; the device
    plugin's docs also write `amd.com/compute-memory-partition`), `amd.com/gpu.cu-count`
    (and the `beta.amd.com/` forms);
  - NVIDIA GPU feature discovery: `nvidia.com/gpu.product` with a `-MIG-<profile>` suffix
    (single strategy), `nvidia.com/mig.config` (`all-1g.10gb`, `all-disabled`);
- extended resources the containers request: `nvidia.com/mig-<profile>` (mixed strategy),
  `amd.com/<compute>_<memory>` (the AMD device plugin's mixed naming);
- the annotation `tunefleet.io/gpu-partition` (`whole`, `cpx_nps1`, `mig-1g.10gb`): the pod's own
  word, for what the webhook cannot see, such as a DRA claim (`gpu.amd.com` partitionProfile,
  `gpu.nvidia.com` MIG profile attributes are chosen by the scheduler, after admission).

A pod that says nothing asks for a whole GPU; a pod that claims GPUs through DRA without the
annotation asks for an unknown partition and is served nothing rather than the wrong thing.
"""

from __future__ import annotations

import re
from typing import Any

from tuner_job.library import WHOLE_GPU, partition_name

PARTITION_ANNOTATION = "tunefleet.io/gpu-partition"
AMD_PARTITION_LABELS = (
    "amd.com/gpu.compute-memory-partition",
    "amd.com/compute-memory-partition",
    "beta.amd.com/gpu.compute-memory-partition",
)
AMD_CU_LABELS = ("amd.com/gpu.cu-count", "beta.amd.com/gpu.cu-count")
NVIDIA_PRODUCT_LABEL = "nvidia.com/gpu.product"
NVIDIA_MIG_CONFIG_LABEL = "nvidia.com/mig.config"
_AMD_RESOURCE_RE = re.compile(r"^amd\.com/([a-z]px)_(nps\d+)$")
_MIG_RESOURCE_RE = re.compile(r"^nvidia\.com/mig-((?:\d+c\.)?\d+g\.\d+gb)$")
_MIG_PRODUCT_RE = re.compile(r"-MIG-((?:\d+c\.)?\d+g\.\d+gb)$", re.IGNORECASE)
_MIG_CONFIG_RE = re.compile(r"^all-((?:\d+c\.)?\d+g\.\d+gb)$")
UNKNOWN = "unknown"


def node_terms(pod: dict[str, Any]) -> dict[str, str]:
    """The node labels a pod requires: its nodeSelector, and required node affinity
    `In` expressions with one value (the same in every term)."""
    spec = pod.get("spec") or {}
    out = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    per_term: list[dict[str, str]] = []
    for term in required:
        found = {}
        for expr in term.get("matchExpressions") or []:
            values = expr.get("values") or []
            if expr.get("operator") == "In" and len(values) == 1:
                found[str(expr.get("key"))] = str(values[0])
        per_term.append(found)
    if per_term:
        common = set.intersection(*(set(t.items()) for t in per_term))
        out.update(dict(common))
    return out


def _resources(pod: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            names |= set((res.get(part) or {}).keys())
    return names


def pod_partition(pod: dict[str, Any]) -> tuple[str, str]:
    """(partition, what said so): `whole`, a partition name, or `unknown`."""
    anns = (pod.get("metadata") or {}).get("annotations") or {}
    if anns.get(PARTITION_ANNOTATION):
        return str(anns[PARTITION_ANNOTATION]).strip().lower(), f"annotation {PARTITION_ANNOTATION}"
    labels = node_terms(pod)
    for key in AMD_PARTITION_LABELS:
        if key in labels:
            compute, _, memory = labels[key].lower().partition("_")
            return partition_name(compute, memory), f"node label {key}={labels[key]}"
    product = labels.get(NVIDIA_PRODUCT_LABEL, "")
    m = _MIG_PRODUCT_RE.search(product)
    if m:
        return partition_name(mig=m.group(1)), f"node label {NVIDIA_PRODUCT_LABEL}={product}"
    config = labels.get(NVIDIA_MIG_CONFIG_LABEL)
    if config:
        mc = _MIG_CONFIG_RE.match(config)
        if mc:
            return partition_name(mig=mc.group(1)), f"node label {NVIDIA_MIG_CONFIG_LABEL}={config}"
        if config == "all-disabled":
            return WHOLE_GPU, f"node label {NVIDIA_MIG_CONFIG_LABEL}={config}"
    for name in sorted(_resources(pod)):
        mr, ar = _MIG_RESOURCE_RE.match(name), _AMD_RESOURCE_RE.match(name)
        if mr:
            return partition_name(mig=mr.group(1)), f"resource {name}"
        if ar:
            return partition_name(ar.group(1), ar.group(2)), f"resource {name}"
    if (pod.get("spec") or {}).get("resourceClaims"):
        return UNKNOWN, "a DRA resource claim (its device is chosen after admission)"
    return WHOLE_GPU, "nothing in the pod asks for a partition"


def pod_cu_count(pod: dict[str, Any]) -> int | None:
    labels = node_terms(pod)
    for key in AMD_CU_LABELS:
        if labels.get(key, "").isdigit():
            return int(labels[key])
    return None


def partition_problem(pod: dict[str, Any], identity: dict[str, str]) -> tuple[str, bool] | None:
    """(why this artifact does not fit the partition the pod asks for, whether the pod's
    partition is unknown), or None when it fits."""
    wanted, source = pod_partition(pod)
    if wanted == UNKNOWN:
        return (
            f"the pod's GPU partition is unknown ({source}) and the artifact was tuned on "
            f"{identity.get('partition') or 'a GPU whose partition it does not record'}",
            True,
        )
    tuned = identity.get("partition")
    if tuned is None and wanted != WHOLE_GPU:
        why = f"the pod asks for GPU partition {wanted} ({source}); the artifact records none"
        return why + " (tuned before tunefleet recorded partitions)", False
    if tuned is not None and tuned != wanted:
        return (
            f"the artifact was tuned on GPU partition {tuned}, the pod asks for {wanted} "
            f"({source})",
            False,
        )
    cus, tuned_cus = pod_cu_count(pod), identity.get("multiProcessorCount")
    if cus is not None and tuned_cus is not None and tuned_cus != str(cus):
        return (
            f"the artifact was tuned on a device with {tuned_cus} compute units, the pod "
            f"selects {cus} (node label amd.com/gpu.cu-count)",
            False,
        )
    return None
