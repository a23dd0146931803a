"""What tuner_job uses of torch.cuda.tunable and of TunableOp's environment, in one table, and
how the profile's tuning settings reach TunableOp (stdlib only; torch is passed in).

tests/conformance/test_contract.py checks every entry against the real wheels (torch 2.11.0
and the newest release: the functions exist with these parameters, the variables are among the
names torch's libraries read) and that tuner_job and scripts/gpu_check.py use nothing else.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from .config import DEFAULT_ALGO_COUNT, Limits
from .library import Settings

# torch.cuda.tunable functions: name -> (the parameters we pass, by name, in order; the first
# release that has it). Calls of functions newer than 2.11 are guarded by hasattr.
API: dict[str, tuple[tuple[str, ...], tuple[int, int]]] = {
    "enable": (("val",), (2, 11)),
    "is_enabled": ((), (2, 11)),
    "tuning_is_enabled": ((), (2, 11)),
    "tuning_enable": (("val",), (2, 11)),
    "record_untuned_enable": (("val",), (2, 11)),
    "set_max_tuning_duration": (("duration",), (2, 11)),
    "set_max_tuning_iterations": (("iterations",), (2, 11)),
    "set_filename": (("filename", "insert_device_ordinal"), (2, 11)),
    "get_filename": ((), (2, 11)),
    "get_results": ((), (2, 11)),
    "get_validators": ((), (2, 11)),
    "read_file": (("filename",), (2, 11)),
    "tune_gemm_in_file": (("filename",), (2, 11)),
    "set_rotating_buffer_size": (("buffer_size",), (2, 11)),
    "get_rotating_buffer_size": ((), (2, 11)),
    "set_numerical_check_tolerances": (("enable", "atol", "rtol"), (2, 11)),
    "set_cublaslt_requested_algo_count": (("count",), (2, 14)),
    "get_cublaslt_requested_algo_count": ((), (2, 14)),
}
# PYTORCH_TUNABLEOP_* variables we set or clear: name -> first release that reads it.
ENV: dict[str, tuple[int, int]] = {
    "PYTORCH_TUNABLEOP_ENABLED": (2, 11),
    "PYTORCH_TUNABLEOP_TUNING": (2, 11),
    "PYTORCH_TUNABLEOP_RECORD_UNTUNED": (2, 11),
    "PYTORCH_TUNABLEOP_FILENAME": (2, 11),
    "PYTORCH_TUNABLEOP_UNTUNED_FILENAME": (2, 11),
    "PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS": (2, 11),
    "PYTORCH_TUNABLEOP_MAX_TUNING_ITERATIONS": (2, 11),
    "PYTORCH_TUNABLEOP_MAX_WARMUP_DURATION_MS": (2, 11),
    "PYTORCH_TUNABLEOP_MAX_WARMUP_ITERATIONS": (2, 11),
    "PYTORCH_TUNABLEOP_ROTATING_BUFFER_SIZE": (2, 11),
    "PYTORCH_TUNABLEOP_NUMERICAL_CHECK": (2, 11),
    "PYTORCH_TUNABLEOP_CUBLASLT_REQUESTED_ALGO_COUNT": (2, 14),
    "PYTORCH_TUNABLEOP_VERBOSE": (2, 11),
    "PYTORCH_TUNABLEOP_BLAS_LOG": (2, 11),  # the user's to set; results.py reads its tail
    "PYTORCH_TUNABLEOP_VERBOSE_FILENAME": (2, 11),
}

# numericalCheck: true means "reject solutions whose output differs from the default GEMM".
# 1e-2 lets half-precision GEMMs that merely sum in another order pass (torch's default 1e-5
# would keep only the default solution for bf16). torch refuses tolerances that are not > 0.
NUMERICAL_ATOL = 1e-2
NUMERICAL_RTOL = 1e-2

# Settings the tuner owns in the tuning processes: the user's values for them (env vars win over
# the Python API) are dropped so the profile decides. Library selection and logging are kept.
OWNED_ENV = (
    "PYTORCH_TUNABLEOP_ENABLED",
    "PYTORCH_TUNABLEOP_TUNING",
    "PYTORCH_TUNABLEOP_RECORD_UNTUNED",
    "PYTORCH_TUNABLEOP_FILENAME",
    "PYTORCH_TUNABLEOP_UNTUNED_FILENAME",
    "PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS",
    "PYTORCH_TUNABLEOP_MAX_TUNING_ITERATIONS",
    "PYTORCH_TUNABLEOP_MAX_WARMUP_DURATION_MS",
    "PYTORCH_TUNABLEOP_MAX_WARMUP_ITERATIONS",
    "PYTORCH_TUNABLEOP_ROTATING_BUFFER_SIZE",
    "PYTORCH_TUNABLEOP_NUMERICAL_CHECK",
    "PYTORCH_TUNABLEOP_CUBLASLT_REQUESTED_ALGO_COUNT",
)

Log = Callable[[str], None]


def settings_of(limits: Limits, applied: dict[str, Any]) -> Settings:
    """The settings a run tunes with, as its library entries record them. The algorithm count
    is what torch reported back (None where it has no cuBLASLt candidates)."""
    count = applied.get("cublasltAlgoCount")
    return Settings(
        max_duration_ms=limits.max_duration_ms,
        max_iterations=limits.max_iterations,
        warmup_duration_ms=limits.warmup_duration_ms,
        warmup_iterations=limits.warmup_iterations,
        rotating_buffer_mb=limits.rotating_buffer_mb,
        numerical_check=limits.numerical_check,
        atol=NUMERICAL_ATOL,
        rtol=NUMERICAL_RTOL,
        cublaslt_algo_count=int(count) if count is not None else None,
    )


def check_tolerances(atol: float, rtol: float) -> None:
    """As torch checks them (Tunable.cpp): both must be > 0 (NaN is refused, inf is not)."""
    for name, value in (("atol", atol), ("rtol", rtol)):
        if math.isnan(value) or value <= 0:
            raise ValueError(
                f"numerical check tolerance {name}={value} must be positive (torch refuses it)"
            )


def apply_limits(tunable: Any, limits: Limits, log: Log) -> dict[str, Any]:
    """The profile's settings, through the Python API where this torch has it and environment
    variables for what it lacks (nothing in this process has used TunableOp yet, so variables
    set now are still read). Returns what TunableOp reports back (clamped values)."""
    applied: dict[str, Any] = {}
    tunable.set_max_tuning_duration(limits.max_duration_ms)
    tunable.set_max_tuning_iterations(limits.max_iterations)
    # No Python API for the warm-up limits in 2.11 or 2.15.
    os.environ["PYTORCH_TUNABLEOP_MAX_WARMUP_DURATION_MS"] = str(limits.warmup_duration_ms)
    os.environ["PYTORCH_TUNABLEOP_MAX_WARMUP_ITERATIONS"] = str(limits.warmup_iterations)
    # -1: the L2 cache size (torch's own default), 0: off, N: N MiB.
    tunable.set_rotating_buffer_size(limits.rotating_buffer_mb)
    check_tolerances(NUMERICAL_ATOL, NUMERICAL_RTOL)
    if hasattr(tunable, "set_numerical_check_tolerances"):
        tunable.set_numerical_check_tolerances(
            limits.numerical_check, NUMERICAL_ATOL, NUMERICAL_RTOL
        )
    else:  # torch before the tolerances API reads only the switch
        os.environ["PYTORCH_TUNABLEOP_NUMERICAL_CHECK"] = "1" if limits.numerical_check else "0"
    if hasattr(tunable, "set_cublaslt_requested_algo_count"):
        tunable.set_cublaslt_requested_algo_count(limits.cublaslt_algo_count)
        applied["cublasltAlgoCount"] = int(tunable.get_cublaslt_requested_algo_count())
    elif limits.cublaslt_algo_count != DEFAULT_ALGO_COUNT:
        log(
            "warning: tuning.cublasltAlgoCount is ignored: this torch has no cuBLASLt candidates "
            "(CUDA torch before 2.14, or ROCm)"
        )
    return applied
