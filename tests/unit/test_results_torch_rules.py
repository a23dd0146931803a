"""The parser reads what TunableOp reads (issue 17): the defects found against real torch.

Every vector here is synthetic, written to the rule it checks (modelled on what real files and
real torch 2.11/2.15 showed; tests/conformance checks the same rules against real torch).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner_job.library import gemm_cost, library_key, partition
from tuner_job.record import collect_untuned
from tuner_job.results import (
    CsvFormatError,
    ResultsFile,
    ValidatorMismatchError,
    check_validators,
    count_outcomes,
    format_results,
    merge_results,
    parse_op_signature,
    parse_param_signature,
    parse_results,
    parse_untuned,
)

CUDA211 = "Validator,PT_VERSION,2.11.0\n"
CUDA215 = (
    "Validator,PT_VERSION,2.15.0\nValidator,CUBLASLT_VERSION,130401\n"
    "Validator,CUDA_DEVICE,NVIDIA H200\n"
)
ROCM = (
    "Validator,PT_VERSION,2.11.0\nValidator,HIP_VERSION,713\n"
    "Validator,HIPBLASLT_VERSION,100300-0123456789\nValidator,GCN_ARCH_NAME,gfx1151\n"
    "Validator,ROCBLAS_VERSION,5.4.0.0123456789\n"
)
LT = "Gemm_Cublaslt_id_5_tile_20_stages_8_splitk_1_red_0_swizzle_0_custom_0_inner_0_cluster_0"

# Each GemmCommon.h Signature() form of torch 2.15 (CUDA and ROCm branches), instantiated.
FORMATS_215 = [
    ("GemmTunableOp_bfx9_NT", "nt_64_64_64_ld_64_64_64_compute_bf16x9_r"),
    ("GemmAndBiasTunableOp_bfx9_TN", "tn_512_256_128_ld_128_128_512_compute_bf16x9_r"),
    ("GemmStridedBatchedTunableOp_bfx9_NN", "nn_64_64_64_B_8_ld_64_64_64_compute_bf16x9_r"),
    (
        "ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN",
        "tn_4096_4096_4096_ld_4096_4096_4096_a_Float8_e4m3fn_b_Float8_e4m3fn_c_BFloat16"
        "_as_Float_bs_Float_ast_0_bst_0_dscale_0_fast_0_bias_None",
    ),
    (
        "ScaledGemmTunableOp_Float4_e2m1fn_x2_Float4_e2m1fn_x2_BFloat16_TN",
        "tn_256_512_1024_ld_1024_1024_256_a_Float4_e2m1fn_x2_b_Float4_e2m1fn_x2_c_BFloat16"
        "_as_Float8_e4m3fn_bs_Float8_e4m3fn_ast_2_bst_2_dscale_1_fast_1_bias_BFloat16",
    ),
    (
        "ScaledGemmTunableOp_Float8_e4m3fnuz_Float8_e4m3fnuz_Half_TN",
        "tn_4096_4096_4096_ld_4096_4096_4096_rw_1_bias_Half_swz_2_2",
    ),
    ("GemmTunableOp_BFloat16_TN", "tn_*_4096_4096_ld_4096_4096_*"),
    ("GemmStridedBatchedTunableOp_Half_NN", "nn_64_64_64_B_*_ld_64_64_64"),
    (
        "ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN",
        "tn_*_4096_4096_ld_4096_4096_*_rw_0_bias_None",
    ),
]


@pytest.mark.parametrize(("op", "params"), FORMATS_215, ids=[p for _, p in FORMATS_215])
def test_torch_215_signatures_are_accepted_by_results_untuned_record_and_library(
    op: str, params: str, tmp_path: Path
) -> None:
    """Defect: tuner_job/results.py refused _compute_bf16x9_r, CUDA's labelled ScaledGemm and
    ROCm's _swz_ (a 2.15 fp8 workload failed its whole tuning Job)."""
    validators = ROCM if "swz" in params or "fnuz" in op else CUDA215
    parsed = parse_results(
        f"{validators}{op},{params},{LT if 'fnuz' not in op else 'Default'},0.1\n"
    )
    assert [r.key for r in parsed.rows] == [(op, params)] and parsed.dropped == []
    sig = parse_param_signature(params, parse_op_signature(op))
    assert params.endswith(sig.rest) and (sig.rest != "" or "*" in params)
    (tmp_path / "workload_untuned0.csv").write_text(f"{op},{params}\n")
    ((_, recorded),) = collect_untuned(tmp_path)
    assert [r.key for r in recorded.rows] == [(op, params)]
    assert gemm_cost(recorded.rows[0]) > 0 and partition(recorded.rows, 2)
    assert library_key("M", parsed.validators, {}) == library_key("M", parsed.validators, {})


def test_unknown_suffix_of_a_newer_torch_is_kept_verbatim() -> None:
    params = "tn_64_64_64_ld_64_64_64_compute_tf32x3_r_newthing_7"
    parsed = parse_results(f"{CUDA215}GemmTunableOp_float_TN,{params},Default,0.1\n")
    assert format_results(parsed).splitlines()[-1] == f"GemmTunableOp_float_TN,{params},Default,0.1"
    assert parse_param_signature(params).rest == "_compute_tf32x3_r_newthing_7"


def test_a_leading_dimension_of_zero_is_read_as_torch_reads_it(tmp_path: Path) -> None:
    """Defect: 'nn_256_32_1_ld_0_1_256' (torch 2.11 on gfx1151) was refused: the record step
    failed, and a results file holding it was refused whole."""
    row = "GemmTunableOp_float_NN,nn_256_32_1_ld_0_1_256"
    parsed = parse_results(f"{ROCM}{row},Gemm_Hipblaslt_1669,0.0139878\n")
    assert parsed.gemms == 1 and parse_param_signature("nn_256_32_1_ld_0_1_256").lda == 0
    (tmp_path / "workload_untuned0.csv").write_text(f"{row}\n")
    ((_, recorded),) = collect_untuned(tmp_path)
    assert [r.params for r in recorded.rows] == ["nn_256_32_1_ld_0_1_256"]


def test_repeated_keys_keep_the_first_row_and_are_counted_not_fatal() -> None:
    """Defect: a file with keys written twice was refused whole ("already appears on line N")
    and the tuner dropped it as unfinished; torch keeps the first row of each key."""
    rows = [
        f"GemmAndBiasTunableOp_float_TN,tn_{i}_236_576_ld_576_576_{i},Gemm_Hipblaslt_{i},0.03\n"
        for i in range(100, 140)
    ]
    again = [
        "GemmAndBiasTunableOp_float_TN,tn_100_236_576_ld_576_576_100,Gemm_Hipblaslt_9,0.02\n",
        "GemmAndBiasTunableOp_float_TN,tn_101_236_576_ld_576_576_101,Gemm_Hipblaslt_8,0.01\n",
    ]
    parsed = parse_results(ROCM + "".join(rows + again), "r.csv")
    assert parsed.gemms == 40
    chosen = {r.params.split("_")[1]: r.solution for r in parsed.rows}
    assert chosen["100"] == "Gemm_Hipblaslt_100" and chosen["101"] == "Gemm_Hipblaslt_101"
    assert parsed.duplicates == [(46, 6), (47, 7)]
    (warning,) = parsed.warnings("r.csv")
    assert "2 GEMM key(s) appear more than once" in warning and "46<-6" in warning


@pytest.mark.parametrize(
    "row",
    [
        "GemmTunableOp_float_NT,nt_64_64_64_ld_64_64_64,0.0403",  # the solution lost
        "GemmTunableOp_float_NT,nt_64_64_64_ld_64_64_64,123,0.01",  # a number as solution
        "GemmTunableOp_float_NT,nt_64_64_64_ld_64_64_64,,0.01",  # no solution
    ],
)
def test_a_row_torch_would_load_as_garbage_is_dropped_and_never_counted_as_tuned(row: str) -> None:
    """Defect: 'op,params,0.0403' was accepted and counted as a tuned GEMM."""
    good = "GemmTunableOp_float_NT,nt_8_8_8_ld_8_8_8,Gemm_Rocblas_-1140857036,0.02\n"
    parsed = parse_results(ROCM + good + row + "\n")
    assert [r.params for r in parsed.rows] == ["nt_8_8_8_ld_8_8_8"]
    assert count_outcomes(parsed).to_dict() == {"tuned": 1, "default": 0}
    assert len(parsed.dropped) == 1 and row not in format_results(parsed)


def test_cuda_torch_before_214_keeps_only_default_rows() -> None:
    """On CUDA torch 2.11 only Default is registered: a row naming another solution loads but
    makes its GEMM throw (TunableOp.h TORCH_CHECK), so it must never be published."""
    text = (
        CUDA211
        + "GemmTunableOp_BFloat16_TN,tn_64_64_64_ld_64_64_64,Default,0.01\n"
        + f"GemmTunableOp_BFloat16_TN,tn_128_64_64_ld_64_64_128,{LT},0.01\n"
    )
    parsed = parse_results(text)
    assert [r.solution for r in parsed.rows] == ["Default"]
    assert "registers only Default" in parsed.dropped[0].reason
    assert parse_results(text.replace("2.11.0", "2.15.0") + CUDA215[28:]).gemms == 2


def test_one_bad_row_never_drops_the_whole_file() -> None:
    rows = "".join(
        f"GemmTunableOp_float_NT,nt_{i}_64_64_ld_64_64_{i},Gemm_Rocblas_{i},0.01\n"
        for i in range(1, 50)
    )
    for bad in ("x\n", "a,b\n", "GemmTunableOp_float_NT,hello world,Default,1\n", "op,p,\x00,1\n"):
        assert parse_results(ROCM + rows + bad + rows.replace("_64_64_ld", "_32_64_ld")).gemms == 98


def test_validators_are_checked_as_torch_checks_them() -> None:
    parsed = parse_results(CUDA211 + "Validator,HIP_VERSION,702\n")
    check_validators(parse_results(CUDA211), {"PT_VERSION": "2.11.0"})
    with pytest.raises(ValidatorMismatchError, match='"HIP_VERSION" is provided'):
        check_validators(parsed, {"PT_VERSION": "2.11.0"})
    with pytest.raises(ValidatorMismatchError, match=r"'2\.11\.0', this torch '2\.15\.0'"):
        check_validators(parse_results(CUDA211), {"PT_VERSION": "2.15.0"})


def test_merge_of_files_with_repeats_is_the_first_rows_merged() -> None:
    a = parse_results(ROCM + "GemmTunableOp_Half_TN,tn_8_8_8_ld_8_8_8,Gemm_Rocblas_1,0.5\n" * 2)
    merged = merge_results([a, ResultsFile(dict(a.validators), [])])
    assert merged.gemms == 1 and merged.duplicates == []


def test_crlf_file_is_refused_but_a_crlf_row_only_drops_that_row() -> None:
    with pytest.raises(CsvFormatError, match="CRLF"):
        parse_results(CUDA211.replace("\n", "\r\n"))
    parsed = parse_results(CUDA211 + "GemmTunableOp_Half_TN,tn_8_8_8_ld_8_8_8,Default\r\n")
    assert parsed.gemms == 0 and "CRLF" in parsed.dropped[0].reason


def test_untuned_rows_with_new_formats_are_kept_for_tuning() -> None:
    text = "".join(f"{op},{p}\n" for op, p in FORMATS_215)
    assert len(parse_untuned(text).rows) == len(FORMATS_215)


_ROW = "GemmTunableOp_float_NT,nt_64_64_64_ld_64_64_64,Default,0.01\n"
_LAST = "GemmTunableOp_float_NT,nt_128_128_128_ld_128_128_128,Default,0.0234"
_BLAS = ",BLAS_PARAMS: - { function: matmul, M: 128, N: 128, transA: 'N' }"


@pytest.mark.parametrize(
    ("last", "ms", "blas"),
    [
        pytest.param(_LAST, 0.0234, None, id="complete"),
        pytest.param(_LAST[:-2], 0.02, None, id="time-cut-short"),  # torch reads 0.02 too
        pytest.param(_LAST[: _LAST.rindex(",") + 1], 0.0, None, id="time-empty"),
        pytest.param(_LAST + _BLAS, 0.0234, _BLAS[1:], id="with-blas-tail"),
        pytest.param(_LAST + _BLAS[:30], 0.0234, None, id="blas-tail-cut"),
    ],
)
def test_a_complete_last_row_without_its_newline_is_loaded_as_torch_loads_it(
    last: str, ms: float, blas: str | None
) -> None:
    """torch reads lines with std::getline: a last line without '\\n' is still a line, and
    2.11 loads it. Its solution ended with a comma, so only the time (or a BLAS tail) can be
    short; the row is kept (a cut BLAS tail is left out)."""
    parsed = parse_results(CUDA211 + _ROW + last)
    assert not parsed.dropped
    assert [r.params for r in parsed.rows] == [
        "nt_64_64_64_ld_64_64_64",
        "nt_128_128_128_ld_128_128_128",
    ]
    assert parsed.rows[1].torch_ms == ms and parsed.rows[1].blas == blas
    assert parsed.rows[1].line == 3
    # What is published ends in a newline again, and reads back the same.
    again = parse_results(format_results(parsed))
    assert {(r.key, r.solution) for r in again.rows} == {(r.key, r.solution) for r in parsed.rows}


@pytest.mark.parametrize(
    "last",
    [
        pytest.param(_LAST[: _LAST.rindex(",")], id="ends-after-solution"),  # Default or Defa..?
        pytest.param(_LAST[:56], id="solution-cut"),  # "...,Defa"
    ],
)
def test_a_last_row_cut_before_its_time_is_still_dropped(last: str) -> None:
    """Without a comma after the solution, the solution (or a signature) may be a fragment of
    another GEMM's: a deliberate difference from torch (docs/tuner.md, `cut-off`)."""
    parsed = parse_results(CUDA211 + _ROW + last)
    assert [r.params for r in parsed.rows] == ["nt_64_64_64_ld_64_64_64"]
    (dropped,) = parsed.dropped
    assert dropped.rule == "cut-off" and dropped.line == 3
