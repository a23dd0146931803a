"""Probes of a torch's TunableOp, run as a subprocess under the torch being probed.

    <python> tests/conformance/probe.py <probe> [ARGS]      (prints one JSON document)

The project's own venv never imports torch: tests/conformance runs this script with the
interpreter of a real-torch venv (hack/torch-venvs.sh) or, for the stand-in, with
PYTHONPATH=tests/unit/data/fake_torch. Standard library only (and the torch under test).

Probes (no GPU needed; what each needs was found on the real 2.11.0 and 2.15.0 wheels):

  api                 the torch.cuda.tunable API (public functions and signatures, __all__),
                      torch.__version__, get_validators() (or its error), the module's file,
                      the defaults of the getters, and what the setters refuse
  env-names           every PYTORCH_TUNABLEOP_* name in torch's shared libraries (the stand-in:
                      in its source), i.e. what torch reads
  no-device           which calls raise when torch sees no GPU, in an order that keeps each
                      call's state its own
  read FILE...        read_file(FILE) for each file, each in a fresh results manager (a forked
                      child): whether it loaded, get_results(), torch's warnings
  record-lazy FILE    with PYTORCH_TUNABLEOP_RECORD_UNTUNED=1 set before torch starts and
                      set_filename(FILE): does get_results() load FILE lazily, and does an
                      explicit read_file(FILE) load it
  lazy FILE           the same without record-untuned (the control)
  capture-hook FILE   started with tunefleet's capture hook first on PYTHONPATH and
                      PYTORCH_TUNABLEOP_RECORD_UNTUNED=1: whether importing torch queued the
                      hook's load for CUDA's initialisation (and initialised nothing), and
                      whether that queued call, run as CUDA's initialisation runs it, loads
                      FILE while recording (set_filename(FILE) first: without a GPU the default
                      name needs the device ordinal)

read: set_filename(<a fresh path>) comes first. Without it get_results() needs the device
ordinal and raises without a GPU; and get_results() also reads the path set there and merges
its rows, so the path must not exist.
"""

from __future__ import annotations

import inspect
import json
import mmap
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any


def _first(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def _num(x: float) -> Any:
    # NaN and inf times are possible (times are parsed C-style): keep the JSON valid.
    return x if x == x and x not in (float("inf"), float("-inf")) else repr(x)


def _tunable() -> Any:
    import torch.cuda.tunable as tunable

    return tunable


def _fresh_filename(tunable: Any) -> None:
    tmp = tempfile.mkdtemp(prefix="tf-probe-")
    tunable.set_filename(os.path.join(tmp, "none.csv"))


def _results(tunable: Any) -> dict[tuple[str, str], tuple[str, float]]:
    return {(str(o), str(p)): (str(s), float(ms)) for o, p, s, ms in tunable.get_results()}


def probe_api() -> dict[str, Any]:
    import torch

    tunable = _tunable()
    functions = {
        name: str(inspect.signature(fn))
        for name, fn in inspect.getmembers(tunable, inspect.isfunction)
        if not name.startswith("_") and fn.__module__ == tunable.__name__
    }
    out: dict[str, Any] = {
        "version": str(torch.__version__),
        "module": str(getattr(tunable, "__file__", "") or ""),
        "torch_dir": str(Path(torch.__file__).resolve().parent),
        "all": sorted(getattr(tunable, "__all__", []) or []),
        "functions": functions,
        "cuda": getattr(torch.version, "cuda", None),
        "hip": getattr(torch.version, "hip", None),
    }
    try:
        out["validators"] = [list(v) for v in tunable.get_validators()]
    except Exception as e:  # 2.15: its validators need CUDA
        out["validators"] = _first(e)
    getters = {}
    for name in (
        "is_enabled",
        "tuning_is_enabled",
        "record_untuned_is_enabled",
        "get_max_tuning_duration",
        "get_max_tuning_iterations",
        "get_cublaslt_requested_algo_count",
        "wildcard_fallback_is_enabled",
        "get_filename",
    ):
        if hasattr(tunable, name):
            try:
                getters[name] = getattr(tunable, name)()
            except Exception as e:
                getters[name] = _first(e)
    out["defaults"] = getters
    refused = {}
    for label, call in (
        ("tolerances(True, 0, 0)", lambda: tunable.set_numerical_check_tolerances(True, 0.0, 0.0)),
        (
            "tolerances(True, -1, 1e-2)",
            lambda: tunable.set_numerical_check_tolerances(True, -1.0, 1e-2),
        ),
        (
            "tolerances(False, -1, 0)",
            lambda: tunable.set_numerical_check_tolerances(False, -1.0, 0.0),
        ),
        (
            "tolerances(True, nan, 1)",
            lambda: tunable.set_numerical_check_tolerances(True, float("nan"), 1.0),
        ),
        (
            "tolerances(True, 1e-2, 1e-2)",
            lambda: tunable.set_numerical_check_tolerances(True, 1e-2, 1e-2),
        ),
        ("rotating(-1)", lambda: tunable.set_rotating_buffer_size(-1)),
        ("rotating(0)", lambda: tunable.set_rotating_buffer_size(0)),
        ("rotating(64)", lambda: tunable.set_rotating_buffer_size(64)),
    ):
        try:
            call()
            refused[label] = None
        except Exception as e:
            refused[label] = _first(e)
    out["setters"] = refused
    clamps = {}
    for setter, getter, value in (
        ("set_max_tuning_duration", "get_max_tuning_duration", -5),
        ("set_max_tuning_iterations", "get_max_tuning_iterations", -3),
        ("set_cublaslt_requested_algo_count", "get_cublaslt_requested_algo_count", 0),
        ("set_cublaslt_requested_algo_count", "get_cublaslt_requested_algo_count", 32),
    ):
        if hasattr(tunable, setter):
            getattr(tunable, setter)(value)
            clamps[f"{setter}({value})"] = getattr(tunable, getter)()
    out["clamps"] = clamps
    return out


_ENV_RE = re.compile(rb"PYTORCH_TUNABLEOP_[A-Z0-9_]+")


def probe_env_names() -> dict[str, Any]:
    import torch

    root = Path(torch.__file__).resolve().parent
    names: set[str] = set()
    scanned = []
    libs = sorted((root / "lib").glob("*.so*")) if (root / "lib").is_dir() else []
    sources = libs or sorted(root.rglob("*.py"))  # the stand-in has no libraries
    for path in sources:
        with path.open("rb") as f:
            try:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file
                continue
            with data:
                found = {m.group(0).decode() for m in _ENV_RE.finditer(data)}
        if found:
            scanned.append(path.name)
        names |= found
    py = set()
    for path in sorted(root.rglob("tunable.py")) or [Path(torch.__file__)]:
        py |= {m.group(0).decode() for m in _ENV_RE.finditer(path.read_bytes())}
    return {"names": sorted(names), "files": scanned, "python": sorted(py)}


def probe_no_device(work: str) -> dict[str, Any]:
    tunable = _tunable()
    untuned = Path(work) / "untuned.csv"
    untuned.write_text("GemmTunableOp_float_NT,nt_64_64_64_ld_64_64_64\n", encoding="utf-8")
    out: dict[str, Any] = {}

    def attempt(label: str, call: Any) -> None:
        try:
            value = call()
            out[label] = {"ok": True, "value": repr(value)[:200]}
        except BaseException as e:  # we report what it raised
            out[label] = {"ok": False, "error": _first(e)}

    # Order matters: get_results() before any filename is set, then the ordinal-inserting
    # set_filename, then the rest.
    attempt("get_results() before set_filename", tunable.get_results)
    attempt("set_filename(x, True)", lambda: tunable.set_filename(str(Path(work) / "r.csv"), True))
    attempt("get_rotating_buffer_size()", tunable.get_rotating_buffer_size)
    tunable.enable(True)
    tunable.tuning_enable(True)
    attempt("tune_gemm_in_file(f)", lambda: tunable.tune_gemm_in_file(str(untuned)))
    attempt(
        "mgpu_tune_gemm_in_file(p, 1)",
        lambda: tunable.mgpu_tune_gemm_in_file(str(Path(work) / "untuned*.csv"), 1),
    )
    attempt("get_validators()", tunable.get_validators)
    return out


def _read_one(tunable: Any, path: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": path, "loaded": False, "rows": [], "warnings": []}
    _fresh_filename(tunable)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            entry["loaded"] = bool(tunable.read_file(path))
        except Exception as e:
            entry["error"] = _first(e)
        try:
            rows = _results(tunable)
        except Exception as e:  # e.g. UnicodeDecodeError on a non-UTF-8 solution
            entry["error"] = _first(e)
            rows = {}
    entry["warnings"] = [str(w.message).strip().splitlines()[0] for w in caught]
    entry["warnings"] = [w for w in entry["warnings"] if "NumPy" not in w]
    entry["rows"] = [[k[0], k[1], v[0], _num(v[1])] for k, v in sorted(rows.items())]
    return entry


def probe_read(paths: list[str]) -> list[dict[str, Any]]:
    """Each file in a forked child of one process that imported torch: every read starts
    from an empty results manager (2.11 has no way to clear it), at the cost of a fork."""
    tunable = _tunable()
    out = []
    for path in paths:
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: read, report, leave without running any atexit of torch's
            os.close(rfd)
            try:
                data = json.dumps(_read_one(tunable, path)).encode()
            except BaseException as e:  # we report what it raised
                data = json.dumps({"path": path, "loaded": False, "rows": [], "error": _first(e)})
                data = data.encode()  # type: ignore[attr-defined]
            with os.fdopen(wfd, "wb") as f:
                f.write(data)
            os._exit(0)
        os.close(wfd)
        with os.fdopen(rfd, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        if not data:
            out.append({"path": path, "loaded": False, "rows": [], "error": f"child {status}"})
        else:
            out.append(json.loads(data))
    return out


class _Stderr:
    """TunableOp's log goes to C++ std::cerr: capture fd 2 while torch runs."""

    def __enter__(self) -> _Stderr:
        sys.stderr.flush()
        self.file = tempfile.TemporaryFile(mode="w+b")
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        self.lines = self.file.read().decode("utf-8", "replace").splitlines()


def probe_lazy(path: str) -> dict[str, Any]:
    """Whether the results manager's lazy start reads the file (its log says so at
    PYTORCH_TUNABLEOP_VERBOSE=3: "reading tuning results from ..."), and what loads."""
    os.environ["PYTORCH_TUNABLEOP_VERBOSE"] = "3"
    tunable = _tunable()
    out: dict[str, Any] = {}
    with _Stderr() as lazy:
        tunable.set_filename(path)
        out["record_untuned"] = tunable.record_untuned_is_enabled()
        out["lazy_rows"] = len(tunable.get_results())
    out["lazy_read"] = any("reading tuning results from" in ln for ln in lazy.lines)
    with _Stderr() as explicit:
        out["read_file"] = bool(tunable.read_file(path))
        out["explicit_rows"] = len(tunable.get_results())
    out["explicit_read"] = any("reading tuning results from" in ln for ln in explicit.lines)
    return out


def probe_capture_hook(path: str) -> dict[str, Any]:
    """What tunefleet's capture hook (operator/tunefleet/capture/hook.py, installed as
    sitecustomize on PYTHONPATH) does under this torch, without a GPU."""
    import torch

    cuda = torch.cuda
    queued = [c for c, _ in getattr(cuda, "_queued_calls", [])]
    names = [getattr(c, "__name__", "") for c in queued]
    out: dict[str, Any] = {
        "hook": "sitecustomize" in sys.modules
        and "capture hook" in (sys.modules["sitecustomize"].__doc__ or ""),
        "queued": "_tunefleet_load_results" in names,
        "initialized": bool(cuda.is_initialized()),
    }
    tunable = _tunable()
    os.environ["PYTORCH_TUNABLEOP_VERBOSE"] = "3"
    tunable.set_filename(path)
    out["record_untuned"] = tunable.record_untuned_is_enabled()
    with _Stderr() as log:
        for call in queued:
            if getattr(call, "__name__", "") == "_tunefleet_load_results":
                call()  # as torch.cuda._lazy_init runs its queued calls
        try:
            out["rows"] = len(tunable.get_results())
        except Exception as e:  # 2.15 without a device: its validators need one
            out["rows"] = f"{type(e).__name__}: {e}"
    out["reads"] = sum("reading tuning results from" in ln for ln in log.lines)
    out["hook_said"] = [ln for ln in log.lines if "[tunefleet capture]" in ln]
    return out


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write(__doc__ or "")
        return 2
    probe, args = argv[0], argv[1:]
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    if probe == "api":
        doc: Any = probe_api()
    elif probe == "env-names":
        doc = probe_env_names()
    elif probe == "no-device":
        doc = probe_no_device(tempfile.mkdtemp(prefix="tf-probe-"))
    elif probe == "read":
        doc = probe_read(args)
    elif probe == "record-lazy":
        os.environ["PYTORCH_TUNABLEOP_RECORD_UNTUNED"] = "1"
        doc = probe_lazy(args[0])
    elif probe == "lazy":
        doc = probe_lazy(args[0])
    elif probe == "capture-hook":
        doc = probe_capture_hook(args[0])
    else:
        sys.stderr.write(f"unknown probe {probe!r}\n")
        return 2
    print(json.dumps(doc, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
