"""Does an artifact fit its identity? The validators and solutions of a results file against the
GPU model's vendor, the torch of the image it was tuned in, and whether the model is a stand-in.

Pure code over what publish, merge, fetch and the operator have at hand. TunableOp itself only
compares validators with the loading process (and, on CUDA, throws on a solution it never
registered), so a file that does not fit would be published, marked Ready and then loaded as
nothing (or worse) by every model pod. Each refusal names the validator or solution and what was
expected, in words a user can act on:

* an NVIDIA model: no ROCm validator (GCN_ARCH_NAME, HIP_VERSION / ROCM_VERSION,
  ROCBLAS_VERSION, HIPBLASLT_VERSION) and no hipBLASLt / rocBLAS solution (Gemm_Hipblaslt_*,
  Gemm_Rocblas_*): CUDA torch registers neither and refuses the file whole;
* an AMD model: no CUDA validator (CUBLASLT_VERSION, CUDA_DEVICE), no cuBLASLt solution
  (Gemm_Cublaslt_*), and the ROCm validators a ROCm torch always writes;
* whatever the model: the identity's torch, cuda and hip agree with the validators and the
  solutions (a file is what one torch wrote), and PT_VERSION is what that torch writes
  (TORCH_VERSION's major.minor.patch, or the stand-in torch's whole version);
* stand-in output (PT_VERSION or torch marked ``+standin``: tunefleet's stand-in torch for tests
  and demos, which measures nothing) is for stand-in models only: model names that start with
  ``STANDIN`` (the local cluster's real node, ``STANDIN-NO-GPU``), or those the operator's
  ``standInModels`` setting lists (``*``: every model of a test fleet). A stand-in model names no
  GPU of any vendor, so the vendor rules do not apply to it; the rest do.

Validator names as torch registers them (Tunable.cpp, TunableGemm.h; design.md lists them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# Written only by ROCm builds of torch (ROCM_VERSION by older ones, HIP_VERSION by newer).
ROCM_VALIDATORS = ("GCN_ARCH_NAME", "HIP_VERSION", "ROCM_VERSION", "ROCBLAS_VERSION",
                   "HIPBLASLT_VERSION")  # fmt: skip
# Written only by CUDA builds of torch from 2.14 (with their cuBLASLt candidates).
CUDA_VALIDATORS = ("CUBLASLT_VERSION", "CUDA_DEVICE")
ROCM_SOLUTIONS = {"Gemm_Hipblaslt_": "hipBLASLt", "Gemm_Rocblas_": "rocBLAS"}
CUDA_SOLUTIONS = {"Gemm_Cublaslt_": "cuBLASLt"}
# What tunefleet's stand-in torch puts in torch.__version__ and so in PT_VERSION.
STAND_IN_MARK = "standin"
# GPU model label values that name no GPU (the local cluster's real node: STANDIN-NO-GPU).
STAND_IN_MODEL_PREFIX = "STANDIN"
VENDORS = {"nvidia": "NVIDIA", "amd": "AMD"}
_RELEASE_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class Target:
    """What the artifact is for: its GPU model, the model's vendor ("nvidia", "amd"; "" when
    unknown: the vendor rules are skipped) and whether the model is a stand-in (None: unknown,
    the stand-in rule is skipped)."""

    gpu_model: str
    vendor: str = ""
    stand_in: bool | None = None


def is_stand_in_model(gpu_model: str, stand_in_models: Sequence[str] = ()) -> bool:
    """A model that names no real GPU: the STANDIN prefix, or listed (``*``: every model)."""
    return gpu_model.upper().startswith(STAND_IN_MODEL_PREFIX) or any(
        m in ("*", gpu_model) for m in stand_in_models
    )


def is_stand_in(validators: Mapping[str, str], identity: Mapping[str, str]) -> bool:
    """Output of the stand-in torch: its mark in PT_VERSION or in the recorded torch."""
    marked = (validators.get("PT_VERSION", ""), identity.get("torch", ""))
    return any(STAND_IN_MARK in v.lower() for v in marked)


def expected_pt_version(torch_version: str) -> str | None:
    """The PT_VERSION a torch writes: TORCH_VERSION's major.minor.patch (``2.11.0+cu130`` ->
    ``2.11.0``); the stand-in torch writes its whole ``__version__``. None: not a version."""
    if STAND_IN_MARK in torch_version.lower():
        return torch_version
    m = _RELEASE_RE.match(torch_version)
    return m.group(0) if m else None


def _families(solutions: Iterable[str]) -> dict[str, list[str]]:
    """Solution names by the BLAS library they belong to (ROCm's and CUDA's, not Default)."""
    out: dict[str, list[str]] = {}
    for name in solutions:
        for prefix, library in {**ROCM_SOLUTIONS, **CUDA_SOLUTIONS}.items():
            if name.startswith(prefix):
                out.setdefault(library, []).append(name)
    return out


def _named(names: list[str]) -> str:
    more = f" and {len(names) - 1} more GEMM(s)" if len(names) > 1 else ""
    return f"{names[0]}{more}"


def _vendor_refusals(
    validators: Mapping[str, str], families: dict[str, list[str]], target: Target
) -> list[str]:
    model, vendor = target.gpu_model, target.vendor
    is_model = f"GPU model {model} is {VENDORS[vendor]} (spec.gpu.vendor {vendor})"
    out: list[str] = []
    if vendor == "nvidia":
        for key in (k for k in ROCM_VALIDATORS if k in validators):
            out.append(
                f"validator {key} ({validators[key]}) is written only by ROCm builds of torch, "
                f"but {is_model}: CUDA torch refuses the whole file. Tune in the CUDA build of "
                "the image that serves this model"
            )
        for library in ("hipBLASLt", "rocBLAS"):
            if library in families:
                out.append(
                    f"solution {_named(families[library])} is a {library} kernel, which only "
                    f"ROCm torch has, but {is_model}: CUDA torch registers Default (and, from "
                    "2.14, Gemm_Cublaslt_*) only. Tune in the CUDA build of the image that "
                    "serves this model"
                )
    elif vendor == "amd":
        for key in (k for k in CUDA_VALIDATORS if k in validators):
            out.append(
                f"validator {key} ({validators[key]}) is written only by CUDA builds of torch, "
                f"but {is_model}: ROCm torch refuses the whole file. Tune in the ROCm build of "
                "the image that serves this model"
            )
        if "cuBLASLt" in families:
            out.append(
                f"solution {_named(families['cuBLASLt'])} is a cuBLASLt kernel, which only CUDA "
                f"torch has, but {is_model}: ROCm torch registers Default, Gemm_Rocblas_* and "
                "Gemm_Hipblaslt_*. Tune in the ROCm build of the image that serves this model"
            )
        if not any(k in validators for k in ROCM_VALIDATORS):
            out.append(
                "the file has none of the validators ROCm torch writes ("
                f"{', '.join(ROCM_VALIDATORS)}), but {is_model}: ROCm torch requires them and "
                "loads nothing without. Tune in the ROCm build of the image that serves this model"
            )
    return out


def _consistency_refusals(
    validators: Mapping[str, str], families: dict[str, list[str]], identity: Mapping[str, str]
) -> list[str]:
    """What one torch writes holds together, whatever the model: validators, solutions and the
    recorded identity (hip on ROCm, cuda on CUDA) name one backend."""
    out: list[str] = []
    rocm = [k for k in ROCM_VALIDATORS if k in validators]
    cuda = [k for k in CUDA_VALIDATORS if k in validators]
    if rocm and cuda:
        out.append(
            f"validators {', '.join(rocm)} (ROCm) and {', '.join(cuda)} (CUDA) are in one file: "
            "no torch writes both, so no torch loads it. Publish the file one tuner wrote"
        )
    if not rocm:
        for library in ("hipBLASLt", "rocBLAS"):
            if library in families:
                out.append(
                    f"solution {_named(families[library])} is a {library} kernel, but the file "
                    "has no ROCm validator (GCN_ARCH_NAME, HIP_VERSION, ...): no torch that "
                    "writes these validators has that kernel. Publish the file one tuner wrote"
                )
    if rocm and "cuBLASLt" in families:
        out.append(
            f"solution {_named(families['cuBLASLt'])} is a cuBLASLt kernel, but the file has "
            f"ROCm validators ({', '.join(rocm)}): ROCm torch has no cuBLASLt kernel. Publish "
            "the file one tuner wrote"
        )
    if identity.get("hip") and cuda:
        out.append(
            f"validator {cuda[0]} is CUDA torch's, but the image it was tuned in has ROCm torch "
            f"(hip {identity['hip']}). Publish the file that torch wrote"
        )
    if identity.get("cuda") and rocm:
        out.append(
            f"validator {rocm[0]} is ROCm torch's, but the image it was tuned in has CUDA torch "
            f"(cuda {identity['cuda']}). Publish the file that torch wrote"
        )
    return out


def _stand_in_refusal(
    validators: Mapping[str, str], identity: Mapping[str, str], target: Target
) -> str:
    marked = [
        f"{what} {value}"
        for what, value in (
            ("PT_VERSION", validators.get("PT_VERSION", "")),
            ("torch", identity.get("torch", "")),
        )
        if STAND_IN_MARK in value.lower()
    ]
    return (
        f"{' and '.join(marked)} mark the output of tunefleet's stand-in torch (tests and demos: "
        f"it measures nothing), but GPU model {target.gpu_model} is not a stand-in model: no "
        "real torch loads it. Tune in the real inference image (or, on a test fleet where "
        f"{target.gpu_model} has no real GPU, list it in the operator's standInModels)"
    )


def _identity_refusals(identity: Mapping[str, str], target: Target) -> list[str]:
    """The torch the identity records (hip on ROCm, cuda on CUDA: tuner_job/gpu.py) against
    the model's vendor."""
    torch = identity.get("torch", "?")
    if target.vendor == "nvidia" and identity.get("hip"):
        return [
            f"it was tuned with ROCm torch ({torch}, hip {identity['hip']}), but GPU model "
            f"{target.gpu_model} is NVIDIA (spec.gpu.vendor nvidia): CUDA torch refuses the "
            "file. Tune in the CUDA build of the image that serves this model"
        ]
    if target.vendor == "amd" and identity.get("cuda"):
        return [
            f"it was tuned with CUDA torch ({torch}, cuda {identity['cuda']}), but GPU model "
            f"{target.gpu_model} is AMD (spec.gpu.vendor amd): ROCm torch refuses the file. "
            "Tune in the ROCm build of the image that serves this model"
        ]
    return []


def refusals(
    validators: Mapping[str, str],
    solutions: Iterable[str],
    identity: Mapping[str, str],
    target: Target,
) -> list[str]:
    """Why a results file (its validators and solutions) with this manifest identity (GPU,
    torch, cuda/hip) must not be served to ``target``; empty when it fits."""
    families = _families(solutions)
    out: list[str] = []
    if is_stand_in(validators, identity) and target.stand_in is False:
        out.append(_stand_in_refusal(validators, identity, target))
    if target.vendor in VENDORS and not target.stand_in:
        out += _vendor_refusals(validators, families, target)
        out += _identity_refusals(identity, target)
    out += _consistency_refusals(validators, families, identity)
    torch = identity.get("torch", "")
    expected = expected_pt_version(torch) if torch else None
    pt = validators.get("PT_VERSION")
    if pt is not None and expected is not None and pt != expected:
        out.append(
            f"validator PT_VERSION is {pt!r}, but the image it was tuned in has torch {torch}, "
            f"which writes and expects PT_VERSION {expected!r}: that torch did not write this "
            "file and loads nothing of it. Publish the file the tuner wrote in that image"
        )
    return out


def record_refusals(identity: Mapping[str, str], target: Target) -> list[str]:
    """What the operator can tell from an artifact record alone (its identity; the validators
    and solutions are not in it: publish and fetch check those): the torch it was tuned with
    against the model's vendor, and stand-in output on a model that is not a stand-in."""
    out: list[str] = []
    if is_stand_in({}, identity) and target.stand_in is False:
        out.append(_stand_in_refusal({}, identity, target))
    if target.vendor in VENDORS and not target.stand_in:
        out += _identity_refusals(identity, target)
    return out


def summary(found: Sequence[str], target: Target) -> str:
    """One message for a termination log or a condition: every refusal, joined."""
    return f"the artifact does not fit GPU model {target.gpu_model}: " + "; ".join(found)
