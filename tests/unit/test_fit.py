"""Artifacts fit their identity (artifacts/fit.py): validators and solutions against the GPU
model's vendor, PT_VERSION against the torch it was tuned with, stand-in output only for
stand-in models; publish refuses before uploading, fetch before a pod uses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.builders.wrappers import make_job, make_pod
from tunefleet.artifacts import fetch, fit, publish
from tunefleet.reconciler.diagnose import Hints
from tunefleet.reconciler.observe import observe_job
from tuner_job.manifest import ArtifactId
from tuner_job.output import RunFacts, write_output
from tuner_job.results import ResultsFile, parse_results, read_results

DATA = Path(__file__).parent / "data"
H100 = fit.Target("NVIDIA-H100-80GB-HBM3", "nvidia", False)
MI300X = fit.Target("AMD_Instinct_MI300X_OAM", "amd", False)
CUDA_IDENTITY = {"torch": "2.15.0+cu132", "cuda": "13.2"}
ROCM_IDENTITY = {"torch": "2.11.0+rocm7.0", "hip": "7.0.51831"}
ROW = "GemmTunableOp_BFloat16_TN,tn_4096_4096_4096_ld_4096_4096_4096"


def check(results: ResultsFile, identity: dict[str, str], target: fit.Target) -> list[str]:
    return fit.refusals(results.validators, (r.solution for r in results.rows), identity, target)


def results(validators: dict[str, str], solution: str) -> ResultsFile:
    head = "".join(f"Validator,{k},{v}\n" for k, v in validators.items())
    return parse_results(f"{head}{ROW},{solution},0.5\n")


def test_real_results_files_fit_their_vendor() -> None:
    assert check(read_results(DATA / "cuda_results.csv"), CUDA_IDENTITY, H100) == []
    assert check(read_results(DATA / "rocm_results.csv"), ROCM_IDENTITY, MI300X) == []
    assert check(read_results(DATA / "results_blaslog.csv"), ROCM_IDENTITY, MI300X) == []


def test_a_rocm_validator_on_an_nvidia_model_is_refused() -> None:
    found = check(read_results(DATA / "rocm_results.csv"), {"torch": "2.11.0"}, H100)
    text = "\n".join(found)
    assert "validator GCN_ARCH_NAME (gfx942:sramecc+:xnack-) is written only by ROCm" in text
    assert "NVIDIA-H100-80GB-HBM3 is NVIDIA" in text and "CUDA build" in text


def test_a_hipblaslt_solution_on_an_nvidia_model_is_refused() -> None:
    found = check(results({"PT_VERSION": "2.15.0"}, "Gemm_Hipblaslt_1219"), {}, H100)
    assert any("solution Gemm_Hipblaslt_1219 is a hipBLASLt kernel" in f for f in found), found


def test_a_rocblas_solution_on_an_nvidia_model_is_refused() -> None:
    validators = {"PT_VERSION": "2.15.0", "CUBLASLT_VERSION": "130401"}
    found = check(results(validators, "Gemm_Rocblas_42"), {}, H100)
    assert any("solution Gemm_Rocblas_42 is a rocBLAS kernel" in f for f in found), found


def test_cublaslt_on_an_amd_model_is_refused() -> None:
    found = check(read_results(DATA / "cuda_results.csv"), CUDA_IDENTITY, MI300X)
    text = "\n".join(found)
    assert "validator CUBLASLT_VERSION (130401) is written only by CUDA builds" in text
    assert "validator CUDA_DEVICE (NVIDIA H200)" in text
    assert "is a cuBLASLt kernel" in text and "and 2 more GEMM(s)" in text
    assert "none of the validators ROCm torch writes" in text
    assert "tuned with CUDA torch (2.15.0+cu132, cuda 13.2)" in text


def test_pt_version_must_be_what_the_recorded_torch_writes() -> None:
    rows = read_results(DATA / "cuda_results.csv")
    found = check(rows, {"torch": "2.11.0+cu130", "cuda": "13.0"}, H100)
    assert found == [
        "validator PT_VERSION is '2.15.0', but the image it was tuned in has torch 2.11.0+cu130, "
        "which writes and expects PT_VERSION '2.11.0': that torch did not write this file and "
        "loads nothing of it. Publish the file the tuner wrote in that image"
    ]
    assert fit.expected_pt_version("2.11.0+standin") == "2.11.0+standin"


def test_stand_in_output_is_for_stand_in_models_only() -> None:
    validators = {"PT_VERSION": "2.15.0+standin", "CUBLASLT_VERSION": "x", "CUDA_DEVICE": "y"}
    rows = results(validators, "Default")
    identity = {"torch": "2.15.0+standin", "cuda": "13.2"}
    (found,) = check(rows, identity, H100)
    assert found.startswith("PT_VERSION 2.15.0+standin and torch 2.15.0+standin mark the output")
    assert "list it in the operator's standInModels" in found
    assert check(rows, identity, fit.Target(H100.gpu_model, "nvidia", True)) == []
    # A stand-in model names no GPU: its vendor's rules do not apply, consistency does.
    rocm = {"PT_VERSION": "2.11.0+standin", "HIP_VERSION": "0-standin"}
    standin = fit.Target("STANDIN-NO-GPU", "nvidia", fit.is_stand_in_model("STANDIN-NO-GPU"))
    assert check(results(rocm, "Gemm_Rocblas_7"), {"torch": "2.11.0+standin"}, standin) == []
    assert fit.is_stand_in_model("NVIDIA-H200", ("*",))
    assert not fit.is_stand_in_model("NVIDIA-H200", ("NVIDIA-H100-80GB-HBM3",))


def test_what_one_torch_wrote_holds_together_whatever_the_vendor() -> None:
    unknown = fit.Target("NVIDIA-H200")
    found = check(results({"PT_VERSION": "2.15.0"}, "Gemm_Hipblaslt_1"), {}, unknown)
    assert found and "has no ROCm validator" in found[0]
    assert check(results({"PT_VERSION": "2.15.0"}, "Default"), {}, unknown) == []


def _output(tmp_path: Path, text: str, identity: dict[str, str], model: str) -> Path:
    out = tmp_path / "out"
    write_output(
        out,
        parse_results(text),
        ArtifactId(namespace="ns", profile="p", revision="r1", gpu_model=model),
        RunFacts(recorded=1, identity=identity, seconds=1.0, tool_version="test"),
    )
    return out


def test_publish_refuses_with_the_reason_in_its_termination_message(tmp_path: Path) -> None:
    text = (DATA / "rocm_results.csv").read_text()
    out = _output(tmp_path, text, {"torch": "2.11.0", "hip": "7.0"}, H100.gpu_model)
    store = tmp_path / "store"
    log = tmp_path / "termination-log"
    code = publish.main(
        [
            "--dir", str(out), "--uri", f"file://{store}", "--namespace", "ns",
            "--profile", "p", "--gpu-model", H100.gpu_model, "--gpu-vendor", "nvidia",
            "--termination-log", str(log),
        ]
    )  # fmt: skip
    message = log.read_text()
    assert code == 1 and message.startswith("tunefleet-publish: error: the artifact does not fit")
    assert "validator GCN_ARCH_NAME" in message and "Gemm_Hipblaslt_" in message
    assert not store.exists() or not any(p.is_file() for p in store.rglob("*"))  # nothing uploaded


def test_publish_takes_output_that_fits(tmp_path: Path) -> None:
    text = (DATA / "rocm_results.csv").read_text()
    out = _output(tmp_path, text, ROCM_IDENTITY, MI300X.gpu_model)
    log = tmp_path / "termination-log"
    code = publish.main(
        [
            "--dir", str(out), "--uri", f"file://{tmp_path / 'store'}", "--namespace", "ns",
            "--profile", "p", "--gpu-model", MI300X.gpu_model, "--gpu-vendor", "amd",
            "--termination-log", str(log),
        ]
    )  # fmt: skip
    assert code == 0, log.read_text()


def test_fetch_refuses_a_mismatching_artifact_before_a_pod_uses_it(tmp_path: Path) -> None:
    text = "Validator,PT_VERSION,2.15.0\n" + f"{ROW},Gemm_Hipblaslt_12,0.5\n"
    out = _output(tmp_path, text, {"torch": "2.15.0"}, H100.gpu_model)
    base = tmp_path / "store" / "ns" / "p" / H100.gpu_model
    manifest = json.loads((out / "manifest.json").read_text())
    sha = manifest["resultsSha256"]
    (base / sha).mkdir(parents=True)
    for name in ("results.csv", "manifest.json"):
        (base / sha / name).write_bytes((out / name).read_bytes())
    with pytest.raises(fetch.FetchError, match="hipBLASLt kernel"):
        fetch.download_verified(fetch.Pinned(f"file://{base / sha}", sha, gpu_model=H100.gpu_model))


def test_the_operator_does_not_serve_a_record_that_does_not_fit() -> None:
    record = {
        "uri": "s3://b/ns/p/m/" + "a" * 64,
        "sha256": "a" * 64,
        "identity": {"torch": "2.11.0+standin", "hip": "0-standin"},
    }
    job = (
        make_job(ns="ns")
        .uid("u1")
        .revision("r1")
        .gpu_model(H100.gpu_model)
        .set("spec", "completions", value=1)
        .condition("Complete")
        .obj()
    )
    pod = make_pod("tune-x-0", "ns").created("2026-01-01T00:00:00Z")
    pods = [pod.terminated("publish", 0, json.dumps(record)).obj()]
    taken = observe_job(job, pods, Hints())  # vendor unknown: taken as it is
    assert taken.state == "Succeeded"
    refused = observe_job(job, pods, Hints(gpu_vendor="nvidia"))
    assert refused.state == "Failed" and "is not served" in refused.message
    assert "tuned with ROCm torch" in refused.message and "stand-in" in refused.message
    on_test_fleet = observe_job(job, pods, Hints(gpu_vendor="nvidia", stand_in_models=("*",)))
    assert on_test_fleet.state == "Succeeded"
