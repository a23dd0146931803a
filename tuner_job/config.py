"""The tuning configuration the operator hands the tune container (TUNEFLEET_TUNING_CONFIG)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .caches import CacheError, CacheSpec
from .caches import from_config as caches_from_config
from .manifest import ArtifactId

ENV_VAR = "TUNEFLEET_TUNING_CONFIG"
# An Indexed Job gives each pod its index here; the pod tunes that share of the GEMMs.
SHARD_ENV = "JOB_COMPLETION_INDEX"
MAX_SHARDS = 1024
DEFAULT_EXCHANGE_WAIT_S = 300.0

# torch dtype names a shape may use; float8 ones go through torch._scaled_mm.
SHAPE_DTYPES = (
    "bfloat16",
    "float16",
    "half",
    "float32",
    "float",
    "float64",
    "double",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
)


DEFAULT_ALGO_COUNT = 8  # torch 2.14+'s default cuBLASLt heuristic count


class ConfigError(ValueError):
    """The tuning configuration is missing or malformed."""


FLOAT32_NAMES = ("float32", "float")


@dataclass(frozen=True)
class Shape:
    """One GEMM of the profile: C (m x n) = A (m x k) @ B (k x n), in the user's terms.

    ``trans_a``/``trans_b``: the operand is a transposed (column-major) view, as ``x @ W.t()`` is
    for B. ``batch > 1``: ``torch.bmm``. ``bias``: ``torch.addmm(bias, A, B)`` with a 1-D bias of
    n elements, what ``nn.Linear`` runs (TunableOp's GemmAndBias). ``tf32``: a float32 GEMM run
    with ``torch.backends.cuda.matmul.allow_tf32`` set (TunableOp names it ``tf32``, not
    ``float``). float8 dtypes: ``torch._scaled_mm`` (per-tensor scales, bfloat16 output).
    """

    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "bfloat16"
    trans_a: bool = False
    trans_b: bool = False
    bias: bool = False
    tf32: bool = False

    def describe(self) -> str:
        flags = [f"transA={str(self.trans_a).lower()}", f"transB={str(self.trans_b).lower()}"]
        flags += [name for name, on in (("bias", self.bias), ("tf32", self.tf32)) if on]
        return f"m={self.m} n={self.n} k={self.k} batch={self.batch} {self.dtype} " + " ".join(
            flags
        )


@dataclass(frozen=True)
class Limits:
    max_duration_ms: int = 30
    max_iterations: int = 100
    warmup_duration_ms: int = 0
    warmup_iterations: int = 0
    # TunableOp's rotating buffer in MiB: -1 the GPU's L2 cache size (torch's default), 0 off.
    rotating_buffer_mb: int = -1
    numerical_check: bool = False
    budget_seconds: float = 3600.0
    # PYTORCH_TUNABLEOP_CUBLASLT_REQUESTED_ALGO_COUNT (torch 2.14+ on CUDA; torch's default 8).
    cublaslt_algo_count: int = DEFAULT_ALGO_COUNT


@dataclass(frozen=True)
class Promotion:
    """What to measure after tuning (tuner_job/measure.py): absent from a config, nothing (every
    config before the gate)."""

    measure: bool = False
    mode: str = "Eager"  # Eager | CUDAGraphs: how serving pods run the GEMMs
    budget_seconds: float = 0.0


@dataclass(frozen=True)
class TuningConfig:
    namespace: str = ""
    profile: str = ""
    gpu_model: str = ""
    revision: str = ""
    gpus: int = 1
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    shapes: tuple[Shape, ...] = ()
    limits: Limits = field(default_factory=Limits)
    shards: int = 1
    # Untuned files (TunableOp's OpSig,ParamSig rows) tuned besides what the workload records:
    # a retune's captured production misses (the operator mounts them).
    untuned_files: tuple[str, ...] = ()
    # The directory shared with the tunefleet-sync sidecar; "" for a standalone run (no waiting,
    # nothing reused, no progress written).
    exchange_dir: str = ""
    exchange_wait_s: float = DEFAULT_EXCHANGE_WAIT_S
    # What the run produces (the profile's spec.artifacts): TunableOp results unless told
    # not, and the caches its workload fills (tuner_job/caches.py).
    tunableop: bool = True
    caches: tuple[CacheSpec, ...] = ()
    promotion: Promotion = field(default_factory=Promotion)

    @property
    def artifact_id(self) -> ArtifactId:
        return ArtifactId(self.namespace, self.profile, self.revision, self.gpu_model)

    @property
    def workload_argv(self) -> list[str]:
        return [*self.command, *self.args] if self.command else []

    def require_identity(self) -> None:
        missing = [
            name
            for name, value in (
                ("namespace", self.namespace),
                ("profile", self.profile),
                ("gpuModel", self.gpu_model),
                ("revision", self.revision),
            )
            if not value
        ]
        if missing:
            raise ConfigError("tuning config lacks " + ", ".join(missing))

    def shard_index(self, environ: Mapping[str, str] | None = None) -> int:
        """This pod's share, from $JOB_COMPLETION_INDEX (0 when unset)."""
        raw = (os.environ if environ is None else environ).get(SHARD_ENV, "").strip()
        if not raw:
            return 0
        if not raw.isdigit() or int(raw) >= self.shards:
            raise ConfigError(
                f"{SHARD_ENV}={raw!r} is not a shard index 0..{self.shards - 1} "
                f"(the config says shards: {self.shards})"
            )
        return int(raw)

    def require_workload(self) -> None:
        if not self.command and not self.shapes:
            raise ConfigError("tuning config has neither workload.command nor workload.shapes")
        if not self.tunableop and not self.command:
            raise ConfigError(
                "caches are filled by the workload: artifacts without tunableop need "
                "workload.command"
            )


def _get(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = doc.get(key)
    if value is None:
        return None
    # bool is an int in Python; a JSON true where a number belongs is a mistake, not a 1.
    if isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"{where}.{key} must be {_kind_name(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(f"{where}.{key} must be {_kind_name(kind)}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {"str": "a string", "int": "an integer", "float": "a number"}.get(k.__name__, k.__name__)
        for k in kinds
    )


def _str_list(doc: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = _get(doc, key, list, where)
    if value is None:
        return ()
    if not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}.{key} must be a list of strings")
    return tuple(value)


def _nonneg_int(doc: dict[str, Any], key: str, default: int, where: str) -> int:
    value = _get(doc, key, int, where)
    if value is None:
        return default
    if value < 0:
        raise ConfigError(f"{where}.{key} must be >= 0, got {value}")
    return int(value)


def _rotating(tuning: dict[str, Any]) -> int:
    value = _get(tuning, "rotatingBufferMB", int, "tuning")
    if value is None:
        return -1
    if value < -1:
        raise ConfigError(
            f"tuning.rotatingBufferMB must be -1 (L2 size), 0 (off) or MiB, got {value}"
        )
    return int(value)


def _algo_count(tuning: dict[str, Any]) -> int:
    value = _get(tuning, "cublasltAlgoCount", int, "tuning")
    if value is None:
        return DEFAULT_ALGO_COUNT
    if value < 1:
        raise ConfigError(f"tuning.cublasltAlgoCount must be >= 1, got {value}")
    return int(value)


def _shape(doc: Any, i: int) -> Shape:
    where = f"workload.shapes[{i}]"
    if not isinstance(doc, dict):
        raise ConfigError(f"{where} must be an object")
    dims = {}
    for key in ("m", "n", "k"):
        value = _get(doc, key, int, where)
        if value is None or value < 1:
            raise ConfigError(f"{where}.{key} must be an integer >= 1")
        dims[key] = value
    batch = _get(doc, "batch", int, where)
    if batch is not None and batch < 1:
        raise ConfigError(f"{where}.batch must be >= 1")
    dtype = _get(doc, "dtype", str, where) or "bfloat16"
    if dtype not in SHAPE_DTYPES:
        raise ConfigError(f"{where}.dtype {dtype!r} is not one of {', '.join(SHAPE_DTYPES)}")
    trans_a = bool(_get(doc, "transA", bool, where) or False)
    trans_b = bool(_get(doc, "transB", bool, where) or False)
    bias = bool(_get(doc, "bias", bool, where) or False)
    tf32 = bool(_get(doc, "tf32", bool, where) or False)
    shape = Shape(dims["m"], dims["n"], dims["k"], batch or 1, dtype, trans_a, trans_b, bias, tf32)
    why = _unroutable(shape)
    if why:
        raise ConfigError(f"{where} ({shape.describe()}): {why}")
    return shape


def _unroutable(s: Shape) -> str | None:
    """Why torch would not run this shape through TunableOp as described, on any GPU."""
    if s.tf32 and s.dtype not in FLOAT32_NAMES:
        return "tf32 applies to float32 GEMMs only (it lets cuBLAS/hipBLASLt use TF32 for them)"
    if s.dtype.startswith("float8"):
        if s.trans_a or not s.trans_b:
            # torch._scaled_mm only takes row-major A and column-major B.
            return "float8 GEMMs need transA=false and transB=true"
        if s.batch != 1:
            return "float8 GEMMs cannot be batched"
        if s.k % 16 or s.n % 16:
            return "torch._scaled_mm needs k and n divisible by 16"
        return None
    if s.bias:
        if s.batch != 1:
            return (
                "bias needs batch 1: torch has no batched GEMM with a bias (nn.Linear on a "
                "(b, s, k) input runs one (b*s, k) GEMM: give m = b*s)"
            )
        if s.trans_a == s.trans_b:
            return (
                "bias needs exactly one of transA/transB (nn.Linear is transA=false, "
                "transB=true): torch's offline tuner refuses a GemmAndBias GEMM with both or "
                "neither transposed"
            )
        if 1 in (s.m, s.n, s.k):
            return (
                "bias needs m, n and k > 1: addmm takes the cuBLASLt/hipBLASLt bias path only "
                "when both matrices have more than one row and column (else it is a plain GEMM)"
            )
    return None


def from_dict(doc: Any) -> TuningConfig:
    if not isinstance(doc, dict):
        raise ConfigError("tuning config must be a JSON object")
    workload = _get(doc, "workload", dict, "config") or {}
    tuning = _get(doc, "tuning", dict, "config") or {}
    shapes_doc = _get(workload, "shapes", list, "workload") or []
    budget = _get(tuning, "budgetSeconds", (int, float), "tuning")
    if budget is not None and budget <= 0:
        raise ConfigError("tuning.budgetSeconds must be > 0")
    numerical = _get(tuning, "numericalCheck", bool, "tuning")
    limits = Limits(
        max_duration_ms=_nonneg_int(tuning, "maxDurationMs", 30, "tuning"),
        max_iterations=_nonneg_int(tuning, "maxIterations", 100, "tuning"),
        warmup_duration_ms=_nonneg_int(tuning, "warmupDurationMs", 0, "tuning"),
        warmup_iterations=_nonneg_int(tuning, "warmupIterations", 0, "tuning"),
        rotating_buffer_mb=_rotating(tuning),
        numerical_check=bool(numerical) if numerical is not None else False,
        budget_seconds=float(budget) if budget is not None else 3600.0,
        cublaslt_algo_count=_algo_count(tuning),
    )
    gpus = _get(doc, "gpus", int, "config")
    if gpus is not None and gpus < 1:
        raise ConfigError("config.gpus must be >= 1")
    shards = _get(doc, "shards", int, "config")
    if shards is not None and not 1 <= shards <= MAX_SHARDS:
        raise ConfigError(f"config.shards must be 1..{MAX_SHARDS}, got {shards}")
    exchange = _get(doc, "exchange", dict, "config") or {}
    exchange_dir = _get(exchange, "dir", str, "exchange") or ""
    if exchange and not exchange_dir.startswith("/"):
        raise ConfigError("exchange.dir must be an absolute path")
    wait = _get(exchange, "waitSeconds", (int, float), "exchange")
    if wait is not None and wait < 0:
        raise ConfigError("exchange.waitSeconds must be >= 0")
    untuned_files = _str_list(workload, "untunedFiles", "workload")
    for path in untuned_files:
        if not path.startswith("/"):
            raise ConfigError(f"workload.untunedFiles: {path!r} must be an absolute path")
    command = _str_list(workload, "command", "workload")
    args = _str_list(workload, "args", "workload")
    if args and not command:
        raise ConfigError("workload.args given without workload.command")
    tunableop, caches = _artifacts(_get(doc, "artifacts", dict, "config"))
    return TuningConfig(
        promotion=_promotion(_get(doc, "promotion", dict, "config")),
        tunableop=tunableop,
        caches=caches,
        namespace=_get(doc, "namespace", str, "config") or "",
        profile=_get(doc, "profile", str, "config") or "",
        gpu_model=_get(doc, "gpuModel", str, "config") or "",
        revision=_get(doc, "revision", str, "config") or "",
        gpus=gpus or 1,
        command=command,
        args=args,
        shapes=tuple(_shape(s, i) for i, s in enumerate(shapes_doc)),
        limits=limits,
        shards=shards or 1,
        untuned_files=untuned_files,
        exchange_dir=exchange_dir,
        exchange_wait_s=float(wait) if wait is not None else DEFAULT_EXCHANGE_WAIT_S,
    )


def _promotion(doc: dict[str, Any] | None) -> Promotion:
    if doc is None:
        return Promotion()
    mode = _get(doc, "servingMode", str, "promotion") or "Eager"
    if mode not in ("Eager", "CUDAGraphs"):
        raise ConfigError(f"promotion.servingMode must be Eager or CUDAGraphs, got {mode!r}")
    budget = _get(doc, "budgetSeconds", (int, float), "promotion")
    if budget is not None and budget < 0:
        raise ConfigError("promotion.budgetSeconds must be >= 0")
    measure = _get(doc, "measure", bool, "promotion")
    return Promotion(bool(measure), mode, float(budget or 0))


def _artifacts(doc: dict[str, Any] | None) -> tuple[bool, tuple[CacheSpec, ...]]:
    """(TunableOp results wanted, caches): absent, TunableOp results alone (every config
    before caches)."""
    if doc is None:
        return True, ()
    tunableop = _get(doc, "tunableop", bool, "artifacts")
    try:
        caches = caches_from_config(doc.get("caches"))
    except CacheError as exc:
        raise ConfigError(str(exc)) from None
    wanted = True if tunableop is None else bool(tunableop)
    if not wanted and not caches:
        raise ConfigError("artifacts: neither tunableop nor any cache: nothing to produce")
    return wanted, caches


def load(path: str | None) -> TuningConfig:
    """From --config FILE, else from $TUNEFLEET_TUNING_CONFIG."""
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        source = path
    else:
        env = os.environ.get(ENV_VAR)
        if not env:
            raise ConfigError(f"no tuning config: pass --config FILE or set {ENV_VAR}")
        text, source = env, ENV_VAR
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source} is not JSON: {exc}") from None
    return from_dict(doc)
