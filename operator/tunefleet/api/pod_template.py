"""spec.template: what a real model's record run needs of its tuning pod, in core/v1 terms.

The CRD carries Kubernetes' own core/v1 schemas for these fields (hack/crd_core_schemas.py
writes them), so the API server validates them as it validates a pod's. The models here judge
what the operator must: tunefleet's reserved names, the volume type (the profile policy,
policy.py), the names the policy allows, and how the template meets spec.gpu. What nothing
here judges (a volume source's fields, tolerations, affinity) passes through as the API server
stored it (`Passthrough`); tests/unit/test_schema_drift.py names each such field and checks
that the CRD validates it with a real schema.

The names reserved here are the single source: the builders use them for tunefleet's own
volumes and paths, and the CRD's CEL rules are generated from them.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from tunefleet.api.base import DNS_LABEL, DNS_SUBDOMAIN, Model

# tunefleet's own volumes of a tuning pod (builders/job.py), and a prefix for any it adds.
RESERVED_VOLUMES = ("config", "exchange", "out", "tmp", "tools")
RESERVED_VOLUME_PREFIX = "tunefleet-"
# Where tunefleet mounts its tools, configuration, results and store in a tuning pod.
RESERVED_MOUNT = "/tunefleet"
SHM_PATH = "/dev/shm"
SHM_VOLUME = RESERVED_VOLUME_PREFIX + "shm"
# Label and annotation keys that are tunefleet's (tunefleet.io/ and any *.tunefleet.io/) or
# the Job controller's; and labels tunefleet or the Job controller set on a tuning pod.
RESERVED_KEY_PATTERN = r"^(([^/]*\.)?tunefleet\.io/|batch\.kubernetes\.io/)"
RESERVED_LABELS = ("app.kubernetes.io/managed-by", "controller-uid", "job-name")
# Every volume type the CRD takes. Kubernetes' in-tree drivers (deprecated upstream, most
# redirected to CSI) are reached through a persistentVolumeClaim; gitRepo is disabled upstream.
VOLUME_TYPES = (
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "hostPath", "image", "nfs",
    "persistentVolumeClaim", "projected", "secret",
)  # fmt: skip
KEY_SIZE = 316  # a map key: a qualified name (253-character DNS prefix, '/', 63 characters)
QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

_RESERVED_KEY = re.compile(RESERVED_KEY_PATTERN)

# A core/v1 object the operator passes on as the API server validated and stored it.
Passthrough = dict[str, Any]
Quantity = int | Annotated[str, Field(max_length=64, pattern=QUANTITY)]
Name = Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN)]


def _keys(what: str, mapping: dict[str, Any] | None, reserved: tuple[str, ...] = ()) -> None:
    for key in mapping or {}:
        if len(key) > KEY_SIZE:
            raise ValueError(f"{what}: key {key[:40]!r}... is over {KEY_SIZE} characters")
        if _RESERVED_KEY.match(key) or key in reserved:
            raise ValueError(
                f"{what}: {key!r} is reserved (keys under tunefleet.io/ and "
                "batch.kubernetes.io/, and " + ", ".join(reserved or ("none else",)) + ", are "
                "set by tunefleet and the Job controller): choose another key"
            )


class TemplateMetadata(Model):
    labels: dict[str, Annotated[str, Field(max_length=63)]] | None = Field(
        default=None, max_length=16
    )
    annotations: dict[str, Annotated[str, Field(max_length=1024)]] | None = Field(
        default=None, max_length=12
    )

    @model_validator(mode="after")
    def _not_reserved(self) -> TemplateMetadata:
        _keys("template.metadata.labels", self.labels, RESERVED_LABELS)
        _keys("template.metadata.annotations", self.annotations)
        return self


class Volume(Model):
    name: str = Field(max_length=63, pattern=DNS_LABEL)
    config_map: Passthrough | None = None
    csi: Passthrough | None = None
    downward_api: Passthrough | None = Field(default=None, alias="downwardAPI")
    empty_dir: Passthrough | None = None
    ephemeral: Passthrough | None = None
    host_path: Passthrough | None = None
    image: Passthrough | None = None
    nfs: Passthrough | None = None
    persistent_volume_claim: Passthrough | None = None
    projected: Passthrough | None = None
    secret: Passthrough | None = None

    @property
    def type(self) -> str:
        """The volume's type, by its source's field name (configMap, persistentVolumeClaim)."""
        return next(t for t in VOLUME_TYPES if getattr(self, _SOURCE_FIELDS[t]) is not None)

    @model_validator(mode="after")
    def _one_source_and_ours_apart(self) -> Volume:
        given = [t for t in VOLUME_TYPES if getattr(self, _SOURCE_FIELDS[t]) is not None]
        if len(given) != 1:
            raise ValueError(
                f"template.spec.volumes[{self.name}]: a volume needs exactly one of "
                + ", ".join(VOLUME_TYPES)
                + f", not {len(given)} (Kubernetes' in-tree volume types are reached through a "
                "persistentVolumeClaim)"
            )
        if self.name in RESERVED_VOLUMES or self.name.startswith(RESERVED_VOLUME_PREFIX):
            raise ValueError(
                f"template.spec.volumes: {self.name!r} is one of tunefleet's own volume names "
                "(" + ", ".join(RESERVED_VOLUMES) + f", {RESERVED_VOLUME_PREFIX}*): choose "
                "another name"
            )
        return self


_SOURCE_FIELDS = {(f.alias or n): n for n, f in Volume.model_fields.items() if n != "name"}
assert set(_SOURCE_FIELDS) == set(VOLUME_TYPES), _SOURCE_FIELDS


class PodSecurity(Model):
    """The part of core/v1 PodSecurityContext a tuning pod's user sets."""

    fs_group: int | None = None
    fs_group_change_policy: Literal["Always", "OnRootMismatch"] | None = None
    supplemental_groups: list[int] | None = Field(default=None, max_length=16)
    supplemental_groups_policy: Literal["Merge", "Strict"] | None = None


class TemplatePodSpec(Model):
    affinity: Passthrough | None = None
    node_selector: dict[str, Annotated[str, Field(max_length=63)]] | None = Field(
        default=None, max_length=16
    )
    priority_class_name: Name | None = None
    runtime_class_name: Name | None = None
    security_context: PodSecurity | None = None
    service_account_name: Name | None = None
    tolerations: list[Passthrough] | None = Field(default=None, max_length=16)
    volumes: list[Volume] | None = Field(default=None, max_length=12)

    @model_validator(mode="after")
    def _unique_volumes(self) -> TemplatePodSpec:
        _keys("template.spec.nodeSelector", self.node_selector)
        names = [v.name for v in self.volumes or []]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"template.spec.volumes names {', '.join(twice)} more than once")
        return self


class VolumeMount(Model):
    mount_path: str = Field(max_length=512)
    mount_propagation: Literal["Bidirectional", "HostToContainer", "None"] | None = None
    name: str = Field(max_length=63)
    read_only: bool | None = None
    recursive_read_only: str | None = Field(default=None, max_length=253)
    sub_path: str | None = Field(default=None, max_length=256)
    sub_path_expr: str | None = Field(default=None, max_length=256)

    @model_validator(mode="after")
    def _not_ours(self) -> VolumeMount:
        # normpath: '/tunefleet/../tunefleet/tools' and '//tunefleet' are the same place.
        path = posixpath.normpath("/" + self.mount_path.lstrip("/"))
        if path == RESERVED_MOUNT or path.startswith(RESERVED_MOUNT + "/"):
            raise ValueError(
                f"template.tune.volumeMounts: {self.mount_path!r} is under {RESERVED_MOUNT}/, "
                "tunefleet's own (tools, configuration, results): mount elsewhere"
            )
        return self


class EnvSource(Model):
    name: str | None = Field(default=None, max_length=253)
    optional: bool | None = None


class EnvFrom(Model):
    config_map_ref: EnvSource | None = None
    prefix: str | None = Field(default=None, max_length=128)
    secret_ref: EnvSource | None = None


class Resources(Model):
    limits: dict[str, Quantity] | None = Field(default=None, max_length=8)
    requests: dict[str, Quantity] | None = Field(default=None, max_length=8)


class TuneContainer(Model):
    env_from: list[EnvFrom] | None = Field(default=None, max_length=8)
    resources: Resources | None = None
    volume_mounts: list[VolumeMount] | None = Field(default=None, max_length=24)


class PodTemplate(Model):
    metadata: TemplateMetadata | None = None
    spec: TemplatePodSpec | None = None
    tune: TuneContainer | None = None
    shm_size: Quantity | None = None

    @property
    def volumes(self) -> list[Volume]:
        return list(self.spec.volumes or []) if self.spec else []

    @property
    def mounts(self) -> list[VolumeMount]:
        return list(self.tune.volume_mounts or []) if self.tune else []

    @model_validator(mode="after")
    def _mounts_meet_volumes(self) -> PodTemplate:
        names = {v.name for v in self.volumes}
        for mount in self.mounts:
            if mount.name not in names:
                raise ValueError(
                    f"template.tune.volumeMounts: {mount.mount_path!r} mounts volume "
                    f"{mount.name!r}, which template.spec.volumes does not have (tunefleet's "
                    "own volumes can't be mounted)"
                )
            if self.shm_size is not None and posixpath.normpath(mount.mount_path) == SHM_PATH:
                raise ValueError(
                    f"template.shmSize mounts a memory-backed {SHM_PATH}: drop the "
                    f"tune.volumeMounts entry at {SHM_PATH}, or shmSize"
                )
        paths = [m.mount_path for m in self.mounts]
        twice = sorted({p for p in paths if paths.count(p) > 1})
        if twice:
            raise ValueError(f"template.tune.volumeMounts mounts {', '.join(twice)} twice")
        return self

    def check_gpu(self, resource: str, label_key: str) -> None:
        """The GPU resource is spec.gpu's and the GPU-model selector tunefleet's: the template
        adds to them, never replaces them."""
        res = self.tune.resources if self.tune else None
        for kind in ("limits", "requests"):
            if resource in ((getattr(res, kind) if res else None) or {}):
                raise ValueError(
                    f"template.tune.resources.{kind} names {resource}, the GPU resource: "
                    "spec.gpu.count sets it"
                )
        if label_key in ((self.spec.node_selector if self.spec else None) or {}):
            raise ValueError(
                f"template.spec.nodeSelector names {label_key}, the GPU-model label: "
                "spec.gpu.models sets it (one tuning Job per model)"
            )
