"""A stand-in for torch 2.11 (and, as a persona, 2.15), for tunefleet's tests and stand-in image.

It computes nothing. It follows what tuner_job relies on from torch 2.11, read from PyTorch's
source (aten/src/ATen/cuda/tunable/*, aten/src/ATen/native/cuda/Blas.cpp and ScaledBlas.cpp,
torch/cuda/tunable.py), so that the tuner's tests take the path real torch takes:

* GEMMs are named the way TunableOp names them. cuBLAS is column-major, so ``mm(A, B)`` on
  row-major tensors runs as C^T = B^T A^T: the BLAS ``m`` is the product's columns, ``n`` its
  rows, and ``mm(a, b.t())`` is ``GemmTunableOp_<T>_TN,tn_<n>_<m>_<k>_ld_<k>_<k>_<n>``
  (cublasCommonArgs in Blas.cpp, ported below for dense and sliced tensors).
* ``addmm(bias, a, b)`` with a 1-D bias takes the cuBLASLt path, ``GemmAndBiasTunableOp``, under
  the conditions of Blas.cpp's isInputCompliesAddmmCudaLt; otherwise it is a plain GEMM.
* float32 GEMMs are typed ``tf32`` while ``torch.backends.cuda.matmul.allow_tf32`` is set
  (TypeName<float> in TunableGemm.h).
* ``_scaled_mm`` goes through TunableOp on ROCm only; on CUDA it bypasses it (ScaledBlas.cpp).
* TunableOp itself: environment variables win over the Python API; the results file is read at
  first use unless recording, split on ``\\n`` only and dropped whole on any validator mismatch;
  untuned GEMMs are appended (once per process) to the untuned file, device ordinal before its
  last '.'; tuned ones are appended to the results file as they are found; on CUDA the only
  candidate is ``Default``. ``torch.cuda.tunable`` has exactly 2.11's public functions, and
  ``tune_gemm_in_file`` rebuilds each GEMM and runs it, as torch's offline tuner does.

It says it is a stand-in wherever it shows: ``torch.__version__`` (and so the PT_VERSION
validator, which a real torch rejects) is ``2.11.0+standin``, the device is "Stand-in GPU ...",
and whatever it prints starts with ``[stand-in torch]``. Its "results" are not measurements.

Personas (FAKE_TORCH_PERSONA 2.11 (default) | 2.15): what each release of torch does, as checked
by tests/conformance against the real wheels. 2.15: PT_VERSION, CUBLASLT_VERSION and CUDA_DEVICE
validators on CUDA (they need the device: without one get_validators() raises and no file
loads), ``Gemm_Cublaslt_id_..._cluster_<n>`` candidates (Default plus
PYTORCH_TUNABLEOP_CUBLASLT_REQUESTED_ALGO_COUNT of them, 8 by default, at least 1), its
parameter formats (``_compute_bf16x9_r`` and op type ``bfx9`` for float32 GEMMs under BF16x9
precision, which the stand-in turns on with FAKE_TORCH_FP32_PRECISION=bf16x9; the labelled CUDA
ScaledGemm signature: _scaled_mm goes through TunableOp on CUDA from 2.14; the ``*`` entries of
``dynamic_dims_mask``), its API additions, and its mgpu_tune_gemm_in_file (one process per GPU
with set_device, "offline tuning processes failed" when one raises, nothing gathered then).

``torch.cuda`` initialises lazily, as torch's does: callables given to ``torch.cuda._lazy_call``
are queued until the first CUDA tensor, set_device (before it selects the device),
current_device, a GEMM or ``torch.cuda.init()``, then run in order (tunefleet's capture hook
queues its results load there).

Without a device (FAKE_TORCH_MODE=no-device) it raises where real torch raises: get_results()
before set_filename, set_filename(x, True), get_rotating_buffer_size(), tune_gemm_in_file()
("Found no NVIDIA driver"), mgpu_tune_gemm_in_file(), and on 2.15 get_validators().

Environment: FAKE_TORCH_MODE gpu (default) | cpu-build | no-device | broken;
FAKE_TORCH_BACKEND cuda (default) | rocm; FAKE_TORCH_GPUS device count (default 1);
FAKE_TORCH_CURRENT_DEVICE; FAKE_TORCH_TUNE_SLEEP seconds per tuned GEMM; FAKE_TORCH_LOG a file
that gets one JSON line per tunable API call (for tests), and a "cuda_context" line the first
time a process does what creates a CUDA context (set_device, a GEMM, synchronize);
FAKE_TORCH_TUNE_HANG_AFTER N: a process hangs in its (N+1)th tuned GEMM (a GEMM stuck in torch);
FAKE_TORCH_FP32_PRECISION ieee (default) | bf16x9 (2.15: float32 GEMMs as bfx9);
FAKE_TORCH_GEMM_SLEEP seconds a GEMM takes and FAKE_TORCH_TUNED_SPEEDUP how much faster a loaded
non-Default result makes it (a knob for tests of tunefleet's gate: stand-in timings).
"""

from __future__ import annotations

import builtins
import glob
import json
import os
import shutil
import sys
import time
import types
import warnings
import zlib
from typing import Any

PREFIX = "[stand-in torch]"
MODE = os.environ.get("FAKE_TORCH_MODE", "gpu")
BACKEND = os.environ.get("FAKE_TORCH_BACKEND", "cuda")
if MODE == "broken":
    raise ImportError(
        f"{PREFIX} libcudart.so.13: cannot open shared object file: No such file or directory"
    )
if MODE not in ("gpu", "cpu-build", "no-device") or BACKEND not in ("cuda", "rocm"):
    raise ImportError(f"{PREFIX} FAKE_TORCH_MODE={MODE!r} / FAKE_TORCH_BACKEND={BACKEND!r}?")

PERSONA = os.environ.get("FAKE_TORCH_PERSONA", "2.11").removesuffix(".0")
if PERSONA not in ("2.11", "2.15"):
    raise ImportError(f"{PREFIX} FAKE_TORCH_PERSONA={PERSONA!r}? (2.11 or 2.15)")
_V215 = PERSONA == "2.15"
__version__ = f"{PERSONA}.0+cpu.standin" if MODE == "cpu-build" else f"{PERSONA}.0+standin"
_ROCM = BACKEND == "rocm"
version = types.SimpleNamespace(
    cuda=None if MODE == "cpu-build" or _ROCM else ("13.2" if _V215 else "13.0"),
    hip="7.0.0-standin" if MODE != "cpu-build" and _ROCM else None,
)
DEVICE_NAME = "Stand-in GPU (tunefleet test image: computes nothing)"


def _say(msg: str) -> None:
    print(f"{PREFIX} {msg}", file=sys.stderr, flush=True)


_say(f"torch {__version__}: a stand-in for tests and demos; it computes and measures nothing")


def _log(event: str, **fields: Any) -> None:
    path = os.environ.get("FAKE_TORCH_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


_log("import", argv=sys.argv, persona=PERSONA)


# --- dtypes and tensors (shapes and strides only) --------------------------------------------


class dtype:
    def __init__(self, name: str, sig: str) -> None:
        self.name, self.sig = name, sig  # sig: TunableOp's TypeName / at::toString

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    @property
    def is_float8(self) -> bool:
        return self.name.startswith("float8")


bfloat16 = dtype("bfloat16", "BFloat16")
float16 = half = dtype("float16", "Half")
float32 = float = dtype("float32", "float")  # torch.float; builtins.float below
float64 = double = dtype("float64", "double")
float8_e4m3fn = dtype("float8_e4m3fn", "Float8_e4m3fn")
float8_e5m2 = dtype("float8_e5m2", "Float8_e5m2")
float8_e4m3fnuz = dtype("float8_e4m3fnuz", "Float8_e4m3fnuz")
float8_e5m2fnuz = dtype("float8_e5m2fnuz", "Float8_e5m2fnuz")


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class Tensor:
    def __init__(
        self,
        shape: tuple[int, ...],
        dt: dtype,
        device: str = "cpu",
        strides: tuple[int, ...] | None = None,
    ) -> None:
        self.shape = tuple(shape)
        self.dtype = dt
        self.device = device
        self._strides = strides if strides is not None else _contiguous_strides(self.shape)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def stride(self, dim: int | None = None) -> Any:
        return self._strides if dim is None else self._strides[dim]

    def dim(self) -> int:
        return len(self.shape)

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def is_contiguous(self) -> bool:
        expected = 1
        for size, st in zip(reversed(self.shape), reversed(self._strides), strict=True):
            if size != 1 and st != expected:
                return False
            expected *= size
        return True

    def is_non_overlapping_and_dense(self) -> bool:
        expected = 1
        for d in sorted(range(self.dim()), key=lambda d: (self._strides[d], self.shape[d])):
            if self.shape[d] == 1:
                continue
            if self._strides[d] != expected:
                return False
            expected *= self.shape[d]
        return True

    def contiguous(self) -> Tensor:
        return Tensor(self.shape, self.dtype, self.device)

    def transpose(self, a: int, b: int) -> Tensor:
        shape, strides = list(self.shape), list(self._strides)
        shape[a], shape[b] = shape[b], shape[a]
        strides[a], strides[b] = strides[b], strides[a]
        return Tensor(tuple(shape), self.dtype, self.device, tuple(strides))

    def t(self) -> Tensor:
        return self.transpose(0, 1)

    @property
    def T(self) -> Tensor:
        return self.t()

    def __getitem__(self, index: Any) -> Tensor:
        # Basic slicing with steps of 1 (what torch's offline tuner uses for sub-matrices).
        index = index if isinstance(index, tuple) else (index,)
        shape = list(self.shape)
        for d, ix in enumerate(index):
            if not isinstance(ix, slice) or ix.step not in (None, 1):
                raise TypeError(f"{PREFIX} only [:n] slices are modelled")
            start, stop, _ = ix.indices(shape[d])
            shape[d] = max(stop - start, 0)
        return Tensor(tuple(shape), self.dtype, self.device, self._strides)

    def to(self, *args: Any, **kwargs: Any) -> Tensor:
        dt = next((a for a in (*args, kwargs.get("dtype")) if isinstance(a, dtype)), self.dtype)
        dev = next((a for a in (*args, kwargs.get("device")) if isinstance(a, str)), self.device)
        _touch(dev)
        return Tensor(self.shape, dt, dev, self._strides)

    def cuda(self) -> Tensor:
        return self.to("cuda")

    def reshape(self, *shape: Any) -> Tensor:
        dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        return Tensor(tuple(dims), self.dtype, self.device)

    def __matmul__(self, other: Tensor) -> Tensor:
        return matmul(self, other)


def _device(device: Any) -> str:
    return "cpu" if device is None else str(device)


def _new(shape: tuple[Any, ...], dt: dtype | None, device: Any) -> Tensor:
    dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape
    _touch(_device(device))
    return Tensor(tuple(int(d) for d in dims), dt or float32, _device(device))


def _touch(device: str) -> None:
    """A CUDA tensor initialises torch's CUDA state first (torch.cuda._lazy_init)."""
    if device.startswith("cuda"):
        _lazy_init_if_gpu()


def rand(*shape: Any, dtype: dtype | None = None, device: Any = None, **_: Any) -> Tensor:
    return _new(shape, dtype, device)


randn = zeros = ones = empty = rand


def full(shape: Any, fill: Any, dtype: dtype | None = None, device: Any = None) -> Tensor:
    return _new(tuple(shape), dtype, device)


def tensor(value: Any, dtype: dtype | None = None, device: Any = None) -> Tensor:
    return Tensor((), dtype or float32, _device(device))


int64 = long = dtype("int64", "long")


def randint(low: int, high: int, size: Any, device: Any = None, **_: Any) -> Tensor:
    return _new(tuple(size), int64, device)


def manual_seed(seed: int) -> None:
    return None


class Generator:
    def __init__(self, device: Any = None) -> None:
        self.device = device

    def manual_seed(self, seed: int) -> Generator:
        return self


# --- torch.backends.cuda.matmul.allow_tf32 ----------------------------------------------------

backends = types.ModuleType("torch.backends")
backends.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
    matmul=types.SimpleNamespace(allow_tf32=False)
)
sys.modules["torch.backends"] = backends


def _type_name(dt: dtype) -> str:
    if dt is float32 and backends.cuda.matmul.allow_tf32:  # type: ignore[attr-defined]
        return "tf32"
    return dt.sig


# --- torch.cuda -------------------------------------------------------------------------------

cuda = types.ModuleType("torch.cuda")
_state: dict[str, Any] = {"device": int(os.environ.get("FAKE_TORCH_CURRENT_DEVICE", "0"))}


def _gpus() -> int:
    return int(os.environ.get("FAKE_TORCH_GPUS", "1")) if MODE == "gpu" else 0


class AcceleratorError(RuntimeError):
    """torch.AcceleratorError: what a CUDA call raises without a usable driver."""


_NO_DRIVER = "CUDA error: CUDA driver version is insufficient for CUDA runtime version"
_NO_NVIDIA = (
    "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
    "installed a driver from http://www.nvidia.com/Download/index.aspx"
)


def _need_device(what: str = "") -> None:
    if MODE != "gpu":
        raise AcceleratorError(f"{PREFIX} {_NO_DRIVER}")


def _context(why: str) -> None:
    """A CUDA context on the current device: made once per process and device, and logged."""
    _need_device()
    _lazy_init_if_gpu()
    made = _state.setdefault("contexts", set())
    if _state["device"] not in made:
        made.add(_state["device"])
        _log("cuda_context", device=_state["device"], why=why)


def _device_name(i: int = 0) -> str:
    return os.environ.get("FAKE_TORCH_DEVICE_NAME", DEVICE_NAME)


def _properties(i: int = 0) -> types.SimpleNamespace:
    props = types.SimpleNamespace(
        name=_device_name(i),
        total_memory=80 * 1024**3,
        major=9,
        minor=4 if _ROCM else 0,
        multi_processor_count=int(os.environ.get("FAKE_TORCH_CUS", "304" if _ROCM else "132")),
        l2CacheSize=50 * 1024**2,
    )
    if _ROCM:
        props.gcnArchName = "gfx942:sramecc+:xnack-"
    return props


cuda.is_available = lambda: MODE == "gpu"  # type: ignore[attr-defined]
cuda.device_count = _gpus  # type: ignore[attr-defined]


def _current_device() -> int:
    if MODE != "gpu":
        raise RuntimeError(f"{PREFIX} {_NO_NVIDIA}")
    _lazy_init_if_gpu()
    return int(_state["device"])


def _set_device(i: int) -> None:
    # torch._C._cuda_setDevice initialises the CUDA state (its queued calls run) before it
    # selects the device: those calls see the device that was current, not this one.
    _lazy_init_if_gpu()
    _state["device"] = int(i)
    _context("set_device")  # CUDA 12+: cudaSetDevice makes the device's primary context


# torch.cuda's lazy initialisation (torch/cuda/__init__.py): callables given to _lazy_call
# before it are queued and run, in order, once CUDA initialises (the first CUDA tensor,
# set_device, current_device, a GEMM, init()); after it they run at once. A queued call that
# raises fails the initialisation (DeferredCudaCallError), as in torch.
_queued_calls: list[tuple[Any, list[str]]] = []
_lazy: dict[str, bool] = {"initialized": False, "initializing": False}


class DeferredCudaCallError(Exception):
    pass


def _is_initialized() -> bool:
    return _lazy["initialized"]


def _lazy_call(callable: Any, **kwargs: Any) -> None:
    if _lazy["initialized"]:
        callable()
    else:
        _queued_calls.append((callable, []))


def _lazy_init() -> None:
    if _lazy["initialized"] or _lazy["initializing"]:
        return
    if MODE != "gpu":
        raise RuntimeError(f"{PREFIX} {_NO_NVIDIA}")
    _lazy["initializing"] = True
    try:
        for queued_call, _ in _queued_calls:
            try:
                queued_call()
            except Exception as e:
                raise DeferredCudaCallError(
                    f"{PREFIX} CUDA call failed lazily at initialization with error: {e}"
                ) from e
    finally:
        _lazy["initializing"] = False
    _lazy["initialized"] = True


def _lazy_init_if_gpu() -> None:
    if MODE == "gpu":
        _lazy_init()


cuda.is_initialized = _is_initialized  # type: ignore[attr-defined]
cuda.init = _lazy_init  # type: ignore[attr-defined]
cuda._lazy_init = _lazy_init  # type: ignore[attr-defined]
cuda._lazy_call = _lazy_call  # type: ignore[attr-defined]
cuda._queued_calls = _queued_calls  # type: ignore[attr-defined]
cuda.DeferredCudaCallError = DeferredCudaCallError  # type: ignore[attr-defined]


cuda.current_device = _current_device  # type: ignore[attr-defined]
cuda.set_device = _set_device  # type: ignore[attr-defined]
cuda.synchronize = lambda device=None: _context("synchronize")  # type: ignore[attr-defined]
cuda.get_device_name = _device_name  # type: ignore[attr-defined]
cuda.get_device_capability = lambda i=0: (9, 4) if _ROCM else (9, 0)  # type: ignore[attr-defined]
cuda.get_device_properties = _properties  # type: ignore[attr-defined]


# --- TunableOp (aten/src/ATen/cuda/tunable, torch/cuda/tunable.py) -----------------------------

_ENV_ONCE: dict[str, str | None] = {}


def _env(name: str) -> str | None:
    """TunableOp reads each of its environment variables once, at first use (static locals)."""
    key = "PYTORCH_TUNABLEOP_" + name
    if key not in _ENV_ONCE:
        _ENV_ONCE[key] = os.environ.get(key)
    return _ENV_ONCE[key]


def _validators() -> dict[str, str]:
    out = {"PT_VERSION": __version__}
    if _V215 and not _ROCM:
        # 2.15 on CUDA: both are read from the device (so they need one, like torch's).
        _need_device()
        out.update(CUBLASLT_VERSION="130401-standin", CUDA_DEVICE=_device_name())
    if _ROCM:
        out.update(
            HIP_VERSION="0-standin",
            GCN_ARCH_NAME=_properties().gcnArchName,
            ROCBLAS_VERSION="0.0.0-standin",
            HIPBLASLT_VERSION="0-standin",
        )
    return out


_ctx: dict[str, Any] = {
    "enable": False,
    "tuning": True,
    "record": False,
    "filename": "",
    "manager": False,  # GetTuningResultsManager's call_once has run
    "results": {},  # (op, params) -> (solution, ms)
    "untuned": set(),  # what this process already wrote to the untuned file
    "untuned_file": None,
    "realtime": {},  # results filename -> open file (realtime append)
    "max_duration": 30,
    "max_iterations": 100,
    "rotating_mb": -1,
}


def _verbose(level: int, *parts: Any) -> None:
    want = int(_env("VERBOSE") or "0")
    if want < level:
        return
    line = f"{PREFIX} " + "".join(str(p) for p in parts)
    target = _env("VERBOSE_FILENAME") or "err"
    if target == "out":
        print(line, flush=True)
    elif target == "err":
        print(line, file=sys.stderr, flush=True)
    else:
        with open(target, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _ordinal_name(name: str, ordinal: int, percent_d: bool = True) -> str:
    if percent_d and "%d" in name:
        return name.replace("%d", str(ordinal), 1)
    dot = name.rfind(".")
    return name[:dot] + str(ordinal) + name[dot:] if dot >= 0 else name + str(ordinal)


def enable(val: bool = True) -> None:
    _ctx["enable"] = bool(val)
    _log("enable", value=val)


def is_enabled() -> bool:
    return _env("ENABLED") == "1" or bool(_ctx["enable"])


def tuning_enable(val: bool = True) -> None:
    _ctx["tuning"] = bool(val)
    _log("tuning_enable", value=val)


def tuning_is_enabled() -> bool:
    return _env("TUNING") != "0" and bool(_ctx["tuning"])


def record_untuned_enable(val: bool = True) -> None:
    _ctx["record"] = bool(val)
    _log("record_untuned_enable", value=val)
    if not val and _ctx["untuned_file"] is not None:
        _ctx["untuned_file"].close()  # EnableRecordUntuned(false) closes the untuned file
        _ctx["untuned_file"] = None


def record_untuned_is_enabled() -> bool:
    return _env("RECORD_UNTUNED") == "1" or bool(_ctx["record"])


def set_max_tuning_duration(duration: int) -> None:
    _ctx["max_duration"] = max(int(duration), 0)
    _log("set_max_tuning_duration", value=duration)


def get_max_tuning_duration() -> int:
    env = _env("MAX_TUNING_DURATION_MS")
    return max(int(env), 0) if env is not None else int(_ctx["max_duration"])


def set_max_tuning_iterations(iterations: int) -> None:
    _ctx["max_iterations"] = max(int(iterations), 0)
    _log("set_max_tuning_iterations", value=iterations)


def get_max_tuning_iterations() -> int:
    env = _env("MAX_TUNING_ITERATIONS")
    return max(int(env), 0) if env is not None else int(_ctx["max_iterations"])


def set_filename(filename: str, insert_device_ordinal: bool = False) -> None:
    if filename and insert_device_ordinal:
        _need_device()  # the ordinal is the current device's
    _ctx["filename"] = (
        _ordinal_name(filename, _state["device"])
        if filename and insert_device_ordinal
        else filename
    )
    _log("set_filename", value=[filename, insert_device_ordinal])


def get_filename() -> str:
    return str(_ctx["filename"])


def _manager() -> dict[tuple[str, str], tuple[str, float]]:
    """GetTuningResultsManager: on first use, settle the filename and read it unless recording."""
    if not _ctx["manager"]:
        if not _ctx["filename"]:
            _need_device()  # the default name takes the device ordinal
            name = _env("FILENAME") or "tunableop_results.csv"
            _ctx["filename"] = _ordinal_name(name, _state["device"])
        _ctx["manager"] = True
        if not tunable.record_untuned_is_enabled():
            # With record-untuned on, the lazy start reads no results (2.11 and 2.15 alike).
            _read(_ctx["filename"])
    results: dict[tuple[str, str], tuple[str, float]] = _ctx["results"]
    return results


def _registered() -> tuple[str, ...]:
    """The validator keys this build registers (their values may need the device)."""
    if _ROCM:
        return (
            "PT_VERSION",
            "HIP_VERSION",
            "GCN_ARCH_NAME",
            "ROCBLAS_VERSION",
            "HIPBLASLT_VERSION",
        )
    return ("PT_VERSION", "CUBLASLT_VERSION", "CUDA_DEVICE") if _V215 else ("PT_VERSION",)


def _fields(line: str) -> list[str]:
    """std::getline(ss, field, ','): a trailing empty field is no field."""
    parts = line.split(",")
    if parts and parts[-1] == "":
        parts.pop()
    return parts


def _validate(validators: dict[str, str]) -> bool:
    """TuningResultsValidator::ValidateAll: mandatory key, exactly the registered set (each
    stranger and each absentee warned), then every value compared as a string."""
    if "PT_VERSION" not in validators:
        _verbose(1, 'key="PT_VERSION" is not provided for validation. ')
        return False
    registered = _registered()
    ok = True
    for key in validators:
        if key not in registered:
            warnings.warn(
                f'Unmatched validator: "{key}" is provided, but pytorch is unable to consume it. ',
                stacklevel=3,
            )
            ok = False
    for key in registered:
        if key not in validators:
            warnings.warn(
                f'Unmatched validator: "{key}" is required, but the tuning results does not '
                "provide it. ",
                stacklevel=3,
            )
            ok = False
    if not ok:
        return False
    mine = _validators()  # 2.15 on CUDA: needs the device, raises without one
    for key in registered:
        if validators[key] != mine[key]:
            _verbose(1, key, " validation: expect ", validators[key], " to match ", mine[key])
            warnings.warn(f"Failed validator: {key}", stacklevel=3)
            return False
    return True


def _read(filename: str) -> bool:
    """TuningContext::ReadFile: std::getline (\\n only), split on ',' with getline's rules,
    atof for times, the first of two equal keys kept, validate, then load."""
    try:
        with open(filename, encoding="utf-8", errors="surrogateescape", newline="") as f:
            text = f.read()
    except OSError:
        _verbose(1, "could not open ", filename, " for reading tuning results")
        return False
    _verbose(1, "reading tuning results from ", filename)
    validators: dict[str, str] = {}
    rows: dict[tuple[str, str], tuple[str, float]] = {}
    for line in text.split("\n"):
        if not line:
            continue
        parts = _fields(line)
        if len(parts) < 3:
            _verbose(1, "could not parse line: ", line)
        elif parts[0] == "Validator":
            validators[parts[1]] = parts[2]
        else:
            ms = 0.0 if len(parts) == 3 else _atof(parts[3])
            rows.setdefault((parts[0], parts[1]), (parts[2], ms))
    if not _validate(validators):
        _verbose(1, "results validator check failed")
        return False
    for key, value in rows.items():
        _ctx["results"].setdefault(key, value)
    return True


def _atof(text: str) -> float:
    """C's atof: the longest number at the start (after blanks), else 0."""
    import re

    t = text.lstrip(" \t\n\v\f\r")
    m = re.match(
        r"[+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?"
        r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?)",
        t,
        re.IGNORECASE,
    )
    if m is None:
        return 0.0
    num = m.group(0)
    low = num.lower()
    if "x" in low:
        sign = -1.0 if low.startswith("-") else 1.0
        body = low.lstrip("+-")[2:]
        exp = 0
        if "p" in body:
            body, e = body.split("p", 1)
            exp = int(e)
        whole, _, frac = body.partition(".")
        value = builtins.float(int(whole or "0", 16))
        for i, ch in enumerate(frac, start=1):
            value += int(ch, 16) / 16.0**i
        return sign * value * 2.0**exp
    return builtins.float(num)


def read_file(filename: str | None = None) -> bool:
    return _read(filename if filename is not None else str(_ctx["filename"]))


def get_results() -> tuple[tuple[str, str, str, float], ...]:
    out = tuple((op, p, s, ms) for (op, p), (s, ms) in sorted(_manager().items()))
    for row in out:  # pybind11 decodes the C++ strings as UTF-8, and raises on what is not
        for text in row[:3]:
            text.encode("utf-8")
    return out


def get_validators() -> tuple[tuple[str, str], ...]:
    return tuple(_validators().items())


def set_rotating_buffer_size(buffer_size: int) -> None:
    _ctx["rotating_mb"] = int(buffer_size)
    _log("set_rotating_buffer_size", value=buffer_size)


def get_rotating_buffer_size() -> int:
    env = _env("ROTATING_BUFFER_SIZE")
    mb = int(env) if env is not None else int(_ctx["rotating_mb"])
    if mb < 0:
        _need_device()  # the L2 size is the device's
    return _properties().l2CacheSize if mb < 0 else mb * 1024 * 1024


def set_numerical_check_tolerances(enable: bool, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    # Tunable.cpp checks both, whatever `enable` says: > 0 (NaN fails, inf passes).
    if not (atol > 0 and rtol > 0):
        raise RuntimeError(
            f"{PREFIX} Numerical check tolerances must be positive. Got atol={atol:g}, "
            f"rtol={rtol:g}"
        )
    _ctx["numerical"] = (bool(enable), atol, rtol)
    _log("set_numerical_check_tolerances", value=[enable, atol, rtol])


def set_cublaslt_requested_algo_count(count: int) -> None:
    _ctx["algo_count"] = max(int(count), 1)
    _log("set_cublaslt_requested_algo_count", value=count)


def get_cublaslt_requested_algo_count() -> int:
    env = _env("CUBLASLT_REQUESTED_ALGO_COUNT")
    if env is not None:
        try:
            return max(int(env), 1)
        except ValueError:
            warnings.warn(
                f"PYTORCH_TUNABLEOP_CUBLASLT_REQUESTED_ALGO_COUNT is not a valid integer (got "
                f"{env!r}). Falling back to the value set via "
                "torch.cuda.tunable.set_cublaslt_requested_algo_count.",
                stacklevel=2,
            )
    return int(_ctx.get("algo_count", 8))


def wildcard_fallback_enable(val: bool = True) -> None:
    _ctx["wildcard_fallback"] = bool(val)


def wildcard_fallback_is_enabled() -> bool:
    return _env("WILDCARD_FALLBACK") == "1" or bool(_ctx.get("wildcard_fallback", False))


class _DimsMask:
    def __init__(self, m: bool, n: bool, k: bool, batch: bool) -> None:
        self.mask = (m, n, k, batch)

    def __enter__(self) -> None:
        _ctx.setdefault("masks", []).append(self.mask)

    def __exit__(self, *exc: object) -> None:
        _ctx["masks"].pop()


def dynamic_dims_mask(
    M: bool = False, N: bool = False, K: bool = False, BATCH: bool = False
) -> _DimsMask:
    """2.15: GEMMs run inside are dynamic in these dims (tuning adds a '*' entry too)."""
    return _DimsMask(M, N, K, BATCH)


_CUBLASLT = (
    "Gemm_Cublaslt_id_{}_tile_{}_stages_{}_splitk_1_red_0_swizzle_0_custom_0_inner_0_cluster_0"
)


def _candidates(op: str) -> list[str]:
    """Registered solutions: on CUDA builds before 2.14 only Default (TunableGemm.h); 2.15 on
    CUDA: Default and the cuBLASLt heuristic's first `algo count` algorithms."""
    if not _ROCM and _V215:
        h = zlib.crc32(op.encode())
        count = tunable.get_cublaslt_requested_algo_count()
        return ["Default"] + [
            _CUBLASLT.format(h % 97 + i, 20 + i % 8, 2 + i % 6) for i in range(count)
        ]
    if not _ROCM:
        return ["Default"]
    if op.startswith(("GemmAndBias", "ScaledGemm")):
        return ["Default", "Gemm_Hipblaslt_"]
    return ["Default", "Gemm_Rocblas_", "Gemm_Hipblaslt_"]


def _find_fastest(op: str, params: str) -> tuple[str, float]:
    tuned = _ctx["tuned_count"] = _ctx.get("tuned_count", 0) + 1
    hang = os.environ.get("FAKE_TORCH_TUNE_HANG_AFTER")
    if hang is not None and tuned > int(hang):
        time.sleep(3600)  # a GEMM stuck in torch: only a kill ends it
    time.sleep(builtins.float(os.environ.get("FAKE_TORCH_TUNE_SLEEP", "0")))
    h = zlib.crc32(f"{op},{params}".encode())
    names = _candidates(op)
    pick = names[h % len(names)] if len(names) > 1 and h % 4 else names[0]
    if pick == "Default" or pick.startswith("Gemm_Cublaslt_"):
        solution = pick
    else:
        solution = f"{pick}{1000 + h % 9000}"
    return solution, round(0.001 + (h % 997) / 1000.0, 4)


def _append_result(op: str, params: str, entry: tuple[str, float]) -> None:
    """TuningResultsManager::Add's realtime append (validators first into a new or empty file)."""
    name = str(_ctx["filename"])
    new = not os.path.exists(name) or os.path.getsize(name) == 0
    with open(name, "a", encoding="utf-8") as f:
        if new:
            for k, v in sorted(_validators().items()):
                f.write(f"Validator,{k},{v}\n")
        f.write(f"{op},{params},{entry[0]},{entry[1]:g}\n")


def _record_untuned(op: str, params: str) -> None:
    if (op, params) in _ctx["untuned"]:
        return
    _ctx["untuned"].add((op, params))
    if _ctx["untuned_file"] is None:
        name = _env("UNTUNED_FILENAME") or "tunableop_untuned.csv"
        path = _ordinal_name(name, _state["device"], percent_d=False)
        _ctx["untuned_file"] = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept open)
    _ctx["untuned_file"].write(f"{op},{params}\n")
    _ctx["untuned_file"].flush()  # std::endl


def _tunable(op: str, params: str, dynamic: str | None = None) -> None:
    """TunableOp<...>::operator(): look up, else tune (tuning on) or record (recording on).

    dynamic: 2.15's DynamicSignature() when a dynamic_dims_mask is active; tuning adds the
    '*' entry too, recording writes only the concrete one."""
    _context("gemm")
    if not tunable.is_enabled():
        _gemm_sleep(None)
        return
    results = _manager()
    if (op, params) in results:
        _verbose(3, "ResultEntry found for ", op, ",", params)
        _gemm_sleep(results[(op, params)])
        return
    known_op = any(k[0] == op for k in results)
    which = "params_signature" if known_op else "op_signature"
    _verbose(3, "missing ", which, ", returning null ResultEntry for ", op, ",", params)
    if tunable.tuning_is_enabled():
        entry = _find_fastest(op, params)
        for sig in (params, dynamic) if dynamic and dynamic != params else (params,):
            results[(op, sig)] = entry
            if not tunable.record_untuned_is_enabled():
                _append_result(op, sig, entry)
        return
    if tunable.record_untuned_is_enabled():
        _record_untuned(op, params)
    _verbose(2, "no result, using default")
    _gemm_sleep(None)


def _gemm_sleep(entry: tuple[str, float] | None) -> None:
    """How long a GEMM "runs", for tests of tunefleet's measuring only (it computes nothing):
    FAKE_TORCH_GEMM_SLEEP seconds (default 0), divided by FAKE_TORCH_TUNED_SPEEDUP (default 1.5;
    below 1 makes the "tuned" kernel slower) when a loaded result names a kernel other than
    Default. A knob, never a measurement of anything."""
    base = builtins.float(os.environ.get("FAKE_TORCH_GEMM_SLEEP", "0") or 0)
    if base <= 0:
        return
    if entry is not None and entry[0] != "Default":
        base /= builtins.float(os.environ.get("FAKE_TORCH_TUNED_SPEEDUP", "1.5") or 1.5)
    time.sleep(base)


# --- the GEMM entry points (Blas.cpp, ScaledBlas.cpp) -----------------------------------------


def _prepare(t: Tensor) -> tuple[Tensor, bool]:
    """prepare_matrix_for_cublas: (the tensor cuBLAS reads, whether it is transposed)."""
    if t.is_non_overlapping_and_dense():
        return t, t.is_contiguous()
    st, sz = t.stride(), t.shape
    if st[0] == 1 and st[1] >= max(1, sz[0]):
        return t, False
    if st[1] == 1 and st[0] >= max(1, sz[1]):
        return t, True
    return t.contiguous(), True


def _blas_args(mat1: Tensor, mat2: Tensor) -> tuple[str, str, int, int, int, int, int, int]:
    """cublasCommonArgs for a fresh (row-major) result: (transa, transb, m, n, k, lda, ldb, ldc)."""
    result = Tensor((mat1.shape[0], mat2.shape[1]), mat1.dtype)
    tr = result.is_contiguous()  # always: the result is made fresh
    mata, ta = _prepare(mat2 if tr else mat1)
    matb, tb = _prepare(mat1 if tr else mat2)
    if tr:
        ta, tb = not ta, not tb
    m = mata.shape[1 if tr else 0]
    k = mata.shape[0 if tr else 1]
    n = matb.shape[0 if tr else 1]
    lda = mata.stride(1 if ta == tr else 0)
    ldb = matb.stride(1 if tb == tr else 0)
    ldc = result.stride(0 if tr else 1)
    return ("t" if ta else "n", "t" if tb else "n", m, n, k, lda, ldb, ldc)


def _gemm_sig(
    family: str, type_name: str, args: tuple[Any, ...], batch: int = 0
) -> tuple[str, str, str | None]:
    """(OpSig, ParamSig, 2.15's DynamicSignature or None), GemmCommon.h's formats."""
    ta, tb, m, n, k, lda, ldb, ldc = args
    compute = ""
    if type_name == "float" and _V215 and _bf16x9():
        type_name, compute = "bfx9", "_compute_bf16x9_r"  # ComputeTypeSignature<float>
    op = f"{family}TunableOp_{type_name}_{ta.upper()}{tb.upper()}"
    mid = f"_B_{batch}" if family == "GemmStridedBatched" else ""
    params = f"{ta}{tb}_{m}_{n}_{k}{mid}_ld_{lda}_{ldb}_{ldc}{compute}"
    masks = _ctx.get("masks") or []
    if not (_V215 and masks):
        return op, params, None
    dm, dn, dk, db = masks[-1]

    def w(value: int, on: bool) -> str:
        return "*" if on else str(value)

    wa = (dm and lda == m) if ta == "n" else (dk and lda == k)
    wb = (dk and ldb == k) if tb == "n" else (dn and ldb == n)
    dmid = f"_B_{w(batch, db)}" if family == "GemmStridedBatched" else ""
    dynamic = (
        f"{ta}{tb}_{w(m, dm)}_{w(n, dn)}_{w(k, dk)}{dmid}"
        f"_ld_{w(lda, wa)}_{w(ldb, wb)}_{w(ldc, dm and ldc == m)}{compute}"
    )
    return op, params, dynamic


def _bf16x9() -> bool:
    return os.environ.get("FAKE_TORCH_FP32_PRECISION", "ieee") == "bf16x9"


def _check_2d(a: Tensor, b: Tensor, what: str) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise RuntimeError(
            f"{PREFIX} {what}: mat1 {a.shape} and mat2 {b.shape} cannot be multiplied"
        )
    if a.dtype is not b.dtype:
        raise RuntimeError(f"{PREFIX} {what}: expected mat1 and mat2 to have the same dtype")


def mm(a: Tensor, b: Tensor) -> Tensor:
    _check_2d(a, b, "mm")
    out = Tensor((a.shape[0], b.shape[1]), a.dtype, a.device)
    if a.is_cuda and min(out.shape) > 0 and a.shape[1] > 0:
        _tunable(*_gemm_sig("Gemm", _type_name(a.dtype), _blas_args(a, b)))
    return out


def _lt_bias(bias: Tensor, a: Tensor, b: Tensor, beta: Any) -> bool:
    """Blas.cpp isGloballyDisabledAddmmCudaLt / isInputCompliesAddmmCudaLt for a fresh result."""
    if os.environ.get("DISABLE_ADDMM_CUDA_LT") == "1":
        return False
    types_ok = (bfloat16, float16, float32) if _ROCM else (bfloat16, float16, float32, float64)
    return (
        beta == 1
        and bias.is_contiguous()
        and bias.dim() == 1
        and bias.shape[-1] == b.shape[1]
        and a.dtype in types_ok
        and a.shape[0] > 1
        and a.shape[1] > 1
        and b.shape[0] > 1
        and b.shape[1] > 1
    )


def addmm(bias: Tensor, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    _check_2d(a, b, "addmm")
    out = Tensor((a.shape[0], b.shape[1]), a.dtype, a.device)
    if a.is_cuda and min(out.shape) > 0 and a.shape[1] > 0:
        family = "GemmAndBias" if _lt_bias(bias, a, b, beta) else "Gemm"
        _tunable(*_gemm_sig(family, _type_name(a.dtype), _blas_args(a, b)))
    return out


def _prepare_batch(t: Tensor, tr: bool, m: int, n: int) -> tuple[bool, int]:
    """prepare_batch_matrix_for_cublas: (transposed, leading dimension)."""
    st = t.stride()
    fast, lead = (2, 1) if tr else (1, 2)
    if st[fast] == 1 and st[lead] >= max(1, m):
        return False, st[lead]
    if st[lead] == 1 and st[fast] >= max(1, n):
        return True, st[fast]
    return not tr, t.contiguous().stride(1)


def bmm(a: Tensor, b: Tensor) -> Tensor:
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise RuntimeError(f"{PREFIX} bmm: {a.shape} and {b.shape} cannot be multiplied")
    out = Tensor((a.shape[0], a.shape[1], b.shape[2]), a.dtype, a.device)
    if not a.is_cuda or 0 in out.shape or a.shape[2] == 0:
        return out
    rs, rsz = out.stride(), out.shape
    if rs[1] == 1 and (rsz[2] == 1 or rs[2] >= max(1, rsz[1])):
        tr = False
    elif rs[2] == 1 and (rsz[1] == 1 or rs[1] >= max(1, rsz[2])):
        tr = True
    else:  # pragma: no cover - a fresh result is always one of the above
        tr = False
    lead = 1 if tr else 2
    m, n = rsz[2 if tr else 1], rsz[lead]
    k = (b if tr else a).shape[lead]
    t1, lda = _prepare_batch(b if tr else a, tr, m, k)
    t2, ldb = _prepare_batch(a if tr else b, tr, k, n)
    args = ("t" if t1 else "n", "t" if t2 else "n", m, n, k, lda, ldb, out.stride(lead))
    if rsz[0] == 1:  # baddbmm: a batch of one is a plain gemm
        _tunable(*_gemm_sig("Gemm", _type_name(a.dtype), args))
    else:
        _tunable(*_gemm_sig("GemmStridedBatched", _type_name(a.dtype), args, batch=rsz[0]))
    return out


def matmul(a: Tensor, b: Tensor) -> Tensor:
    if a.dim() == 2 and b.dim() == 2:
        return mm(a, b)
    if a.dim() == 3 and b.dim() == 3:
        return bmm(a, b)
    raise RuntimeError(f"{PREFIX} matmul of {a.dim()}-D and {b.dim()}-D tensors is not modelled")


def _scaled_mm(
    a: Tensor,
    b: Tensor,
    scale_a: Tensor,
    scale_b: Tensor,
    bias: Tensor | None = None,
    scale_result: Tensor | None = None,
    out_dtype: dtype | None = None,
    use_fast_accum: bool = False,
) -> Tensor:
    _check_2d(a, b.to(a.dtype), "_scaled_mm")
    out = Tensor((a.shape[0], b.shape[1]), out_dtype or a.dtype, a.device)
    if not (a.dtype.is_float8 and b.dtype.is_float8):
        raise RuntimeError(f"{PREFIX} Expected mat1 and mat2 to be Float8 matrices")
    if a.shape[1] % 16 or b.shape[0] % 16 or b.shape[1] % 16:
        raise RuntimeError(f"{PREFIX} _scaled_mm: dimensions must be divisible by 16")
    if not _ROCM:
        if "fnuz" in a.dtype.name or "fnuz" in b.dtype.name:
            raise RuntimeError(f"{PREFIX} fnuz float8 types are ROCm-only (cuBLASLt has none)")
        if a.dtype is float8_e5m2 and b.dtype is float8_e5m2:
            raise ValueError(
                f"{PREFIX} Multiplication of two Float8_e5m2 matrices is not supported"
            )
        if not _V215:
            return out  # ScaledBlas.cpp before 2.14: on CUDA, _scaled_mm bypasses TunableOp
    args = _blas_args(a, b)
    if (args[0], args[1]) != ("t", "n"):
        raise RuntimeError(
            f"{PREFIX} Only multiplication of row-major and column-major matrices is supported"
        )
    rowwise = int(scale_a.shape == (a.shape[0], 1) and scale_b.shape == (1, b.shape[1]))
    ta, tb, m, n, k, lda, ldb, ldc = args
    op = f"ScaledGemmTunableOp_{a.dtype.sig}_{b.dtype.sig}_{out.dtype.sig}_{ta.upper()}{tb.upper()}"
    bias_sig = bias.dtype.sig if bias is not None else "None"
    if _ROCM:
        _tunable(op, f"{ta}{tb}_{m}_{n}_{k}_ld_{lda}_{ldb}_{ldc}_rw_{rowwise}_bias_{bias_sig}")
        return out
    # 2.15 CUDA: ScaledGemmParams' labelled Signature() (at::toString of each ScalarType; the
    # scaling types TensorWise 0, RowWise 1; whether a result scale is given; fast accumulation).
    kind = 1 if rowwise else 0
    _tunable(
        op,
        f"{ta}{tb}_{m}_{n}_{k}_ld_{lda}_{ldb}_{ldc}_a_{a.dtype.sig}_b_{b.dtype.sig}_c_{out.dtype.sig}"
        f"_as_Float_bs_Float_ast_{kind}_bst_{kind}_dscale_{int(scale_result is not None)}"
        f"_fast_{int(use_fast_accum)}_bias_{bias_sig}",
    )
    return out


nn = types.ModuleType("torch.nn")
functional = types.ModuleType("torch.nn.functional")


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """at::linear: 2-D input with a bias is addmm(bias, x, weight.t()); N-D input is flattened."""
    flat = x if x.dim() == 2 else Tensor((_prod(x.shape[:-1]), x.shape[-1]), x.dtype, x.device)
    y = mm(flat, weight.t()) if bias is None else addmm(bias, flat, weight.t())
    return y if x.dim() == 2 else Tensor((*x.shape[:-1], weight.shape[0]), x.dtype, x.device)


def _prod(dims: tuple[int, ...]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


class _Linear:
    """nn.Linear: y = x W^T + b, a GemmAndBias GEMM when it has a bias (at::linear -> addmm)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: Any = None,
        dtype: dtype | None = None,
    ) -> None:
        self.weight = rand(out_features, in_features, dtype=dtype, device=device)
        self.bias = rand(out_features, dtype=dtype, device=device) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return _linear(x, self.weight, self.bias)


class _NoGrad:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


no_grad = inference_mode = _NoGrad
functional.linear = _linear  # type: ignore[attr-defined]
nn.functional = functional  # type: ignore[attr-defined]
nn.Linear = _Linear  # type: ignore[attr-defined]
sys.modules["torch.nn"] = nn
sys.modules["torch.nn.functional"] = functional


# --- offline tuning (torch/cuda/tunable.py) ---------------------------------------------------

_OFFLINE_DTYPES = {
    "float": float32,
    "tf32": float32,
    "double": float64,
    "BFloat16": bfloat16,
    "Half": float16,
    "Float8_e4m3fn": float8_e4m3fn,
    "Float8_e5m2": float8_e5m2,
    "Float8_e4m3fnuz": float8_e4m3fnuz,
    "Float8_e5m2fnuz": float8_e5m2fnuz,
}
if _V215:
    _OFFLINE_DTYPES["Float"] = float32  # 2.15's map adds it; neither maps "bfx9"


def _matrices(
    m: int, n: int, k: int, lds: tuple[int, int, int], ta: bool, tb: bool, da: dtype, dev: str
) -> tuple[Tensor, Tensor]:
    """tunable._create_matrices: the operands, sliced out of larger ones when ld says so."""
    lda, ldb, ldc = lds
    if all(ld in (n, m, k) for ld in lds):
        a = rand(k, m, dtype=da, device=dev).t() if ta else rand(m, k, dtype=da, device=dev)
        b = rand(n, k, dtype=da, device=dev).t() if tb else rand(k, n, dtype=da, device=dev)
        return a, b
    rows = max(ldc, k)
    big_a, big_b = rand(rows, lda, dtype=da, device=dev), rand(rows, ldb, dtype=da, device=dev)
    a = big_a[:k, :m].t() if ta else big_a[:m, :k]
    b = big_b[:n, :k].t() if tb else big_b[:k, :n]
    return a, b


def _process_single_offline_gemm(line: str, gpu_id: int) -> None:
    """tunable._process_single_offline_gemm: rebuild the GEMM of one untuned line and run it."""
    dev = f"cuda:{gpu_id}"
    fields = line.strip().split(",")
    op_parts = fields[0].split("_")
    family = op_parts[0]
    layout = op_parts[-1]
    tb, ta = layout[0] == "T", layout[1] == "T"  # BLAS letters are (B, A) of the user's call
    p = fields[1].split("_")
    n, m, k = (int(x) for x in p[1:4])
    if len(op_parts) == 3:
        backends.cuda.matmul.allow_tf32 = op_parts[1] == "tf32"  # type: ignore[attr-defined]
        dt = _OFFLINE_DTYPES.get(op_parts[1])  # type: ignore[assignment]
        if dt is None:  # torch.rand(..., dtype=None) in torch's offline tuner
            raise TypeError(f"{PREFIX} dtype must be a torch.dtype, but got None")
    if family == "GemmStridedBatchedTunableOp":
        if p[6] != "ld":
            raise AssertionError(f"{PREFIX} expected 'ld' at index 6, got {p[6]!r}")
        ldb, lda, ldc = (int(x) for x in p[7:10])
    else:
        if p[4] != "ld":
            raise AssertionError(f"{PREFIX} expected 'ld' at index 4, got {p[4]!r}")
        ldb, lda, ldc = (int(x) for x in p[5:8])
    lds = (lda, ldb, ldc)
    skipped = f"{PREFIX} Offline tuning is not supported for this GEMM. Use online tuning instead. "
    if family == "GemmTunableOp":
        if 1 in (m, n, k) and not ((not ta and not tb) or (ta and n == 1)):
            warnings.warn(skipped + f"Skipped tuning for: {fields[1]}", stacklevel=2)
            return
        mm(*_matrices(m, n, k, lds, ta, tb, dt, dev))
    elif family == "GemmStridedBatchedTunableOp":
        if 1 in (m, n, k):
            warnings.warn(skipped + f"Skipped tuning for: {fields[1]}", stacklevel=2)
            return
        batch = int(p[5])
        a = (
            rand(batch, k, m, dtype=dt, device=dev)
            if ta
            else rand(batch, m, k, dtype=dt, device=dev)
        )
        b = (
            rand(batch, n, k, dtype=dt, device=dev)
            if tb
            else rand(batch, k, n, dtype=dt, device=dev)
        )
        bmm(a.transpose(1, 2) if ta else a, b.transpose(1, 2) if tb else b)
    elif family == "ScaledGemmTunableOp":
        if not tb or ta:
            raise AssertionError(f"{PREFIX} ScaledGemmTunableOp needs transA False, transB True")
        if len(op_parts) not in (7, 8):
            raise AssertionError(f"{PREFIX} count must be 6 or 7, got {len(op_parts) - 1}")
        da = _OFFLINE_DTYPES[op_parts[1] + "_" + op_parts[2]]
        db = _OFFLINE_DTYPES[op_parts[3] + "_" + op_parts[4]]
        c = _OFFLINE_DTYPES["_".join(op_parts[5:-1])]
        a, b = _matrices(m, n, k, lds, ta, tb, da, dev)
        if len(p) > 9 and p[8] == "a" and _V215:  # 2.15 CUDA: the labelled signature
            labels = fields[1].split("_ast_")[1].split("_")
            rowwise, bias_name = labels[0] == "1", fields[1].rsplit("_bias_", 1)[1]
        else:
            rowwise, bias_name = p[9] == "1", p[11]
        scale_a = ones((m, 1)) if rowwise else tensor(0.8)
        scale_b = ones((1, n)) if rowwise else tensor(0.9)
        bias = None if bias_name == "None" else full((n,), 0.1, dtype=_OFFLINE_DTYPES[bias_name])
        _scaled_mm(a, b.to(db), scale_a, scale_b, bias=bias, out_dtype=c)
    elif family == "GemmAndBiasTunableOp":
        if ta == tb:
            raise AssertionError(
                f"{PREFIX} transA and transB must differ for GemmAndBiasTunableOp, "
                f"got transA={ta}, transB={tb}"
            )
        x, w = _matrices(m, n, k, lds, ta, tb, dt, dev)
        _linear(x, w.t(), rand(n, dtype=dt, device=dev))
    else:
        warnings.warn(f"{PREFIX} error: unknown op {family}", stacklevel=2)


def _limits_env() -> dict[str, str | None]:
    keys = (
        "MAX_TUNING_DURATION_MS",
        "MAX_TUNING_ITERATIONS",
        "MAX_WARMUP_DURATION_MS",
        "MAX_WARMUP_ITERATIONS",
        "ROTATING_BUFFER_SIZE",
        "NUMERICAL_CHECK",
        "FILENAME",
    )
    return {k: os.environ.get("PYTORCH_TUNABLEOP_" + k) for k in keys}


def tune_gemm_in_file(filename: str) -> None:
    if not tunable.is_enabled():
        raise AssertionError(f"{PREFIX} TunableOp is not enabled")
    if not tunable.tuning_is_enabled():
        raise AssertionError(f"{PREFIX} Tuning is not enabled")
    device = cuda.current_device()  # raises without a device, as torch's does
    _log("tune_gemm_in_file", filename=filename, device=device, env=_limits_env())
    with open(filename, encoding="utf-8") as f:
        for line in f:
            if line.startswith(("Gemm", "ScaledGemm")):
                _process_single_offline_gemm(line, device)


def mgpu_tune_gemm_in_file(filename_pattern: str, num_gpus: int) -> None:
    _log("mgpu_tune_gemm_in_file", pattern=filename_pattern, gpus=num_gpus, env=_limits_env())
    lines: set[str] = set()
    for path in glob.glob(filename_pattern):
        with open(path, encoding="utf-8") as f:
            lines |= {ln for ln in f if ln.startswith(("Gemm", "ScaledGemm"))}
    if not 1 <= num_gpus <= _gpus():
        raise AssertionError(f"num_gpus must be between 1 and {_gpus()}, got {num_gpus}")
    # torch starts worker processes with their own per-ordinal results files; here this
    # process plays each worker in turn.
    tunable.enable(True)
    _manager()
    home, home_file = _state["device"], _ctx["filename"]
    name = _env("FILENAME") or "tunableop_results.csv"
    if _V215:
        # One process per GPU on a round-robin share; set_device per GEMM; no per-GEMM try: a
        # raising GEMM ends its GPU's share, and the parent raises without gathering.
        failed = []
        for gpu in range(num_gpus):
            share = sorted(lines)[gpu::num_gpus]
            _ctx["filename"] = _ordinal_name(name, gpu)
            try:
                for line in share:
                    _set_device(gpu)
                    _process_single_offline_gemm(line, gpu)
            except Exception:
                failed.append(gpu)
        _state["device"], _ctx["filename"] = home, home_file
        if failed:
            raise RuntimeError(f"{PREFIX} offline tuning processes failed: {failed}")
    else:
        # 2.11: a process pool; the first worker exception re-raises in the parent (future
        # .result()), so nothing is gathered.
        try:
            for i, line in enumerate(sorted(lines)):
                _state["device"] = i % num_gpus
                _ctx["filename"] = _ordinal_name(name, i % num_gpus)
                _process_single_offline_gemm(line, i % num_gpus)
        finally:
            _state["device"], _ctx["filename"] = home, home_file
    cuda.synchronize()  # in the parent: a CUDA context on the current device
    _gather_tunableop_results()


def _gather_tunableop_results() -> None:
    """torch's _gather_tunableop_results, quirks included (glob from the char before the first
    '.', copies named with replace("0", i) over the whole path)."""
    env_name = os.environ.get("PYTORCH_TUNABLEOP_FILENAME") or ""
    if not env_name:
        pattern = "tunableop_results?.csv"
    elif "%d" in env_name:
        pattern = env_name.replace("%d", "?")
    else:
        pattern = env_name.replace(".", "?.")
    matching = glob.glob(pattern)
    output = pattern.replace("?", "_full0")
    validator_lines: list[str] = []
    body: set[str] = set()
    for n, path in enumerate(matching):
        with open(path, encoding="utf-8") as f:
            for ln in f:
                if ln.startswith("Validator"):
                    if n == 0:
                        validator_lines.append(ln)
                else:
                    body.add(ln)
    with open(output, "w", encoding="utf-8") as out:
        out.writelines(validator_lines)
        out.writelines(body)
    for i in range(1, len(matching)):
        shutil.copy(output, output.replace("0", str(i)))


# Exactly the public functions of torch 2.11's torch/cuda/tunable.py (its __all__): no
# set_max_warmup_*, no write_file / write_file_on_exit (results are appended as they are found).
TUNABLE_API = (
    "enable",
    "is_enabled",
    "tuning_enable",
    "tuning_is_enabled",
    "record_untuned_enable",
    "record_untuned_is_enabled",
    "set_max_tuning_duration",
    "get_max_tuning_duration",
    "set_max_tuning_iterations",
    "get_max_tuning_iterations",
    "set_filename",
    "get_filename",
    "get_results",
    "get_validators",
    "read_file",
    "tune_gemm_in_file",
    "mgpu_tune_gemm_in_file",
    "set_rotating_buffer_size",
    "get_rotating_buffer_size",
    "set_numerical_check_tolerances",
)
# What 2.15 adds to __all__ (nothing was removed).
TUNABLE_API_215 = (
    "wildcard_fallback_enable",
    "wildcard_fallback_is_enabled",
    "set_cublaslt_requested_algo_count",
    "get_cublaslt_requested_algo_count",
    "dynamic_dims_mask",
)
if _V215:
    TUNABLE_API = TUNABLE_API + TUNABLE_API_215
else:
    for _name in TUNABLE_API_215:
        del globals()[_name]
tunable = types.ModuleType("torch.cuda.tunable")
tunable.__all__ = list(TUNABLE_API)  # type: ignore[attr-defined]
for _name in TUNABLE_API:
    setattr(tunable, _name, globals().pop(_name))  # torch.enable etc. do not exist
cuda.tunable = tunable  # type: ignore[attr-defined]
for _name in TUNABLE_API:  # a module's functions say where they live (inspect relies on it)
    getattr(tunable, _name).__module__ = "torch.cuda.tunable"
sys.modules["torch.cuda"] = cuda
sys.modules["torch.cuda.tunable"] = tunable
