"""record.py and gpu.py against torch-shaped objects: the build-dependent shape checks, the check
of what torch recorded, and the ROCm identity of old and new validator sets."""

from __future__ import annotations

import types
from typing import Any

import pytest

from tuner_job.config import Shape
from tuner_job.gpu import EXIT_USAGE, TunerError, identify
from tuner_job.record import check_shapes, torch_release, verify_recorded
from tuner_job.results import UntunedRow


def fake_torch(version: str, hip: str | None = None) -> Any:
    return types.SimpleNamespace(
        __version__=version, version=types.SimpleNamespace(cuda=None if hip else "13.0", hip=hip)
    )


FP8 = Shape(64, 128, 64, dtype="float8_e4m3fn", trans_b=True)


@pytest.mark.parametrize(
    ("version", "release"),
    [("2.11.0+cu130", (2, 11)), ("2.14.0a0+git1234", (2, 14)), ("garbage", (0, 0))],
)
def test_torch_release(version: str, release: tuple[int, int]) -> None:
    assert torch_release(fake_torch(version)) == release


def test_float8_on_cuda_is_refused_before_2_14_and_only_warned_after() -> None:
    with pytest.raises(TunerError) as err:
        check_shapes(fake_torch("2.13.1+cu130"), [Shape(8, 8, 8), FP8])
    assert err.value.exit_code == EXIT_USAGE
    assert str(err.value).startswith("workload.shapes[1] (m=64 n=128 k=64 batch=1 float8_e4m3fn")
    warned: list[str] = []
    check_shapes(fake_torch("2.14.0+cu130"), [FP8], log=warned.append)
    assert len(warned) == 1 and "checked after recording" in warned[0]
    check_shapes(fake_torch("2.11.0+rocm7.0", hip="7.0"), [FP8], log=warned.append)
    assert len(warned) == 1  # ROCm routes _scaled_mm through TunableOp: nothing to say


def row(op: str, params: str) -> UntunedRow:
    return UntunedRow(op, params)


def test_verify_accepts_what_torch_records_for_each_shape() -> None:
    shapes = [
        Shape(256, 512, 128, trans_b=True, bias=True),
        Shape(256, 512, 128, dtype="float", tf32=True),
        Shape(64, 64, 32, batch=8, dtype="half"),
        Shape(64, 128, 64, dtype="float8_e4m3fnuz", trans_b=True),
    ]
    rows = [
        row("GemmAndBiasTunableOp_BFloat16_TN", "tn_512_256_128_ld_128_128_512"),
        row("GemmTunableOp_tf32_NN", "nn_512_256_128_ld_512_128_512"),
        row("GemmStridedBatchedTunableOp_Half_NN", "nn_64_64_32_B_8_ld_64_32_64"),
        row(
            "ScaledGemmTunableOp_Float8_e4m3fnuz_Float8_e4m3fnuz_BFloat16_TN",
            "tn_128_64_64_ld_64_64_128_rw_0_bias_None",
        ),
    ]
    verify_recorded(shapes, rows)


@pytest.mark.parametrize(
    ("shape", "rows", "fragments"),
    [
        pytest.param(
            Shape(256, 512, 128, dtype="float32", tf32=True),
            [row("GemmTunableOp_float_NN", "nn_512_256_128_ld_512_128_512")],
            ["as GemmTunableOp_tf32", "recorded GemmTunableOp_float", "HIPBLASLT_ALLOW_TF32"],
            id="tf32-not-honoured",
        ),
        pytest.param(
            Shape(256, 512, 128, trans_b=True, bias=True),
            [row("GemmTunableOp_BFloat16_TN", "tn_512_256_128_ld_128_128_512")],
            ["as GemmAndBiasTunableOp_BFloat16", "bias path"],
            id="bias-path-not-taken",
        ),
        pytest.param(
            Shape(256, 512, 128),
            [row("GemmTunableOp_BFloat16_NN", "nn_512_256_64_ld_512_64_512")],
            ["nothing of that size"],
            id="other-size",
        ),
    ],
)
def test_verify_names_a_shape_torch_recorded_otherwise(
    shape: Shape, rows: list[UntunedRow], fragments: list[str]
) -> None:
    with pytest.raises(TunerError) as err:
        verify_recorded(
            [Shape(8, 8, 8), shape], [row("GemmTunableOp_BFloat16_NN", "nn_8_8_8"), *rows]
        )
    assert "workload.shapes[1]" in str(err.value)
    for fragment in fragments:
        assert fragment in str(err.value)


def rocm_torch(validators: dict[str, str]) -> Any:
    props = types.SimpleNamespace(total_memory=192 * 1024**3, gcnArchName="gfx942:sramecc+:xnack-")
    cuda = types.SimpleNamespace(
        tunable=types.SimpleNamespace(get_validators=lambda: tuple(validators.items())),
        get_device_properties=lambda i: props,
        get_device_name=lambda i: "AMD Instinct MI300X",
        device_count=lambda: 8,
    )
    return types.SimpleNamespace(
        __version__="2.11.0+rocm7.0",
        version=types.SimpleNamespace(hip="7.0.1", cuda=None),
        cuda=cuda,
    )


def test_rocm_identity_maps_hip_version_of_recent_torch_and_rocm_version_of_older() -> None:
    recent = {"PT_VERSION": "2.11.0+rocm7.0", "HIP_VERSION": "70051831", "ROCBLAS_VERSION": "5.0"}
    identity, validators = identify(rocm_torch(recent))
    assert validators == recent
    assert identity["hipVersion"] == "70051831" and "rocm" not in identity
    assert (identity["hip"], identity["rocblas"], identity["arch"]) == (
        "7.0.1",
        "5.0",
        "gfx942:sramecc+:xnack-",
    )
    older = {"PT_VERSION": "2.5.1+rocm6.2", "ROCM_VERSION": "6.2.41133-dd7f95766"}
    identity, _ = identify(rocm_torch(older))
    assert identity["rocm"] == "6.2.41133-dd7f95766" and "hipVersion" not in identity
