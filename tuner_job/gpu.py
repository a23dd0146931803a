"""torch, the GPU and the machine's identity. torch is imported here, lazily, and nowhere else
at module level, so `--help`, the CSV code and the no-GPU path work in images without it."""

from __future__ import annotations

import ctypes
import importlib
import os
import re
from pathlib import Path
from typing import Any

from .library import partition_name

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_GPU = 3


class TunerError(Exception):
    """A failure the tuner reports as one line, with an exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def import_torch() -> Any:
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising anything at import
        raise TunerError(
            f"torch is not importable in this image ({type(exc).__name__}: {exc})", EXIT_NO_GPU
        ) from None
    return torch


def require_gpu(torch: Any, gpus: int = 1) -> None:
    """TunableOp is part of torch's CUDA/ROCm backend: without a device there is nothing to tune."""
    version = getattr(torch, "__version__", "?")
    tv = getattr(torch, "version", None)
    if not getattr(tv, "cuda", None) and not getattr(tv, "hip", None):
        raise TunerError(
            f"TunableOp needs a ROCm or CUDA GPU: torch {version} is a CPU-only build "
            "(torch.version.cuda and torch.version.hip are both None)",
            EXIT_NO_GPU,
        )
    if not torch.cuda.is_available():
        raise TunerError(
            f"TunableOp needs a ROCm or CUDA GPU: torch {version} reports no GPU device "
            "(torch.cuda.is_available() is False)",
            EXIT_NO_GPU,
        )
    count = int(torch.cuda.device_count())
    if gpus > count:
        raise TunerError(
            f"the profile asks for {gpus} GPUs but torch {version} sees {count}", EXIT_NO_GPU
        )
    try:
        importlib.import_module("torch.cuda.tunable")
    except Exception:
        raise TunerError(
            f"torch {version} has no torch.cuda.tunable (TunableOp); use torch >= 2.6",
            EXIT_NO_GPU,
        ) from None


def require_offline_api(torch: Any, gpus: int) -> None:
    tunable = torch.cuda.tunable
    # One process per GPU calls tune_gemm_in_file on its share (tune.py): no mgpu needed.
    needed = ["tune_gemm_in_file", "get_results", "get_validators", "set_filename"]
    missing = [name for name in needed if not hasattr(tunable, name)]
    if missing:
        raise TunerError(
            f"torch {torch.__version__} lacks torch.cuda.tunable.{', '.join(missing)} "
            "(offline tuning needs a newer torch)",
            EXIT_NO_GPU,
        )


def _loaded_library(pattern: str) -> str | None:
    """Path of a shared library already mapped into this process (torch links the BLAS ones)."""
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    rx = re.compile(pattern)
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if path.startswith("/") and rx.search(Path(path).name):
            return path
    return None


def _cublas_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    lt = _loaded_library(r"^libcublasLt\.so")
    if lt:
        try:
            fn = ctypes.CDLL(lt).cublasLtGetVersion
            fn.restype = ctypes.c_size_t
            v = int(fn())
            out["cublasLt"] = f"{v // 10000}.{(v // 100) % 100}.{v % 100}"
        except (OSError, AttributeError):
            pass
    blas = _loaded_library(r"^libcublas\.so")
    if blas:
        try:
            get = ctypes.CDLL(blas).cublasGetProperty
            parts = []
            for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
                value = ctypes.c_int()
                if get(prop, ctypes.byref(value)) != 0:
                    raise OSError("cublasGetProperty failed")
                parts.append(str(value.value))
            out["cublas"] = ".".join(parts)
        except (OSError, AttributeError):
            pass
    return out


def _driver(is_rocm: bool) -> str:
    if is_rocm:
        try:
            return "amdgpu " + Path("/sys/module/amdgpu/version").read_text().strip()
        except OSError:
            return "unknown"
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        m = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d[\w.-]*)", text)
        if m:
            return m.group(1)
    except OSError:
        pass
    lib = _loaded_library(r"^libcuda\.so")
    if lib:
        try:
            value = ctypes.c_int()
            if ctypes.CDLL(lib).cuDriverGetVersion(ctypes.byref(value)) == 0:
                v = value.value
                return f"CUDA driver API {v // 1000}.{(v % 1000) // 10}"
        except (OSError, AttributeError):
            pass
    return "unknown"


# Where the amdgpu driver shows a GPU's partition modes (what the AMD device plugin reads).
_AMD_PARTITION_GLOB = "module/amdgpu/drivers/pci:amdgpu/*/current_compute_partition"
_MIG_NAME_RE = re.compile(r"\bMIG\s+((?:\d+c\.)?\d+g\.\d+gb)\b", re.IGNORECASE)


def _sysfs() -> Path:
    return Path(os.environ.get("TUNEFLEET_SYSFS", "/sys"))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def amd_partition(props: Any, root: Path | None = None) -> tuple[str, str]:
    """(compute, memory) partition modes of the device, from the amdgpu driver's sysfs files
    (current_compute_partition, current_memory_partition): its PCI function when torch names
    it, else every amdgpu device when they agree. ('', '') where the driver has none."""
    root = root or _sysfs()
    candidates = []
    bus = getattr(props, "pci_bus_id", None)
    if isinstance(bus, int):
        domain = int(getattr(props, "pci_domain_id", 0) or 0)
        device = int(getattr(props, "pci_device_id", 0) or 0)
        candidates = [root / "bus" / "pci" / "devices" / f"{domain:04x}:{bus:02x}:{device:02x}.0"]
    found = [c for c in candidates if (c / "current_compute_partition").exists()]
    if not found:
        found = [p.parent for p in sorted(root.glob(_AMD_PARTITION_GLOB))]
    modes = {
        (
            _read(d / "current_compute_partition").lower(),
            _read(d / "current_memory_partition").lower(),
        )
        for d in found
    }
    return modes.pop() if len(modes) == 1 else ("", "")


def mig_profile(name: str) -> str:
    """The MIG profile in a device name ('NVIDIA A100-SXM4-40GB MIG 1g.5gb' -> '1g.5gb')."""
    m = _MIG_NAME_RE.search(name)
    return m.group(1).lower() if m else ""


def identify(torch: Any) -> tuple[dict[str, str], dict[str, str]]:
    """(identity, validators): what the manifest records about this machine.

    CUDA builds validate little beyond PT_VERSION, so identity carries what a results file
    silently depends on: GPU, arch, driver, toolkit and BLAS library versions.
    """
    tunable = torch.cuda.tunable
    validators = {str(k): str(v) for k, v in tunable.get_validators()}
    hip = getattr(torch.version, "hip", None)
    props = torch.cuda.get_device_properties(0)
    name = str(torch.cuda.get_device_name(0))
    identity: dict[str, str] = {
        "gpuName": name,
        "gpuCount": str(torch.cuda.device_count()),
        "gpuMemoryMiB": str(int(props.total_memory) // (1024 * 1024)),
        "torch": str(torch.__version__),
        "driver": _driver(bool(hip)),
    }
    count = getattr(props, "multi_processor_count", None)
    if isinstance(count, int):  # CUs on ROCm, SMs on CUDA: a partition has fewer
        identity["multiProcessorCount"] = str(count)
    if hip:
        compute, memory = amd_partition(props)
        if compute:
            identity["computePartition"] = compute
        if memory:
            identity["memoryPartition"] = memory
        identity["partition"] = partition_name(compute, memory)
    else:
        mig = mig_profile(name)
        if mig:
            identity["migProfile"] = mig
        identity["partition"] = partition_name(mig=mig)
    if hip:
        identity["hip"] = str(hip)
        identity["arch"] = str(getattr(props, "gcnArchName", "") or "unknown")
        for key, name in (
            ("ROCBLAS_VERSION", "rocblas"),
            ("HIPBLASLT_VERSION", "hipblaslt"),
            # Recent torch validates HIP_VERSION (TORCH_HIP_VERSION of its build); older torch
            # wrote ROCM_VERSION instead. Either, as found, so old and new files both describe.
            ("HIP_VERSION", "hipVersion"),
            ("ROCM_VERSION", "rocm"),
        ):
            if key in validators:
                identity[name] = validators[key]
    else:
        identity["cuda"] = str(torch.version.cuda)
        major, minor = torch.cuda.get_device_capability(0)
        identity["computeCapability"] = f"{major}.{minor}"
        identity["arch"] = f"sm_{major}{minor}"
        identity.update(_cublas_versions())
    return identity, validators
