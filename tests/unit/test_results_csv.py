"""The one TunableOp CSV parser: real formats in, malformed files out with line numbers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tuner_job.results import (
    CsvFormatError,
    Outcomes,
    ResultRow,
    ResultsFile,
    ValidatorMismatchError,
    count_outcomes,
    dedupe_untuned,
    format_results,
    merge_results,
    parse_op_signature,
    parse_param_signature,
    parse_results,
    parse_untuned,
    read_results,
    read_untuned,
)

DATA = Path(__file__).parent / "data"


def raw_rows(path: Path) -> list[list[str]]:
    """An independent reading of a sample: split lines by comma, ignore validators."""
    return [
        line.split(",")
        for line in path.read_text().splitlines()
        if line and not line.startswith("Validator,")
    ]


def test_rocm_results_file_parses_with_every_validator_and_row() -> None:
    path = DATA / "rocm_results.csv"
    parsed = read_results(path)
    expected_validators = {
        line.split(",")[1]: line.split(",")[2]
        for line in path.read_text().splitlines()
        if line.startswith("Validator,")
    }
    assert parsed.validators == expected_validators
    assert "GCN_ARCH_NAME" in parsed.validators
    rows = raw_rows(path)
    assert [(r.op, r.params, r.solution, r.ms_text) for r in parsed.rows] == [
        tuple(r) for r in rows
    ]
    assert [r.line for r in parsed.rows] == list(range(7, 7 + len(rows)))


def test_families_and_parameter_signatures_are_understood() -> None:
    parsed: dict[str, ResultRow] = {}
    for r in read_results(DATA / "rocm_results.csv").rows:
        parsed.setdefault(r.op.split("TunableOp_")[0], r)  # first row of each family
    assert set(parsed) == {"Gemm", "GemmStridedBatched", "GemmAndBias", "ScaledGemm"}

    batched = parsed["GemmStridedBatched"]
    sig = parse_param_signature(batched.params, parse_op_signature(batched.op))
    assert (sig.trans_a, sig.trans_b, sig.m, sig.n, sig.k, sig.batch) == (
        "t",
        "n",
        128,
        128,
        64,
        256,
    )
    assert (sig.lda, sig.ldb, sig.ldc) == (64, 64, 128)

    scaled = parsed["ScaledGemm"]
    op = parse_op_signature(scaled.op)
    assert op.family == "ScaledGemm" and op.layout == "TN"
    assert op.types.startswith("Float8_e4m3fnuz_Float8_e4m3fnuz_")
    assert parse_param_signature(scaled.params, op).rest.startswith("_rw_")


def test_wildcard_dimensions_of_recent_torch_parse_as_unknown() -> None:
    op = parse_op_signature("GemmTunableOp_BFloat16_TN")
    sig = parse_param_signature("tn_*_4096_4096_ld_4096_4096_*", op)
    assert sig.m is None and sig.ldc is None and sig.n == 4096


def test_cuda_legacy_and_blaslog_results_parse() -> None:
    cuda = read_results(DATA / "cuda_results.csv")
    assert list(cuda.validators) == ["PT_VERSION", "CUBLASLT_VERSION", "CUDA_DEVICE"]
    assert cuda.gemms == len(raw_rows(DATA / "cuda_results.csv"))

    legacy = read_results(DATA / "legacy_results.csv")
    assert [r.params for r in legacy.rows] == ["nt_25088_4096_64", "nt_4096_4096_64"]

    blas = read_results(DATA / "results_blaslog.csv").rows[0]
    assert blas.ms == pytest.approx(0.512)
    assert blas.blas is not None and blas.blas.startswith("BLAS_PARAMS: - { function: matmul,")
    assert blas.blas.endswith("compute_type: f32_r }")


def test_untuned_files_parse_including_blas_params() -> None:
    rows = read_untuned(DATA / "untuned0.csv").rows
    assert [(r.op, r.params) for r in rows] == [tuple(r) for r in raw_rows(DATA / "untuned0.csv")]
    blas = read_untuned(DATA / "untuned_blaslog.csv").rows
    assert len(blas) == 2 and all(r.blas and "function: matmul" in r.blas for r in blas)


def test_format_is_canonical_and_round_trips() -> None:
    original = read_results(DATA / "rocm_results.csv")
    text = format_results(original)
    again = parse_results(text)
    assert again.validators == original.validators
    assert {(r.key, r.solution, r.ms_text) for r in again.rows} == {
        (r.key, r.solution, r.ms_text) for r in original.rows
    }
    shuffled = list(original.rows)
    random.Random(7).shuffle(shuffled)
    reordered = ResultsFile(dict(reversed(list(original.validators.items()))), shuffled)
    assert format_results(reordered) == text  # same content, same bytes, same SHA-256
    assert text.startswith("Validator,")
    blas_text = (DATA / "results_blaslog.csv").read_text()
    assert format_results(parse_results(blas_text)) == blas_text


V = "Validator,PT_VERSION,2.11.0\n"
# A ROCm file's validators: a CUDA file of torch 2.11 (PT_VERSION alone) can hold Default only.
ROCM_V = (
    "Validator,PT_VERSION,2.11.0\nValidator,HIP_VERSION,702\nValidator,HIPBLASLT_VERSION,1-a\n"
    "Validator,ROCBLAS_VERSION,5.2.0\nValidator,GCN_ARCH_NAME,gfx942:sramecc+:xnack-\n"
)
GOOD = "GemmTunableOp_BFloat16_TN,tn_64_64_64_ld_64_64_64,Gemm_Hipblaslt_1,0.01\n"


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        pytest.param(GOOD, 0, "no Validator,PT_VERSION", id="no-pt-version"),
        pytest.param(
            V + GOOD + "Validator,PT_VERSION,2.10.0\n", 3, "on line 1", id="conflicting-validator"
        ),
        pytest.param("Validator,pt_version,2.11.0\n", 0, "no Validator,PT_VERSION", id="key-case"),
        pytest.param("Validator,PT_VERSION,\n" + GOOD, 0, "no Validator,PT", id="empty-value"),
        # TunableOp splits on \n only: PT_VERSION would read "2.11.0\r" and the file be dropped.
        pytest.param(V.replace("\n", "\r\n") + GOOD, 1, "CRLF line ending", id="crlf-first-line"),
        pytest.param(V + GOOD + V.replace(",2.11", ",2.\x0011"), 3, "NUL", id="nul-validator"),
        pytest.param("\ufeff" + V + GOOD, 1, "byte-order mark (BOM)", id="bom"),
    ],
)
def test_what_makes_torch_drop_the_whole_file_is_refused_with_its_line(
    text: str, line: int, fragment: str
) -> None:
    with pytest.raises(CsvFormatError) as err:
        parse_results(text, "sample.csv")
    assert err.value.line == line
    assert fragment in err.value.message
    prefix = f"sample.csv:{line}: " if line else "sample.csv: "
    assert str(err.value).startswith(prefix)


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        pytest.param(GOOD[:60], "no newline", id="truncated-last-line"),
        pytest.param(
            "GemmTunableOp_BFloat16_TN,tn_4096_4096_4096_ld_4096_40,Default,0.1",
            "unexpected trailing",
            id="cut-parameter-signature",
        ),
        pytest.param(
            "GemmTunableOp_BFloat16_TN,tn_64_64_64_ld_64_64_64", "2 field(s)", id="two-fields"
        ),
        pytest.param("# a comment", "1 field(s)", id="comment"),
        pytest.param(GOOD.replace("_TN,", "_NN,").strip(), "disagrees", id="layout-mismatch"),
        pytest.param("MatmulOp_BFloat16_TN,tn_1_1_1_ld_1_1_1,x,1", "TunableOp_", id="bad-op"),
        pytest.param(
            GOOD.replace("Gemm_Hipblaslt_1", "Gemm Hipblaslt").strip(), "spaces", id="space"
        ),
        pytest.param(GOOD.replace("Gemm_Hipblaslt_1", "").strip(), "no solution", id="no-solution"),
        pytest.param(
            "GemmTunableOp_BFloat16_TN,tn_64_64_64_ld_64_64_64,0.0403",
            "a number where the solution goes",
            id="lost-solution",
        ),
        pytest.param(
            "GemmStridedBatchedTunableOp_float_NN,nn_64_64_64_ld_64_64_64,Default,0.1",
            "no _B_",
            id="batched-without-batch",
        ),
        pytest.param(
            "GemmTunableOp_float_NN,nn_64_64_64_B_2_ld_64_64_64,Default,0.1",
            "has a batch part",
            id="plain-with-batch",
        ),
        pytest.param(GOOD.replace("Hipblaslt", "Hip\x00blaslt").strip(), "NUL", id="nul-byte"),
        pytest.param(GOOD.strip() + "\r", "CRLF line ending", id="crlf-row"),
        pytest.param(GOOD.replace(",0.01", ",0.01\r,").strip(), "carriage return", id="bare-cr"),
        pytest.param("Validator,FOO", "needs 3 fields", id="validator-2-fields"),
    ],
)
def test_a_bad_row_is_dropped_with_its_line_and_the_rest_kept(bad: str, fragment: str) -> None:
    other = "GemmTunableOp_BFloat16_TN,tn_8_8_8_ld_8_8_8,Gemm_Hipblaslt_2,0.02\n"
    text = ROCM_V + other + bad + ("\n" if "no newline" not in fragment else "")
    parsed = parse_results(text, "sample.csv")
    assert [r.params for r in parsed.rows] == ["tn_8_8_8_ld_8_8_8"]
    (dropped,) = parsed.dropped
    assert dropped.line == 7 and fragment in dropped.reason, dropped
    assert parsed.warnings("sample.csv")[0].startswith("sample.csv:7: ")


def test_rows_are_read_as_torch_reads_them() -> None:
    text = (
        "Validator,PT_VERSION,2.11.0,ignored\n"  # extra fields of a validator are ignored
        "\n   \n"
        "GemmTunableOp_float_NN,nn_256_32_1_ld_0_1_256,Default,0.25ms\n"  # ld 0; atof
        "GemmTunableOp_float_NN,nn_0_32_1_ld_1_1_1,Default\n"  # a zero dim; 3 fields: time 0
        "GemmTunableOp_float_NT,nt_64_64_64_ld_64_64_64,Default,0.01,extra,fields\n"
        "GemmTunableOp_float_NT,nt_8_8_8_ld_8_8_8,Default,0.5,\n"  # a trailing comma
        "GemmTunableOp_BFloat16_TN,tn_*_4096_4096_ld_4096_4096_*,Default,abc\n"
    )
    parsed = parse_results(text)
    assert parsed.validators == {"PT_VERSION": "2.11.0"}
    got = {r.params: (r.solution, r.torch_ms, r.ms) for r in parsed.rows}
    assert got == {
        "nn_256_32_1_ld_0_1_256": ("Default", 0.25, None),
        "nn_0_32_1_ld_1_1_1": ("Default", 0.0, None),
        "nt_64_64_64_ld_64_64_64": ("Default", 0.01, 0.01),
        "nt_8_8_8_ld_8_8_8": ("Default", 0.5, 0.5),
        "tn_*_4096_4096_ld_4096_4096_*": ("Default", 0.0, None),
    }
    assert parsed.dropped == [] and parsed.duplicates == []


def test_non_utf8_bytes_drop_their_row_or_refuse_a_validator(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    bad_row = b"GemmTunableOp_BFloat16_TN,tn_1_1_1_ld_1_1_1,G\xff,1\n"
    path.write_bytes(ROCM_V.encode() + GOOD.encode() + bad_row)
    parsed = read_results(path)
    assert parsed.gemms == 1 and "UTF-8" in parsed.dropped[0].reason
    path.write_bytes(b"Validator,PT_VERSION,2.11.0\xe9\n" + GOOD.encode())
    with pytest.raises(CsvFormatError) as err:
        read_results(path)
    assert err.value.line == 1 and "UTF-8" in err.value.message


def test_an_untuned_file_drops_rows_the_offline_tuner_cannot_rebuild() -> None:
    text = (
        "GemmTunableOp_BFloat16_TN,tn_1_1_1_ld_1_1_1\n"
        + GOOD  # a results row: 4 fields
        + "GemmTunableOp_BFloat16_TN\n"
        + "GemmTunableOp_BFloat16_TN,tn_1_1_1_ld_1_1_1\n"  # again: torch writes it once
        + "GemmTunableOp_float_NN,nn_256_32_1_ld_0_1_256\n"
    )
    parsed = parse_untuned(text, "untuned0.csv")
    assert [r.params for r in parsed.rows] == ["tn_1_1_1_ld_1_1_1", "nn_256_32_1_ld_0_1_256"]
    assert [(d.line, "2 fields" in d.reason) for d in parsed.dropped] == [(2, True), (3, True)]
    with pytest.raises(CsvFormatError, match="results file"):
        parse_untuned("Validator,PT_VERSION,2.11.0\n", "untuned0.csv")


def test_require_rows_refuses_a_file_with_only_validators() -> None:
    assert parse_results(V).gemms == 0
    with pytest.raises(CsvFormatError, match="no tuned GEMM rows"):
        parse_results(V, require_rows=True)


def test_dedupe_across_device_files_keeps_first_seen_order() -> None:
    files = [read_untuned(DATA / "untuned0.csv"), read_untuned(DATA / "untuned1.csv")]
    unique = dedupe_untuned(files)
    expected: list[tuple[str, str]] = []
    for name in ("untuned0.csv", "untuned1.csv"):
        for op, params in raw_rows(DATA / name):
            if (op, params) not in expected:
                expected.append((op, params))
    assert [r.key for r in unique] == expected
    assert len(unique) < sum(len(f.rows) for f in files)  # the samples do overlap
    assert unique[0].source.endswith("untuned0.csv")


def row(op: str, params: str, solution: str, ms: str | None) -> ResultRow:
    return ResultRow(op, params, solution, ms)


OP = "GemmTunableOp_BFloat16_TN"


def test_merge_is_a_union_where_the_faster_solution_wins() -> None:
    validators = {"PT_VERSION": "2.11.0", "GCN_ARCH_NAME": "gfx942"}
    a = ResultsFile(
        dict(validators),
        [
            row(OP, "tn_1_1_1_ld_1_1_1", "Gemm_Rocblas_1", "0.50"),
            row(OP, "tn_2_2_2_ld_2_2_2", "Gemm_Rocblas_2", "0.20"),
            row(OP, "tn_4_4_4_ld_4_4_4", "Default", None),
        ],
    )
    b = ResultsFile(
        dict(validators),
        [
            row(OP, "tn_1_1_1_ld_1_1_1", "Gemm_Hipblaslt_9", "0.25"),
            row(OP, "tn_2_2_2_ld_2_2_2", "Gemm_Hipblaslt_8", "0.30"),
            row(OP, "tn_3_3_3_ld_3_3_3", "Gemm_Hipblaslt_7", "0.10"),
            row(OP, "tn_4_4_4_ld_4_4_4", "Gemm_Hipblaslt_6", "9.0"),
        ],
    )
    merged = merge_results([a, b])
    chosen = {r.params: r.solution for r in merged.rows}
    assert chosen == {
        "tn_1_1_1_ld_1_1_1": "Gemm_Hipblaslt_9",  # 0.25 < 0.50
        "tn_2_2_2_ld_2_2_2": "Gemm_Rocblas_2",  # 0.20 < 0.30
        "tn_3_3_3_ld_3_3_3": "Gemm_Hipblaslt_7",  # only in b
        "tn_4_4_4_ld_4_4_4": "Gemm_Hipblaslt_6",  # a timed row beats one without a time
    }
    assert merged.validators == validators
    assert format_results(merge_results([b, a])) == format_results(merged)
    assert parse_results(format_results(merged)).gemms == 4


def test_merge_refuses_results_tuned_under_different_validators() -> None:
    a = ResultsFile({"PT_VERSION": "2.11.0", "GCN_ARCH_NAME": "gfx942"}, [])
    b = ResultsFile({"PT_VERSION": "2.11.0", "GCN_ARCH_NAME": "gfx90a"}, [])
    with pytest.raises(ValidatorMismatchError, match="GCN_ARCH_NAME"):
        merge_results([a, b])


def test_crlf_and_bom_messages_say_what_to_do() -> None:
    with pytest.raises(CsvFormatError) as crlf:
        parse_results((V + GOOD).replace("\n", "\r\n"), "r.csv")
    assert str(crlf.value).startswith("r.csv:1: CRLF line ending")
    assert "LF line endings" in crlf.value.message
    untuned = parse_untuned("GemmTunableOp_BFloat16_TN,tn_1_1_1_ld_1_1_1\r\n", "u0.csv")
    assert untuned.rows == [] and "CRLF" in untuned.dropped[0].reason
    with pytest.raises(CsvFormatError) as bom:
        parse_results("\ufeff" + V + GOOD, "r.csv")
    assert "without a BOM" in bom.value.message and "signature" not in bom.value.message


def test_bom_in_a_file_on_disk_is_refused_as_a_bom(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (V + GOOD).encode())
    with pytest.raises(CsvFormatError, match="byte-order mark"):
        read_results(path)


def test_a_timed_solution_beats_a_default_placeholder_in_either_order() -> None:
    # ResultEntry::Default() is ("Default", 0.0): no measurement, so it must not win on "0 ms".
    validators = {"PT_VERSION": "2.11.0"}
    placeholder = ResultsFile(dict(validators), [row(OP, "tn_1_1_1_ld_1_1_1", "Default", "0")])
    timed = ResultsFile(dict(validators), [row(OP, "tn_1_1_1_ld_1_1_1", "Gemm_Rocblas_7", "0.3")])
    for files in ([placeholder, timed], [timed, placeholder]):
        (winner,) = merge_results(files).rows
        assert (winner.solution, winner.ms_text) == ("Gemm_Rocblas_7", "0.3")


def test_a_measured_default_competes_on_its_time() -> None:
    validators = {"PT_VERSION": "2.11.0"}
    measured = ResultsFile(dict(validators), [row(OP, "tn_1_1_1_ld_1_1_1", "Default", "0.1")])
    slower = ResultsFile(dict(validators), [row(OP, "tn_1_1_1_ld_1_1_1", "Gemm_Rocblas_7", "0.3")])
    assert merge_results([slower, measured]).rows[0].solution == "Default"
    assert merge_results([measured, slower]).rows[0].solution == "Default"


def test_merge_is_order_independent_for_every_permutation() -> None:
    import itertools

    key = "tn_1_1_1_ld_1_1_1"
    candidates = [
        row(OP, key, "Default", "0"),
        row(OP, key, "Default", None),
        row(OP, key, "Gemm_Hipblaslt_2", None),
        row(OP, key, "Gemm_Hipblaslt_1", "0.2"),
        row(OP, key, "Gemm_Rocblas_1", "0.2"),  # a tie on time: the name decides
        row(OP, key, "Gemm_Rocblas_9", "0.50"),
    ]
    files = [ResultsFile({"PT_VERSION": "2.11.0"}, [c]) for c in candidates]
    outputs = {format_results(merge_results(list(p))) for p in itertools.permutations(files)}
    assert len(outputs) == 1
    assert ",Gemm_Hipblaslt_1,0.2\n" in outputs.pop()


def test_merge_keeps_a_placeholder_only_when_nothing_was_measured() -> None:
    key = "tn_1_1_1_ld_1_1_1"
    files = [
        ResultsFile({"PT_VERSION": "2.11.0"}, [row(OP, key, "Gemm_Hipblaslt_2", None)]),
        ResultsFile({"PT_VERSION": "2.11.0"}, [row(OP, key, "Default", "0")]),
    ]
    assert merge_results(files).rows[0].solution == "Default"  # by name, deterministically


def test_validator_mismatch_names_both_values_of_each_differing_key() -> None:
    a = ResultsFile({"PT_VERSION": "2.11.0", "GCN_ARCH_NAME": "gfx942", "HIP_VERSION": "1"}, [])
    b = ResultsFile({"PT_VERSION": "2.11.0", "GCN_ARCH_NAME": "gfx90a", "ROCM_VERSION": "6.4"}, [])
    with pytest.raises(ValidatorMismatchError) as err:
        merge_results([a, b])
    text = str(err.value)
    assert "GCN_ARCH_NAME 'gfx942' vs 'gfx90a'" in text
    assert "HIP_VERSION '1' vs (absent)" in text
    assert "ROCM_VERSION (absent) vs '6.4'" in text
    assert "PT_VERSION" not in text


def test_outcomes_count_default_and_other_winners() -> None:
    rocm = read_results(DATA / "rocm_results.csv")
    defaults = sum(1 for r in raw_rows(DATA / "rocm_results.csv") if r[2] == "Default")
    assert count_outcomes(rocm) == Outcomes(tuned=rocm.gemms - defaults, default=defaults)
    assert defaults == 1
    only_default = parse_results(V + GOOD.replace("Gemm_Hipblaslt_1,0.01", "Default,0.02"))
    assert count_outcomes(only_default) == Outcomes(tuned=0, default=1)
    assert count_outcomes(parse_results(V)).to_dict() == {"tuned": 0, "default": 0}
