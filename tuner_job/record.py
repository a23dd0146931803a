"""Record the GEMMs a workload runs, as TunableOp's own untuned files.

Two sources, either or both: the user's workload command, run with TunableOp in record mode,
or an explicit shape list, whose matmuls run here under record mode. Either way torch writes the
signatures itself; the tuner never makes one up.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._proc import end_group, kill_group
from .config import Shape
from .gpu import EXIT_USAGE, TunerError
from .results import (
    UntunedFile,
    UntunedRow,
    parse_op_signature,
    parse_param_signature,
    read_untuned,
)

# TunableOp inserts the device ordinal before the last '.', so "workload_untuned.csv" becomes
# workload_untuned0.csv, workload_untuned1.csv, ... one per GPU the workload touched.
WORKLOAD_BASENAME = "workload_untuned.csv"
SHAPES_BASENAME = "shapes_untuned.csv"
_UNTUNED_RE = re.compile(r"^(workload|shapes)_untuned\d+\.csv$")

Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(f"tuner_job: {msg}", file=sys.stderr, flush=True)


def record_env(record_dir: Path, basename: str) -> dict[str, str]:
    source = basename.split("_", 1)[0]
    return {
        "PYTORCH_TUNABLEOP_ENABLED": "1",
        "PYTORCH_TUNABLEOP_TUNING": "0",
        "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "1",
        "PYTORCH_TUNABLEOP_UNTUNED_FILENAME": str(record_dir / basename),
        # A fresh results path: nothing stale is looked up, nothing of the user's is touched.
        "PYTORCH_TUNABLEOP_FILENAME": str(record_dir / f"unused-results-{source}%d.csv"),
    }


def record_workload(
    argv: Sequence[str],
    record_dir: Path,
    timeout_s: float,
    log: Log = _log,
    extra_env: Mapping[str, str] | None = None,
) -> None:
    """Run the user's command (with the container's env) under TunableOp record mode;
    extra_env: the caches' locations (tuner_job/caches.py)."""
    env = {**record_env(record_dir, WORKLOAD_BASENAME), **(extra_env or {})}
    log(f"recording: {shlex.join(argv)}")
    run_workload(argv, env, timeout_s, log)


class WorkloadExited(TunerError):
    """The workload ran and exited non-zero (a crash is a negative status: the signal)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class WorkloadTimedOut(TunerError):
    """The workload outlived its time and was stopped (its process group ended): measuring
    tells a hang with the artifact from a hang without it by this, not by the message."""

    def __init__(self, timeout_s: float, message: str) -> None:
        super().__init__(message)
        self.timeout_s = timeout_s


def run_workload(
    argv: Sequence[str], env: Mapping[str, str], timeout_s: float, log: Log = _log
) -> None:
    """Run the user's command with the container's environment plus `env`, within the budget;
    WorkloadExited if it fails, WorkloadTimedOut if it outlives it, TunerError if it cannot
    start."""
    full = {**os.environ, **env}
    try:
        # Its own session, so a timeout can stop every process the workload started; its
        # stdout goes to our stderr so our stdout stays one summary line.
        proc = subprocess.Popen(list(argv), env=full, start_new_session=True, stdout=sys.stderr)
    except OSError as exc:
        raise TunerError(f"cannot start workload command {argv[0]!r}: {exc.strerror}") from None
    allowed = max(timeout_s, 1.0)
    try:
        rc = proc.wait(timeout=allowed)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise WorkloadTimedOut(
            allowed,
            f"workload command did not exit within the {timeout_s:.0f}s tuning budget: "
            f"{shlex.join(argv)}",
        ) from None
    except BaseException:
        kill_group(proc)
        raise
    # What the workload left running in its group (a server's workers, a data loader) may hold
    # GPU memory that tuning needs: it ends here, with the workload.
    if end_group(proc.pid):
        log("ended the processes the workload left running in its process group")
    if rc != 0:
        raise WorkloadExited(rc, f"workload command exited with status {rc}: {shlex.join(argv)}")


_DTYPES = {
    "half": "float16",
    "float": "float32",
    "double": "float64",
}
# TunableOp's TypeName for each dtype (TunableGemm.h); float32 is "tf32" while TF32 is allowed.
_TYPE_NAMES = {
    "bfloat16": "BFloat16",
    "float16": "Half",
    "float32": "float",
    "float64": "double",
    "float8_e4m3fn": "Float8_e4m3fn",
    "float8_e5m2": "Float8_e5m2",
    "float8_e4m3fnuz": "Float8_e4m3fnuz",
    "float8_e5m2fnuz": "Float8_e5m2fnuz",
}
# The release whose CUDA build first routes torch._scaled_mm through TunableOp, if any: up to
# 2.13 ScaledBlas.cpp calls TunableOp for it on ROCm only.
_SCALED_MM_TUNABLE_ON_CUDA = (2, 14)


def _canonical(dtype: str) -> str:
    return _DTYPES.get(dtype, dtype)


def torch_release(torch: Any) -> tuple[int, int]:
    """(major, minor) of torch.__version__ ("2.11.0+cu130" -> (2, 11)); (0, 0) if unreadable."""
    m = re.match(r"^(\d+)\.(\d+)", str(getattr(torch, "__version__", "")))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def check_shapes(torch: Any, shapes: Sequence[Shape], log: Log = _log) -> None:
    """Refuse, before anything is recorded, the shapes this torch cannot run through TunableOp.

    What no GPU could do is refused with the configuration (config.py); this is what depends on
    the build at hand (CUDA or ROCm, its version, DISABLE_ADDMM_CUDA_LT).
    """
    rocm = bool(getattr(torch.version, "hip", None))
    version = str(getattr(torch, "__version__", "?"))
    for i, shape in enumerate(shapes):
        dtype = _canonical(shape.dtype)
        why = None
        if dtype.startswith("float8") and not rocm:
            if dtype.endswith("fnuz"):
                why = (
                    f"{dtype} is a ROCm-only float8 type (the fnuz encoding of MI300-class "
                    "GPUs); CUDA has no GEMM for it"
                )
            elif dtype == "float8_e5m2":
                why = (
                    "torch._scaled_mm on CUDA refuses e5m2 x e5m2 (cuBLASLt: 'Multiplication of "
                    "two Float8_e5m2 matrices is not supported'); use float8_e4m3fn"
                )
            elif torch_release(torch) < _SCALED_MM_TUNABLE_ON_CUDA:
                why = (
                    f"torch {version} on CUDA runs torch._scaled_mm without TunableOp (only its "
                    "ROCm build routes float8 GEMMs through ScaledGemmTunableOp), so there is "
                    "nothing to record or tune; drop the shape, or tune it on ROCm"
                )
            else:
                log(
                    f"warning: workload.shapes[{i}] ({shape.describe()}): torch {version} may "
                    "or may not route torch._scaled_mm through TunableOp on CUDA; what it "
                    "records is checked after recording"
                )
        if shape.bias and why is None:
            if os.environ.get("DISABLE_ADDMM_CUDA_LT") == "1":
                why = (
                    "DISABLE_ADDMM_CUDA_LT=1 is set, so addmm never takes the bias "
                    "(GemmAndBias) path; unset it or drop bias"
                )
            elif rocm and dtype == "float64":
                why = (
                    "on ROCm addmm takes the hipBLASLt bias (GemmAndBias) path for float32, "
                    "float16 and bfloat16 only; a float64 biased GEMM is a plain GEMM: drop bias"
                )
        if why:
            raise TunerError(f"workload.shapes[{i}] ({shape.describe()}): {why}", EXIT_USAGE)


def _operands(torch: Any, shape: Shape, dtype: Any, dev: str) -> tuple[Any, Any]:
    """A (m x k) and B (k x n), each row-major or a transposed (column-major) view."""
    m, n, k = shape.m, shape.n, shape.k
    if shape.batch > 1:
        b = shape.batch
        a = (
            torch.rand(b, k, m, dtype=dtype, device=dev).transpose(1, 2)
            if shape.trans_a
            else torch.rand(b, m, k, dtype=dtype, device=dev)
        )
        bb = (
            torch.rand(b, n, k, dtype=dtype, device=dev).transpose(1, 2)
            if shape.trans_b
            else torch.rand(b, k, n, dtype=dtype, device=dev)
        )
        return a, bb
    a = (
        torch.rand(k, m, dtype=dtype, device=dev).t()
        if shape.trans_a
        else torch.rand(m, k, dtype=dtype, device=dev)
    )
    bb = (
        torch.rand(n, k, dtype=dtype, device=dev).t()
        if shape.trans_b
        else torch.rand(k, n, dtype=dtype, device=dev)
    )
    return a, bb


def shape_gemm(torch: Any, shape: Shape, dev: str = "cuda") -> Callable[[], Any]:
    """The shape's GEMM as torch runs it, over operands made once: recording calls it once,
    measuring (tuner_job/measure.py) calls it pass after pass."""
    dtype = getattr(torch, _canonical(shape.dtype))
    m, n, k = shape.m, shape.n, shape.k
    if shape.dtype.startswith("float8"):
        # _scaled_mm: A row-major (m, k), B column-major (k, n), per-tensor scales.
        a = torch.rand(m, k, device=dev).to(dtype)
        bt = torch.rand(n, k, device=dev).to(dtype).t()
        one = torch.tensor(1.0, device=dev)
        bias = torch.rand(n, dtype=torch.bfloat16, device=dev) if shape.bias else None
        return lambda: torch._scaled_mm(
            a, bt, scale_a=one, scale_b=one, bias=bias, out_dtype=torch.bfloat16
        )
    a, bb = _operands(torch, shape, dtype, dev)
    if shape.batch > 1:
        return lambda: torch.bmm(a, bb)
    if shape.bias:
        # What nn.Linear runs for a 2-D input: addmm with a 1-D bias (Blas.cpp's Lt path).
        vector = torch.rand(n, dtype=dtype, device=dev)
        return lambda: torch.addmm(vector, a, bb)
    return lambda: torch.mm(a, bb)


def _run_shape(torch: Any, shape: Shape) -> None:
    shape_gemm(torch, shape)()


def _expected(shape: Shape) -> tuple[str, str]:
    """(family, TunableOp type name) that torch records for a shape."""
    dtype = _canonical(shape.dtype)
    if dtype.startswith("float8"):
        t = _TYPE_NAMES[dtype]
        return "ScaledGemm", f"{t}_{t}_BFloat16"
    family = "GemmStridedBatched" if shape.batch > 1 else "GemmAndBias" if shape.bias else "Gemm"
    return family, "tf32" if shape.tf32 else _TYPE_NAMES[dtype]


def verify_recorded(shapes: Sequence[Shape], rows: Sequence[UntunedRow]) -> None:
    """Every shape left the row the profile describes: family, type (tf32 or float) and size.

    cuBLAS's m and n are the product's n and m (and may not be for degenerate sizes), so sizes
    are compared as a multiset; layouts are not compared for the same reason.
    """
    seen: list[tuple[str, str, tuple[int, ...], int | None]] = []
    for row in rows:
        op = parse_op_signature(row.op)
        p = parse_param_signature(row.params, op)
        dims = tuple(sorted(d for d in (p.m, p.n, p.k) if d is not None))
        seen.append((op.family, op.types, dims, p.batch))
    for i, shape in enumerate(shapes):
        family, type_name = _expected(shape)
        dims = tuple(sorted((shape.m, shape.n, shape.k)))
        batch = shape.batch if family == "GemmStridedBatched" else None
        if (family, type_name, dims, batch) in seen:
            continue
        same_size = sorted({f"{f}TunableOp_{t}" for f, t, d, b in seen if d == dims})
        got = ", ".join(same_size) if same_size else "nothing of that size"
        hint = ""
        if shape.tf32:
            hint = (
                "; TunableOp names float32 GEMMs tf32 only while torch allows TF32 for them "
                "(on ROCm some torch versions need HIPBLASLT_ALLOW_TF32=1)"
            )
        elif shape.bias:
            hint = "; addmm did not take its cuBLASLt/hipBLASLt bias path on this build and GPU"
        raise TunerError(
            f"torch did not record workload.shapes[{i}] ({shape.describe()}) as "
            f"{family}TunableOp_{type_name}: it recorded {got}{hint}"
        )


def record_shapes(torch: Any, shapes: Sequence[Shape], record_dir: Path, log: Log = _log) -> None:
    """Run each shape's matmul in this process under record mode, so torch writes the rows.

    TunableOp reads its environment once, at first use, and nothing in this process has used
    it yet: set both the environment and the Python API, for torch versions that lack either.
    """
    os.environ.update(record_env(record_dir, SHAPES_BASENAME))
    tunable = torch.cuda.tunable
    tunable.enable(True)
    tunable.tuning_enable(False)
    if hasattr(tunable, "record_untuned_enable"):
        tunable.record_untuned_enable(True)
    matmul = torch.backends.cuda.matmul
    allow_tf32 = bool(matmul.allow_tf32)
    log(f"recording {len(shapes)} GEMM shape(s) from the profile")
    try:
        for shape in shapes:
            matmul.allow_tf32 = shape.tf32
            _run_shape(torch, shape)
        torch.cuda.synchronize()
    except Exception as exc:
        raise TunerError(f"running a profile shape failed: {type(exc).__name__}: {exc}") from None
    finally:
        matmul.allow_tf32 = allow_tf32
        if hasattr(tunable, "record_untuned_enable"):
            tunable.record_untuned_enable(False)  # closes, and so flushes, the untuned file
        tunable.enable(False)
    rows = [
        r
        for p, f in collect_untuned(record_dir)
        if p.name.startswith(SHAPES_BASENAME.split("_")[0])
        for r in f.rows
    ]
    verify_recorded(shapes, rows)


def collect_untuned(record_dir: Path) -> list[tuple[Path, UntunedFile]]:
    """Every untuned file torch wrote, one per device ordinal and source."""
    return [(p, read_untuned(p)) for p in sorted(record_dir.iterdir()) if _UNTUNED_RE.match(p.name)]
