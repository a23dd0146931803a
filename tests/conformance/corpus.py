"""A generated corpus of results files that exercises every rule of TunableOp's reader.

Synthetic (no file here comes from anywhere): explicit cases, one per rule found on real torch
2.11 (docs/tuner.md), then seeded random files that mix the same ingredients. Every file is
meant to be read by torch 2.11 (its validator is PT_VERSION 2.11.0 unless the case varies it).
"""

from __future__ import annotations

import random

PT = "Validator,PT_VERSION,2.11.0\n"
OP = "GemmTunableOp_float_NT"
PARAMS = "nt_64_64_64_ld_64_64_64"
LT = "Gemm_Cublaslt_id_5_tile_20_stages_8_splitk_1_red_0_swizzle_0_custom_0_inner_0_cluster_0"


def row(
    params: str = PARAMS, solution: str = "Default", ms: str | None = "0.01", op: str = OP
) -> str:
    return ",".join([op, params, solution, *([ms] if ms is not None else [])]) + "\n"


CONTROL = row("nt_128_128_128_ld_128_128_128", "Default", "0.02")

CASES: dict[str, str] = {
    "base": PT + row(),
    "extra-validator": PT + "Validator,FOO_VERSION,1\n" + row(),
    "rocm-validator-on-cuda": PT + "Validator,HIP_VERSION,702\n" + row(),
    "215-validators-on-211": PT
    + "Validator,CUBLASLT_VERSION,130401\nValidator,CUDA_DEVICE,NVIDIA H200\n"
    + row(),
    "pt-twice-same": PT + PT + row(),
    "pt-twice-different": PT + "Validator,PT_VERSION,2.10.0\n" + row(),
    "pt-after-rows": row() + PT + CONTROL,
    "validator-4-fields": "Validator,PT_VERSION,2.11.0,x\n" + row(),
    "validator-2-fields": PT + "Validator,FOO\n" + row(),
    "validator-empty-key": PT + "Validator,,\n" + CONTROL,
    "validator-empty-value": "Validator,PT_VERSION,\n" + row(),
    "validator-lower-case": "validator,PT_VERSION,2.11.0\n" + PT + row(),
    "blank-lines": "\n" + PT + "\n\n" + row() + "\n" + CONTROL + "\n",
    "whitespace-lines": PT + "   \n" + row() + "\t\n" + CONTROL,
    "comment": PT + "# a comment\n" + row() + CONTROL,
    "one-field": PT + OP + "\n" + CONTROL,
    "two-fields": PT + f"{OP},{PARAMS}\n" + CONTROL,
    "three-fields": PT + row(ms=None, solution="Default") + CONTROL,
    "lost-solution": PT + row(solution="0.0403", ms=None) + CONTROL,
    "five-fields": PT + row(ms="0.01,extra") + CONTROL,
    "seven-fields": PT + row(ms="0.01,a,b,c") + CONTROL,
    "trailing-comma": PT + row(ms="0.01,") + CONTROL,
    "blas-params": PT
    + row(ms="0.01,BLAS_PARAMS: - { function: matmul, M: 64, N: 64, transA: 'N' }")
    + CONTROL,
    "blas-params-3-fields": PT + row(ms="BLAS_PARAMS: - { a: 1, b: 2 }") + CONTROL,
    "duplicate": PT
    + row(solution="Default", ms="0.5")
    + row(solution="Default", ms="0.1")
    + CONTROL,
    "duplicate-identical": PT + row() + row() + CONTROL,
    "duplicate-3-then-4": PT + row(ms=None) + row(ms="0.3") + CONTROL,
    "duplicate-bad-first": PT + f"{OP},{PARAMS}\n" + row(ms="0.3") + CONTROL,
    "duplicate-garbage-first": PT + row(solution="") + row(ms="0.3") + CONTROL,
    "time-ms-suffix": PT + row(ms="0.25ms") + CONTROL,
    "time-exponent": PT + row(ms="1e-3") + CONTROL,
    "time-word": PT + row(ms="abc") + CONTROL,
    "time-negative": PT + row(ms="-1.5") + CONTROL,
    "time-nan": PT + row(ms="nan") + CONTROL,
    "time-NaN": PT + row(ms="NaN") + CONTROL,
    "time-inf": PT + row(ms="inf") + CONTROL,
    "time-huge": PT + row(ms="1e400") + CONTROL,
    "time-empty": PT + row(ms="") + CONTROL,
    "time-hex": PT + row(ms="0x10") + CONTROL,
    "time-leading-space": PT + row(ms=" 0.5") + CONTROL,
    "time-trailing-word": PT + row(ms="0.5abc") + CONTROL,
    "time-quoted": PT + row(ms='"0.01"') + CONTROL,
    "ld-zero": PT + row("nn_256_32_1_ld_0_1_256", op="GemmTunableOp_float_NN") + CONTROL,
    "dim-zero": PT + row("nn_0_32_1_ld_1_1_1", op="GemmTunableOp_float_NN") + CONTROL,
    "wildcard": PT + row("tn_*_4096_4096_ld_4096_4096_*", op="GemmTunableOp_BFloat16_TN") + CONTROL,
    "compute-suffix": PT
    + row("nt_64_64_64_ld_64_64_64_compute_bf16x9_r", op="GemmTunableOp_bfx9_NT")
    + CONTROL,
    "swizzle-suffix": PT
    + row("nt_64_64_64_ld_64_64_64_swz_0_0", op="GemmTunableOp_Half_NT")
    + CONTROL,
    "cuda-scaled": PT
    + row(
        "tn_4096_4096_4096_ld_4096_4096_4096_a_Float8_e4m3fn_b_Float8_e4m3fn_c_BFloat16_as_Float"
        "_bs_Float_ast_0_bst_0_dscale_0_fast_0_bias_None",
        op="ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN",
    )
    + CONTROL,
    "garbage-params": PT + row("hello world") + CONTROL,
    "cut-params": PT + row("nt_64_64_64_ld_64_6") + CONTROL,
    "layout-mismatch": PT + row("tn_64_64_64_ld_64_64_64") + CONTROL,
    "unknown-op": PT + "FooTunableOp_x_NN,whatever,Sol,0.01\n" + CONTROL,
    "leading-space-field": PT + f"{OP}, {PARAMS},Default,0.01\n" + CONTROL,
    "empty-op": PT + ",,Default,0.01\n" + CONTROL,
    "all-empty": PT + ",,,\n" + CONTROL,
    "tab-separated": PT + f"{OP}\t{PARAMS}\tDefault\t0.01\n" + CONTROL,
    "crlf": (PT + row() + CONTROL).replace("\n", "\r\n"),
    "crlf-rows-only": PT + row().replace("\n", "\r\n") + CONTROL,
    "crlf-3-fields": PT + row(ms=None).replace("\n", "\r\n") + CONTROL,
    "lone-cr": PT + row().rstrip("\n") + "\r" + CONTROL,
    "bom": "\ufeff" + PT + row() + CONTROL,
    "bom-before-row": "\ufeff" + row() + PT + CONTROL,
    "no-validators": row() + CONTROL,
    "empty-file": "",
    "only-validator": PT,
    "pt-mismatch": "Validator,PT_VERSION,2.10.0\n" + row() + CONTROL,
    "pt-local-version": "Validator,PT_VERSION,2.11.0+cu130\n" + row() + CONTROL,
    "pt-short": "Validator,PT_VERSION,2.11\n" + row() + CONTROL,
    "pt-trailing-space": "Validator,PT_VERSION,2.11.0 \n" + row() + CONTROL,
    "empty-solution": PT + row(solution="") + CONTROL,
    "numeric-solution": PT + row(solution="123") + CONTROL,
    "solution-with-space": PT + row(solution="Gemm Cublas") + CONTROL,
    "solution-quoted": PT + row(solution='"Default"') + CONTROL,
    "solution-nul": PT + row(solution="Def\x00ault") + CONTROL,
    "solution-cublaslt-on-211": PT + row(solution=LT) + CONTROL,
    "solution-hipblaslt-on-211": PT + row(solution="Gemm_Hipblaslt_1285") + CONTROL,
    "no-trailing-newline": PT + row() + CONTROL.rstrip("\n"),
    "no-trailing-newline-time-cut": PT + row() + CONTROL.rstrip("\n")[:-1],
    "no-trailing-newline-time-empty": PT + row() + CONTROL[: CONTROL.rindex(",") + 1],
    "no-trailing-newline-blas": PT
    + row()
    + row("nt_128_128_128_ld_128_128_128", ms="0.02,BLAS_PARAMS: - { a: 1, b: 2 }").rstrip("\n"),
    "cut-last-row": PT + row() + CONTROL[:40],
    "cut-in-solution": PT + row() + CONTROL[: CONTROL.index(",Default,") + 5],
    "cut-after-solution": PT + row() + CONTROL[: CONTROL.rindex(",")],
}

_OPS = [
    ("GemmTunableOp_float_NT", "nt_{m}_{n}_{k}_ld_{k}_{k}_{m}"),
    ("GemmTunableOp_BFloat16_TN", "tn_{m}_{n}_{k}_ld_{k}_{k}_{m}"),
    ("GemmTunableOp_tf32_NN", "nn_{m}_{n}_{k}_ld_{m}_{k}_{m}"),
    ("GemmAndBiasTunableOp_Half_TN", "tn_{m}_{n}_{k}_ld_{k}_{k}_{m}"),
    ("GemmStridedBatchedTunableOp_Half_NN", "nn_{m}_{n}_{k}_B_8_ld_{m}_{k}_{m}"),
    ("GemmTunableOp_bfx9_NT", "nt_{m}_{n}_{k}_ld_{k}_{k}_{m}_compute_bf16x9_r"),
    ("GemmTunableOp_BFloat16_TN", "tn_*_{n}_{k}_ld_{k}_{k}_*"),
    ("GemmTunableOp_c10::complex<float>_NN", "nn_{m}_{n}_{k}_ld_{m}_{k}_{m}"),
    ("GemmTunableOp_float_NN", "nn_{m}_{n}_1_ld_0_1_{m}"),
    (
        "ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN",
        "tn_{m}_{n}_{k}_ld_{k}_{k}_{m}_rw_0_bias_None",
    ),
]
_SOLUTIONS = ["Default"] * 6 + ["", "0.0403", "123", "Gemm Cublas", LT, "Gemm_Rocblas_-1140857036"]
_TIMES = ["0.01", "0.0234567", "1e-3", "0.25ms", "abc", "", "-1.5", "nan", "inf", "0x10", None]
_EXTRA = ["", "", "", ",x", ",", ",BLAS_PARAMS: - { a: 1, b: 2 }"]
_NOISE = ["\n", "   \n", "# note\n", "x\n", "a,b\n", "Validator,FOO\n"]


def generated(count: int = 300, seed: int = 17) -> dict[str, str]:
    """Seeded random files mixing the ingredients above (validators, rows, noise)."""
    rnd = random.Random(seed)
    out: dict[str, str] = {}
    for i in range(count):
        lines: list[str] = []
        for j in range(rnd.randint(1, 12)):
            op, fmt = rnd.choice(_OPS)
            params = fmt.format(m=64 + j * 8 + i, n=32 + j, k=16 + rnd.randint(0, 3))
            solution = rnd.choice(_SOLUTIONS)
            ms = rnd.choice(_TIMES)
            text = ",".join([op, params, solution, *([ms] if ms is not None else [])])
            text += rnd.choice(_EXTRA) if ms is not None else ""
            lines.append(text + "\n")
            if rnd.random() < 0.1:  # the same key again, another solution
                lines.append(f"{op},{params},Default,{rnd.choice(['0.5', '0.001'])}\n")
            if rnd.random() < 0.1:
                lines.append(rnd.choice(_NOISE))
        where = rnd.randint(0, len(lines))
        lines.insert(where, PT)  # validator lines may come anywhere
        if rnd.random() < 0.05:
            lines.insert(rnd.randint(0, len(lines)), "Validator,PT_VERSION,2.10.0\n")
        if rnd.random() < 0.05:
            lines.insert(rnd.randint(0, len(lines)), "Validator,HIP_VERSION,702\n")
        if rnd.random() < 0.03:
            k = rnd.randrange(len(lines))
            lines[k] = lines[k].replace("\n", "\r\n")
        text = "".join(lines)
        if rnd.random() < 0.05:
            text = text[: rnd.randint(len(text) // 2, len(text))]  # cut off, as by a kill
        out[f"gen-{i:03d}"] = text
    return out
