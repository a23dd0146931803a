"""Pydantic models of TuningProfile's spec and status.

They mirror crds/tunefleet.io_tuningprofiles.yaml field for field (names, required fields,
enums, bounds, defaults); tests/unit/test_schema_drift.py fails when the two disagree. The
API server already enforces the schema, so the models matter for what it cannot judge and
for objects written before a schema change: they are the operator's last line of defence.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from tunefleet.api.base import DEFAULT_LABEL_KEYS, DEFAULT_RESOURCES, DNS_SUBDOMAIN
from tunefleet.api.base import Model as _Model
from tunefleet.api.pod_template import PodTemplate
from tunefleet.images import REFERENCE_PATTERN
from tuner_job import caches as cc

Vendor = Literal["amd", "nvidia"]
DType = Literal["float16", "bfloat16", "float32"]
ModelName = Annotated[str, Field(min_length=1, max_length=63)]
Arg = Annotated[str, Field(max_length=4096)]
Dim = Annotated[int, Field(ge=1, le=1048576)]
# What exec(2) and the API server take of the tune container's argv and environment.
MAX_ARGV_CHARS = 262144
MAX_ENV_VALUE_CHARS = 131072
# s3://bucket or pvc://claim, then key-safe prefix segments (storage/store.py checks the rest);
# short enough that every key derived from it fits S3's 1,024 bytes with the longest names.
STORAGE_URI_MAX = 560
# Or oci://registry[:port]/repository[#key-prefix] (storage/oci.py checks the registries' own
# length limit and says so).
_OCI_COMPONENT = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
STORAGE_URI = (
    r"^((s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]|pvc://[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)"
    r"(/[A-Za-z0-9._=-]{1,255})*/?"
    r"|oci://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?"
    rf"(/{_OCI_COMPONENT})+(#[A-Za-z0-9._=-]{{1,255}}(/[A-Za-z0-9._=-]{{1,255}})*)?)$"
)
SigningPolicy = Literal["Required", "Optional"]


class NamedRef(_Model):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)


class GpuSpec(_Model):
    vendor: Vendor
    models: list[ModelName] = Field(min_length=1, max_length=16)
    label_key: str | None = Field(default=None, min_length=1, max_length=316)
    resource_name: str | None = Field(default=None, min_length=1, max_length=253)
    count: int = Field(default=1, ge=1, le=16)
    parallelism: int = Field(default=1, ge=1, le=64)

    @model_validator(mode="after")
    def _unique_models(self) -> GpuSpec:
        if len(set(self.models)) != len(self.models):
            raise ValueError("gpu.models lists a model more than once")
        return self


class KeyRef(_Model):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    optional: bool | None = None


class FieldRef(_Model):
    api_version: str | None = Field(default=None, max_length=64)
    field_path: str = Field(min_length=1, max_length=256)


class ResourceFieldRef(_Model):
    container_name: str | None = Field(default=None, max_length=63)
    resource: str = Field(min_length=1, max_length=253)
    divisor: int | str | None = None


class EnvVarSource(_Model):
    secret_key_ref: KeyRef | None = None
    config_map_key_ref: KeyRef | None = None
    field_ref: FieldRef | None = None
    resource_field_ref: ResourceFieldRef | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvVarSource:
        given = [v for v in self.__dict__.values() if v is not None]
        if len(given) != 1:
            raise ValueError(
                "valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef, "
                "resourceFieldRef"
            )
        return self


class EnvVar(_Model):
    name: str = Field(min_length=1, max_length=256, pattern=r"^[ -<>-~]+$")
    value: str | None = Field(default=None, max_length=32768)
    value_from: EnvVarSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError("an env entry has either value or valueFrom, not both")
        return self


class Shape(_Model):
    mnk: list[Dim] = Field(min_length=3, max_length=3)
    batch: int = Field(default=1, ge=1, le=65536)
    dtype: DType = "bfloat16"
    trans_a: bool = Field(default=False, alias="transA")
    trans_b: bool = Field(default=False, alias="transB")
    bias: bool = False
    tf32: bool = False

    @model_validator(mode="after")
    def _combinations(self) -> Shape:
        if self.bias and self.batch != 1:
            raise ValueError("a shape with bias is a linear layer (addmm) and cannot be batched")
        if self.bias and self.trans_a == self.trans_b:
            raise ValueError("a shape with bias needs exactly one of transA and transB")
        if self.bias and min(self.mnk) <= 1:
            raise ValueError("a shape with bias needs M, N and K above 1")
        if self.tf32 and self.dtype != "float32":
            raise ValueError("tf32 applies to float32 GEMMs only")
        return self


class WorkloadSpec(_Model):
    command: list[Arg] | None = Field(default=None, min_length=1, max_length=64)
    args: list[Arg] | None = Field(default=None, max_length=256)
    env: list[EnvVar] | None = Field(default=None, max_length=128)
    shapes: list[Shape] | None = Field(default=None, min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _has_source(self) -> WorkloadSpec:
        if not self.command and not self.shapes:
            raise ValueError(
                "workload needs a command (run under record mode to find the GEMMs) "
                "or shapes (an explicit list of GEMMs), or both"
            )
        for var in self.env or []:
            if var.name.startswith("PYTORCH_TUNABLEOP_"):
                raise ValueError(
                    f"workload.env sets {var.name}: PYTORCH_TUNABLEOP_* variables are set "
                    "by the tuner; use spec.tuning instead"
                )
        argv = sum(len(a) for a in [*(self.command or []), *(self.args or [])])
        if argv > MAX_ARGV_CHARS:
            raise ValueError(
                f"workload.command and workload.args must be at most {MAX_ARGV_CHARS} "
                f"characters in all, not {argv}"
            )
        env = sum(len(v.value or "") for v in self.env or [])
        if env > MAX_ENV_VALUE_CHARS:
            raise ValueError(
                f"workload.env values must be at most {MAX_ENV_VALUE_CHARS} characters in all, "
                f"not {env}"
            )
        return self


class Checkpoint(_Model):
    every_gemms: int = Field(default=16, ge=1, le=4096)
    every_seconds: int = Field(default=120, ge=10, le=3600)


class TuningLimits(_Model):
    max_duration_ms: int = Field(default=30, ge=1, le=60000)
    max_iterations: int = Field(default=100, ge=1, le=100000)
    warmup_duration_ms: int = Field(default=0, ge=0, le=60000)
    warmup_iterations: int = Field(default=0, ge=0, le=100000)
    # -1: the L2 cache size (torch's default); 0: off. See naming.revision for old profiles.
    rotating_buffer_mb: int = Field(default=-1, ge=-1, le=65536, alias="rotatingBufferMB")
    numerical_check: bool = False
    cublaslt_algo_count: int = Field(default=8, ge=1, le=1024, alias="cublasltAlgoCount")
    budget_seconds: int = Field(default=3600, ge=30, le=172800)
    active_deadline_seconds: int = Field(default=7200, ge=60, le=259200)
    backoff_limit: int = Field(default=1, ge=0, le=6)
    # A Kueue LocalQueue: Jobs created suspended under it (builders/kueue.py); not shaping.
    queue_name: str | None = Field(
        default=None, min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
    )
    checkpoint: Checkpoint = Checkpoint()
    # With the operator's fleet mode on (fleet/), whether a complete, verified artifact that
    # another profile or cluster tuned for the same identity is served instead of tuning;
    # Never: this profile always tunes its own. Not shaping.
    adopt: Literal["IfAvailable", "Never"] = "IfAvailable"

    @model_validator(mode="after")
    def _deadline_after_budget(self) -> TuningLimits:
        if self.active_deadline_seconds <= self.budget_seconds:
            raise ValueError(
                "tuning.activeDeadlineSeconds must be greater than tuning.budgetSeconds, "
                "so the tuner can finish and publish before the Job is stopped"
            )
        return self


class SigningSpec(_Model):
    """Signatures of artifacts (artifacts/signing.py): of an oci:// store's bundles, of an
    object store's manifests; `secret` holds cosign's key pair; `policy` None means the
    default, Required (tunefleet never assumes an absent field)."""

    policy: SigningPolicy | None = None
    secret: NamedRef | None = None
    # The operator's own copy of cosign.pub (it reads no Secrets): with it, it verifies a
    # volume image before model pods mount it (image volumes need no fetch to check it).
    public_key: str | None = Field(
        default=None,
        max_length=4096,
        pattern=r"^\s*-----BEGIN PUBLIC KEY-----[A-Za-z0-9+/=\s]+-----END PUBLIC KEY-----\s*$",
    )


class StorageSpec(_Model):
    uri: str = Field(max_length=STORAGE_URI_MAX, pattern=STORAGE_URI)
    endpoint: str | None = Field(
        default=None, max_length=1024, pattern=r"^https?://[^\s/]+(/[^\s]*)?$"
    )
    region: str | None = Field(default=None, max_length=64)
    credentials_secret: NamedRef | None = None
    signing: SigningSpec | None = None

    @property
    def is_oci(self) -> bool:
        return self.uri.startswith("oci://")

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    @property
    def signing_policy(self) -> SigningPolicy | None:
        """Required or Optional (Required unless said) for an oci:// store, and for another
        that sets storage.signing; None for one that does not: its artifacts are unsigned."""
        if not self.is_oci and self.signing is None:
            return None
        return (self.signing.policy if self.signing else None) or "Required"

    @property
    def signing_secret(self) -> str:
        return self.signing.secret.name if self.signing and self.signing.secret else ""

    @property
    def public_key(self) -> str:
        """signing.publicKey, the profile's one public key ("" when it gives none)."""
        return (self.signing.public_key or "") if self.signing else ""


class ServingSpec(_Model):
    fail_closed: bool = False
    serve_default_only: bool = False
    delivery: Literal["ConfigMap", "Store"] = "ConfigMap"
    credentials_secret: NamedRef | None = None
    pin_image: bool = False


class PromotionSpec(_Model):
    """The gate before an artifact is served (tuner_job/gain.py judges; status.py applies)."""

    measure: bool = True
    min_gain: float = Field(default=0.0, ge=0, le=10)
    serving_mode: Literal["Eager", "CUDAGraphs"] = "Eager"
    budget_seconds: int = Field(default=600, ge=10, le=86400)


class RetuneSpec(_Model):
    misses: int | None = Field(default=None, ge=1, le=100000)
    coverage: int | None = Field(default=None, ge=1, le=100)
    min_interval_seconds: int = Field(default=3600, ge=60, le=2592000)

    @model_validator(mode="after")
    def _threshold(self) -> RetuneSpec:
        if self.misses is None and self.coverage is None:
            raise ValueError(
                "capture.retune needs misses (retune at this many new untuned shapes) or "
                "coverage (retune below this percent), or both; omit retune to retune by hand"
            )
        return self


class CaptureLimits(_Model):
    max_shapes: int = Field(default=1024, ge=1, le=4096)
    upload_interval_seconds: int = Field(default=30, ge=1, le=3600)
    max_rows_per_upload: int = Field(default=256, ge=1, le=512)


class CaptureSpec(_Model):
    enabled: bool = False
    retune: RetuneSpec | None = None
    limits: CaptureLimits = CaptureLimits()


class CacheArtifact(_Model):
    """One cache the workload fills at start (tuner_job/caches.py is the contract)."""

    kind: Literal["torchCompile", "vllm", "cache"]
    name: str | None = Field(
        default=None, max_length=40, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"
    )
    env: str | None = Field(default=None, max_length=128, pattern=r"^[A-Z_][A-Z0-9_]*$")
    file: str | None = Field(default=None, max_length=100, pattern=r"^[A-Za-z0-9._-]+$")
    max_bytes: int | None = Field(default=None, ge=1, le=68719476736)


class ArtifactsSpec(_Model):
    tunableop: bool = True
    caches: list[CacheArtifact] | None = Field(default=None, max_length=8)

    @model_validator(mode="after")
    def _caches_make_sense(self) -> ArtifactsSpec:
        try:
            specs = self.cache_specs()
            cc.check_unique(specs)
        except cc.CacheError as exc:
            raise ValueError(f"spec.artifacts.caches: {exc}") from None
        if not self.tunableop and not specs:
            raise ValueError(
                "spec.artifacts: tunableop is false and no caches are listed: nothing to tune"
            )
        return self

    def cache_specs(self) -> tuple[cc.CacheSpec, ...]:
        return tuple(
            cc.spec(c.kind, c.name or "", c.env or "", c.file or "", c.max_bytes or 0)
            for c in self.caches or []
        )


class TuningProfileSpec(_Model):
    image: str = Field(min_length=1, max_length=512, pattern=REFERENCE_PATTERN)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[NamedRef] | None = Field(default=None, max_length=16)
    gpu: GpuSpec
    workload: WorkloadSpec
    tuning: TuningLimits = TuningLimits()
    storage: StorageSpec
    serving: ServingSpec = ServingSpec()
    promotion: PromotionSpec = PromotionSpec()
    capture: CaptureSpec = CaptureSpec()
    template: PodTemplate | None = None
    artifacts: ArtifactsSpec = ArtifactsSpec()

    @model_validator(mode="after")
    def _caches_are_not_sharded(self) -> TuningProfileSpec:
        if self.artifacts.caches and self.gpu.parallelism > 1:
            raise ValueError(
                "spec.artifacts.caches with spec.gpu.parallelism > 1: the merge Job combines "
                "TunableOp rows, not caches; tune caches with parallelism 1"
            )
        return self

    @model_validator(mode="after")
    def _template_adds_to_the_gpu(self) -> TuningProfileSpec:
        if self.template is not None:
            self.template.check_gpu(
                self.gpu.resource_name or DEFAULT_RESOURCES[self.gpu.vendor],
                self.gpu.label_key or DEFAULT_LABEL_KEYS[self.gpu.vendor],
            )
        return self


# --- status -------------------------------------------------------------------------------


class Condition(_Model):
    """Shaped like metav1.Condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str
    last_transition_time: str
    observed_generation: int | None = None


class CaptureRetune(_Model):
    base_revision: str
    digest: str
    revision: str
    shapes: int | None = None
    reason: str | None = None
    requested_at: str | None = None
    config_map: str | None = None
    nonce: str | None = None
    state: str | None = None


class CaptureApart(_Model):
    stores: int | None = None
    seen: int | None = None


class PodCacheLoad(_Model):
    name: str
    path: str
    key: str | None = None
    reason: str | None = None


class CacheLoads(_Model):
    """status.capture[].caches[]: which path a served cache took in the pods that reported."""

    kind: str
    loaded: int | None = None
    recompiled: int | None = None
    missed: int | None = None
    empty: int | None = None
    missed_keys: list[str] | None = Field(default=None, max_length=8)
    message: str | None = None
    pods: list[PodCacheLoad] | None = Field(default=None, max_length=16)


class CaptureStatus(_Model):
    """status.capture[]: production misses of one GPU model (capture/loop.py)."""

    gpu_model: str
    identity: str | None = None
    seen: int | None = None
    tuned: int | None = None
    untuned: int | None = None
    coverage: int | None = None
    last_capture: str | None = None
    dropped: int | None = None
    not_loaded_pods: int | None = None
    caches: list[CacheLoads] | None = Field(default=None, max_length=4)
    apart: CaptureApart | None = None
    retune: CaptureRetune | None = None
    handled_nonce: str | None = None
    message: str | None = None
