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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._proc import kill_group
from .config import Shape
from .gpu import TunerError
from .results import UntunedFile, read_untuned

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
    argv: Sequence[str], record_dir: Path, timeout_s: float, log: Log = _log
) -> None:
    """Run the user's command (with the container's env) under TunableOp record mode."""
    env = dict(os.environ)
    env.update(record_env(record_dir, WORKLOAD_BASENAME))
    log(f"recording: {shlex.join(argv)}")
    try:
        # Its own session, so a timeout can stop every process the workload started; its
        # stdout goes to our stderr so our stdout stays one summary line.
        proc = subprocess.Popen(list(argv), env=env, start_new_session=True, stdout=sys.stderr)
    except OSError as exc:
        raise TunerError(f"cannot start workload command {argv[0]!r}: {exc.strerror}") from None
    try:
        rc = proc.wait(timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise TunerError(
            f"workload command did not exit within the {timeout_s:.0f}s tuning budget: "
            f"{shlex.join(argv)}"
        ) from None
    except BaseException:
        kill_group(proc)
        raise
    if rc != 0:
        raise TunerError(f"workload command exited with status {rc}: {shlex.join(argv)}")


_DTYPES = {
    "half": "float16",
    "float": "float32",
    "double": "float64",
}


def _run_shape(torch: Any, shape: Shape) -> None:
    dtype = getattr(torch, _DTYPES.get(shape.dtype, shape.dtype))
    dev = "cuda"
    m, n, k, b = shape.m, shape.n, shape.k, shape.batch
    if shape.dtype.startswith("float8"):
        # _scaled_mm: A row-major (m, k), B column-major (k, n), per-tensor scales.
        a = torch.rand(m, k, device=dev).to(dtype)
        bt = torch.rand(n, k, device=dev).to(dtype).t()
        one = torch.tensor(1.0, device=dev)
        torch._scaled_mm(a, bt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return
    if b > 1:
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
        torch.bmm(a, bb)
        return
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
    torch.mm(a, bb)


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
    log(f"recording {len(shapes)} GEMM shape(s) from the profile")
    try:
        for shape in shapes:
            _run_shape(torch, shape)
        torch.cuda.synchronize()
    except Exception as exc:
        raise TunerError(f"running a profile shape failed: {type(exc).__name__}: {exc}") from None
    finally:
        if hasattr(tunable, "record_untuned_enable"):
            tunable.record_untuned_enable(False)  # closes, and so flushes, the untuned file
        tunable.enable(False)


def collect_untuned(record_dir: Path) -> list[tuple[Path, UntunedFile]]:
    """Every untuned file torch wrote, one per device ordinal and source."""
    return [(p, read_untuned(p)) for p in sorted(record_dir.iterdir()) if _UNTUNED_RE.match(p.name)]
