"""A stand-in for torch, for unit tests of tuner_job only (never used by scripts/gpu-check.sh).

It mimics what the tuner relies on from torch.cuda.tunable: record mode writing untuned rows to
$PYTORCH_TUNABLEOP_UNTUNED_FILENAME with the device ordinal before the last '.', tuning appending
results (validators first) to $PYTORCH_TUNABLEOP_FILENAME with %d replaced, and the mgpu path's
glob and replace("0", ...) quirks. Every call is logged as a JSON line to $FAKE_TORCH_LOG so tests
can check the sequence. The "results" it produces are fabricated, which is the point of a stub.

FAKE_TORCH_MODE: gpu (default) | cpu-build | no-device | broken
FAKE_TORCH_GPUS: device count (default 1); FAKE_TORCH_TUNE_SLEEP: seconds per tuned GEMM.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import time
import types
from typing import Any

MODE = os.environ.get("FAKE_TORCH_MODE", "gpu")
if MODE == "broken":
    raise ImportError("libcudart.so.13: cannot open shared object file: No such file or directory")

__version__ = "2.11.0+cpu" if MODE == "cpu-build" else "2.11.0+fake"
version = types.SimpleNamespace(cuda=None if MODE == "cpu-build" else "13.0", hip=None)


def _log(event: str, **fields: Any) -> None:
    path = os.environ.get("FAKE_TORCH_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


class dtype:
    def __init__(self, name: str, sig: str) -> None:
        self.name, self.sig = name, sig


bfloat16 = dtype("bfloat16", "BFloat16")
float16 = half = dtype("float16", "Half")
float32 = dtype("float32", "float")
float64 = dtype("float64", "double")
float8_e4m3fn = dtype("float8_e4m3fn", "Float8_e4m3fn")
float8_e5m2 = dtype("float8_e5m2", "Float8_e5m2")
float8_e4m3fnuz = dtype("float8_e4m3fnuz", "Float8_e4m3fnuz")
float8_e5m2fnuz = dtype("float8_e5m2fnuz", "Float8_e5m2fnuz")


class Tensor:
    def __init__(self, shape: tuple[int, ...], dt: dtype, transposed: bool = False) -> None:
        self.shape, self.dtype, self.transposed = shape, dt, transposed

    def t(self) -> Tensor:
        return Tensor((self.shape[1], self.shape[0]), self.dtype, not self.transposed)

    def transpose(self, a: int, b: int) -> Tensor:
        s = list(self.shape)
        s[a], s[b] = s[b], s[a]
        return Tensor(tuple(s), self.dtype, not self.transposed)

    def to(self, dt: dtype) -> Tensor:
        return Tensor(self.shape, dt, self.transposed)


def rand(*shape: int, dtype: dtype = float32, device: str = "cpu") -> Tensor:
    return Tensor(tuple(shape), dtype)


def tensor(value: float, device: str = "cpu") -> Tensor:
    return Tensor((), float32)


# --- torch.cuda -----------------------------------------------------------------------------

cuda = types.ModuleType("torch.cuda")
_state: dict[str, Any] = {"device": int(os.environ.get("FAKE_TORCH_CURRENT_DEVICE", "0"))}


def _gpus() -> int:
    return int(os.environ.get("FAKE_TORCH_GPUS", "1")) if MODE == "gpu" else 0


cuda.is_available = lambda: MODE == "gpu"  # type: ignore[attr-defined]
cuda.device_count = _gpus  # type: ignore[attr-defined]
cuda.current_device = lambda: _state["device"]  # type: ignore[attr-defined]
cuda.set_device = lambda i: _state.__setitem__("device", i)  # type: ignore[attr-defined]
cuda.synchronize = lambda: None  # type: ignore[attr-defined]
cuda.get_device_name = lambda i=0: "Fake GPU 80GB"  # type: ignore[attr-defined]
cuda.get_device_capability = lambda i=0: (9, 0)  # type: ignore[attr-defined]
cuda.get_device_properties = lambda i=0: types.SimpleNamespace(  # type: ignore[attr-defined]
    total_memory=80 * 1024**3, name="Fake GPU 80GB"
)

# --- torch.cuda.tunable ---------------------------------------------------------------------

tunable = types.ModuleType("torch.cuda.tunable")
_t: dict[str, Any] = {"enabled": False, "tuning": True, "record": False, "results": {}}
_t["validators"] = {"PT_VERSION": __version__}


def _env(name: str) -> str | None:
    return os.environ.get("PYTORCH_TUNABLEOP_" + name)


def _api(name: str) -> Any:
    def setter(value: Any = True) -> None:
        _t[name] = value
        _log(name, value=value)
        if name == "record_untuned_enable":
            _t["record"] = value
        if name == "enable":
            _t["enabled"] = value
        if name == "tuning_enable":
            _t["tuning"] = value

    return setter


for _name in (
    "enable",
    "tuning_enable",
    "record_untuned_enable",
    "set_max_tuning_duration",
    "set_max_tuning_iterations",
    "set_max_warmup_duration",
    "set_max_warmup_iterations",
    "set_rotating_buffer_size",
):
    setattr(tunable, _name, _api(_name))


def set_numerical_check_tolerances(enable: bool, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    _log("set_numerical_check_tolerances", value=[enable, atol, rtol])


def is_enabled() -> bool:
    return _env("ENABLED") == "1" or bool(_t["enabled"])


def tuning_is_enabled() -> bool:
    return _env("TUNING") != "0" and bool(_t["tuning"])


def _recording() -> bool:
    return _env("RECORD_UNTUNED") == "1" or bool(_t["record"])


def _ordinal_name(name: str, ordinal: int) -> str:
    if "%d" in name:
        return name.replace("%d", str(ordinal))
    dot = name.rfind(".")
    return name[:dot] + str(ordinal) + name[dot:] if dot >= 0 else name + str(ordinal)


def _append_result(path: str, op: str, params: str, solution: str, ms: float) -> None:
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", encoding="utf-8") as f:
        if new:
            for k, v in _t["validators"].items():
                f.write(f"Validator,{k},{v}\n")
        f.write(f"{op},{params},{solution},{ms:g}\n")


def _tune_line(line: str, ordinal: int) -> None:
    op, params = line.strip().split(",")[:2]
    time.sleep(float(os.environ.get("FAKE_TORCH_TUNE_SLEEP", "0")))
    ms = 0.001 * (len(params) % 97 + 1)
    solution = f"Gemm_Fake_{len(op) + len(params)}"
    _t["results"][(op, params)] = (solution, ms)
    target = _env("FILENAME") or "tunableop_results%d.csv"
    _append_result(_ordinal_name(target, ordinal), op, params, solution, ms)


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
    return {k: _env(k) for k in keys}


def tune_gemm_in_file(filename: str) -> None:
    assert is_enabled(), "TunableOp is not enabled"
    assert tuning_is_enabled(), "Tuning is not enabled"
    _log("tune_gemm_in_file", filename=filename, env=_limits_env())
    with open(filename, encoding="utf-8") as f:
        for line in f:
            if line.startswith(("Gemm", "ScaledGemm")):
                if "_7777_" in line:  # a GEMM this fake refuses, like torch's offline asserts
                    raise AssertionError("unsupported GEMM for offline tuning")
                _tune_line(line, _state["device"])


def mgpu_tune_gemm_in_file(filename_pattern: str, num_gpus: int) -> None:
    _log("mgpu_tune_gemm_in_file", pattern=filename_pattern, gpus=num_gpus, env=_limits_env())
    assert 1 <= num_gpus <= _gpus()
    lines: set[str] = set()
    for path in glob.glob(filename_pattern):
        with open(path, encoding="utf-8") as f:
            lines |= {ln for ln in f if ln.startswith(("Gemm", "ScaledGemm"))}
    for i, line in enumerate(sorted(lines)):
        _tune_line(line, i % num_gpus)
    # torch's _gather_tunableop_results, quirks included.
    env_name = _env("FILENAME") or "tunableop_results%d.csv"
    pattern = env_name.replace("%d", "?")
    matching = glob.glob(pattern)
    output = pattern.replace("?", "_full0")
    with open(output, "w", encoding="utf-8") as out:
        seen_validators = False
        body: set[str] = set()
        for path in matching:
            with open(path, encoding="utf-8") as f:
                for ln in f:
                    if ln.startswith("Validator"):
                        if not seen_validators:
                            out.write(ln)
                    else:
                        body.add(ln)
            seen_validators = True
        out.writelines(sorted(body))
    for i in range(1, len(matching)):
        shutil.copy(output, output.replace("0", str(i)))


def get_results() -> tuple[tuple[str, str, str, float], ...]:
    return tuple((op, p, s, ms) for (op, p), (s, ms) in sorted(_t["results"].items()))


def get_validators() -> tuple[tuple[str, str], ...]:
    return tuple(_t["validators"].items())


for _fn in (
    set_numerical_check_tolerances,
    is_enabled,
    tuning_is_enabled,
    tune_gemm_in_file,
    mgpu_tune_gemm_in_file,
    get_results,
    get_validators,
):
    setattr(tunable, _fn.__name__, _fn)

cuda.tunable = tunable  # type: ignore[attr-defined]
sys.modules["torch.cuda"] = cuda
sys.modules["torch.cuda.tunable"] = tunable


# --- GEMMs: in record mode, write the row the way TunableOp does ------------------------------


def _record(op: str, params: str) -> None:
    if not (is_enabled() and _recording()):
        return
    name = _env("UNTUNED_FILENAME") or "tunableop_untuned.csv"
    path = _ordinal_name(name.replace("%d", "\0"), _state["device"]).replace("\0", "%d")
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{op},{params}\n")


def _layout(a: Tensor, b: Tensor) -> tuple[str, str]:
    lay = ("T" if a.transposed else "N") + ("T" if b.transposed else "N")
    return lay, lay.lower()


def mm(a: Tensor, b: Tensor) -> Tensor:
    m, k = a.shape
    n = b.shape[1]
    lay, low = _layout(a, b)
    _record(f"GemmTunableOp_{a.dtype.sig}_{lay}", f"{low}_{m}_{n}_{k}_ld_{m}_{k}_{m}")
    return Tensor((m, n), a.dtype)


def bmm(a: Tensor, b: Tensor) -> Tensor:
    batch, m, k = a.shape
    n = b.shape[2]
    lay, low = _layout(a, b)
    sig = f"{low}_{m}_{n}_{k}_B_{batch}_ld_{m}_{k}_{m}"
    _record(f"GemmStridedBatchedTunableOp_{a.dtype.sig}_{lay}", sig)
    return Tensor((batch, m, n), a.dtype)


def _scaled_mm(a: Tensor, b: Tensor, **kw: Any) -> Tensor:
    m, k = a.shape
    n = b.shape[1]
    lay, low = _layout(a, b)
    out = kw.get("out_dtype", bfloat16)
    op = f"ScaledGemmTunableOp_{a.dtype.sig}_{b.dtype.sig}_{out.sig}_{lay}"
    _record(op, f"{low}_{m}_{n}_{k}_ld_{k}_{k}_{m}_rw_0_bias_None")
    return Tensor((m, n), out)
