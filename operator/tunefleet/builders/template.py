"""spec.template applied to the Jobs tunefleet builds (job.py): pure, from manifest to manifest.

Every tuning pod (each share) gets all of it: metadata beside tunefleet's labels (which win),
volumes beside tunefleet's, tolerations beside the GPU toleration, affinity with tunefleet's
one-share-per-node term kept, nodeSelector beside the GPU-model selector, runtimeClassName,
serviceAccountName (its token is still not mounted), priorityClassName, the pod security
fields (the user's fsGroup replaces the one a pvc:// store asks for), a memory-backed /dev/shm
for shmSize; and the tune container alone gets the mounts, envFrom and resources (the GPU
resource stays spec.gpu's). tunefleet's own containers (bootstrap, the sync sidecar, publish)
keep their hardened settings and never get the user's mounts, environment or resources.

The merge Job runs only tunefleet's image and needs no GPU node: it takes the labels and
annotations, the ServiceAccount (with no credentials Secret, the store is reached with the
pod's cloud identity) and the priority class; not the placement (it would be kept to the GPU
pool for nothing), the runtime class (a GPU runtime may exist only on GPU nodes), volumes or
security fields. docs/operator.md has the table.
"""

from __future__ import annotations

import copy
from typing import Any

from tunefleet.api import TuningProfileSpec
from tunefleet.api.pod_template import SHM_PATH, SHM_VOLUME, PodTemplate

TUNE_CONTAINER = "tune"


def _dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, exclude_none=True)


def _pod(job: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    template = job["spec"]["template"]
    return template.setdefault("metadata", {}), template["spec"]


def _metadata(meta: dict[str, Any], template: PodTemplate) -> None:
    if template.metadata is None:
        return
    if template.metadata.labels:
        meta["labels"] = {**template.metadata.labels, **(meta.get("labels") or {})}
    if template.metadata.annotations:
        meta["annotations"] = {**template.metadata.annotations, **(meta.get("annotations") or {})}


def _affinity(ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> dict[str, Any]:
    """The user's affinity with tunefleet's podAntiAffinity term (one share per node) kept."""
    merged = copy.deepcopy(theirs or {})
    for kind, terms in (ours or {}).get("podAntiAffinity", {}).items():
        anti = merged.setdefault("podAntiAffinity", {})
        anti[kind] = [*terms, *anti.get(kind, [])]
    return merged


def _tune(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = next(
        c for c in pod.get("initContainers") or [] if c["name"] == TUNE_CONTAINER
    )
    return container


def apply_to_tuning_job(job: dict[str, Any], spec: TuningProfileSpec) -> dict[str, Any]:
    """The tuning Job with spec.template applied to its pod template (the Job unchanged when
    the profile has none)."""
    template = spec.template
    if template is None:
        return job
    meta, pod = _pod(job)
    _metadata(meta, template)
    tune = _tune(pod)
    if template.spec is not None:
        s = template.spec
        pod["volumes"] = [*pod.get("volumes", []), *(_dump(v) for v in s.volumes or [])]
        if s.tolerations:
            pod["tolerations"] = [*pod.get("tolerations", []), *copy.deepcopy(s.tolerations)]
        if s.affinity:
            pod["affinity"] = _affinity(pod.get("affinity"), s.affinity)
        if s.node_selector:
            pod["nodeSelector"] = {**s.node_selector, **pod.get("nodeSelector", {})}
        for key, value in (
            ("runtimeClassName", s.runtime_class_name),
            ("serviceAccountName", s.service_account_name),
            ("priorityClassName", s.priority_class_name),
        ):
            if value:
                pod[key] = value
        if s.security_context is not None:
            pod["securityContext"] = {**pod.get("securityContext", {}), **_dump(s.security_context)}
    if template.tune is not None:
        t = template.tune
        tune["volumeMounts"] = [*tune["volumeMounts"], *(_dump(m) for m in t.volume_mounts or [])]
        if t.env_from:
            tune["envFrom"] = [_dump(e) for e in t.env_from]
        if t.resources is not None:
            # The GPU resource is spec.gpu's (the models refuse it here): tunefleet's wins.
            resources = tune["resources"]
            for kind in ("requests", "limits"):
                given = getattr(t.resources, kind) or {}
                resources[kind] = {**given, **resources.get(kind, {})}
    if template.shm_size is not None:
        pod["volumes"] = [
            *pod.get("volumes", []),
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": template.shm_size}},
        ]
        tune["volumeMounts"] = [*tune["volumeMounts"], {"name": SHM_VOLUME, "mountPath": SHM_PATH}]
    return job


def apply_to_merge_job(job: dict[str, Any], spec: TuningProfileSpec) -> dict[str, Any]:
    """The merge Job runs only tunefleet's image and needs no GPU node: it takes the
    template's labels, annotations, ServiceAccount (the store's cloud identity) and priority."""
    template = spec.template
    if template is None:
        return job
    meta, pod = _pod(job)
    _metadata(meta, template)
    if template.spec is not None:
        if template.spec.service_account_name:
            pod["serviceAccountName"] = template.spec.service_account_name
        if template.spec.priority_class_name:
            pod["priorityClassName"] = template.spec.priority_class_name
    return job
