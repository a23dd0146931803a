"""Formats: every Signature() format in each version's shipped headers (CUDA and ROCm branches,
torch/include/ATen/cuda/tunable/*.h), instantiated, accepted by the parser, by record's
collection and by the library key; every solution-name format too.

The formats are read from the headers of torch 2.11.0 and the newest pinned release
(hack/torch-versions.txt), not written down here: a new form in a later release, once pinned,
fails this test until the parser knows it (or keeps it verbatim as an unknown suffix).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.torches import Torch
from tuner_job.library import gemm_cost, library_key, partition
from tuner_job.record import collect_untuned
from tuner_job.results import (
    parse_op_signature,
    parse_param_signature,
    parse_results,
    parse_untuned,
    solution_problem,
)

PARAMS_TO_OP = {
    "GemmParams": "GemmTunableOp",
    "GemmAndBiasParams": "GemmAndBiasTunableOp",
    "GemmStridedBatchedParams": "GemmStridedBatchedTunableOp",
    "ScaledGemmParams": "ScaledGemmTunableOp",
}
CUDA215 = "Validator,PT_VERSION,2.15.0\nValidator,CUBLASLT_VERSION,1\nValidator,CUDA_DEVICE,x\n"
ROCM = "Validator,PT_VERSION,2.15.0\nValidator,HIP_VERSION,702\nValidator,GCN_ARCH_NAME,gfx942\n"


@dataclass(frozen=True)
class Format:
    struct: str  # GemmParams, ...
    function: str  # Signature, DynamicSignature
    fmt: str
    args: tuple[str, ...]
    suffixes: tuple[tuple[str, tuple[str, ...]], ...] = ()  # `sig += ...` parts, optional


def _literal(text: str) -> tuple[str, int]:
    """The C string literal(s) at the start of text (adjacent ones joined), and its end."""
    out, i = "", 0
    while True:
        m = re.match(r'\s*"((?:[^"\\]|\\.)*)"', text[i:])
        if not m:
            return out, i
        out += m.group(1)
        i += m.end()


def _args(text: str) -> tuple[list[str], int]:
    """Top-level comma-separated arguments up to the closing parenthesis."""
    depth, cur, out = 0, "", []
    for i, ch in enumerate(text):
        if ch in "([{<" and not (ch == "<" and text[i - 1 : i] == " "):
            depth += 1
        elif ch in ")]}>" and not (ch == ">" and text[i - 1 : i] in ("-", " ")):
            if depth == 0:
                out.append(cur.strip())
                return [a for a in out if a], i
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    raise ValueError("unbalanced")


def _sprintfs(body: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(kind, format, args) of every fmt::sprintf in a function body; kind is 'return' (a
    whole signature), 'base' (`auto sig = ...`, suffixes may follow) or 'suffix' (`sig += ...`)."""
    found = []
    for m in re.finditer(r"(\+=\s*|return\s+)?fmt::sprintf\(", body):
        fmt, end = _literal(body[m.end() :])
        rest = body[m.end() + end :].lstrip()
        args: list[str] = []
        if rest.startswith(","):
            args, _ = _args(rest[1:])
        lead = (m.group(1) or "").strip()
        kind = {"+=": "suffix", "return": "return"}.get(lead, "base")
        found.append((kind, fmt, tuple(args)))
    return found


def _bodies(text: str, name: str) -> list[str]:
    out = []
    for m in re.finditer(rf"std::string {name}\(\) const override \{{", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append(text[m.end() : i - 1])
    return out


def signature_formats(headers: Path) -> list[Format]:
    text = (headers / "GemmCommon.h").read_text(encoding="utf-8")
    out = []
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"struct (\w+Params) : OpParams", text)]
    for (start, struct), (end, _) in zip(starts, [*starts[1:], (len(text), "")], strict=True):
        block = text[start:end]
        for function in ("Signature", "DynamicSignature"):
            for body in _bodies(block, function):
                calls = _sprintfs(body)
                suffixes = tuple((f, a) for kind, f, a in calls if kind == "suffix")
                for kind, fmt, args in calls:
                    if kind != "suffix":
                        extra = suffixes if kind == "base" else ()
                        out.append(Format(struct, function, fmt, args, extra))
    return out


def type_names(headers: Path) -> list[str]:
    text = (headers / "TunableGemm.h").read_text(encoding="utf-8")
    names = set()
    for m in re.finditer(r"inline const char\* TypeName\([^)]*\) \{(.*?)\n\}", text, re.S):
        names |= set(re.findall(r'return "([^"]+)";', m.group(1)))
    return sorted(names)


def solution_formats(headers: Path) -> list[str]:
    found = set()
    for path in headers.glob("*.h"):
        text = path.read_text(encoding="utf-8")
        found |= set(re.findall(r'"(Gemm_(?:Rocblas|Hipblaslt|Cublaslt)_[^"]*)"', text))
    return sorted(found)


def _fill(fmt: str, args: tuple[str, ...], wildcard: bool, variant: int) -> str:
    values = []
    chars = iter(["t", "n"])
    for spec, arg in zip(re.findall(r"%(?:ld|hu|[cdsu])", fmt), args, strict=True):
        if spec == "%c":
            values.append(next(chars, "n"))
        elif spec in ("%ld", "%d", "%u", "%hu"):
            values.append(
                str(variant % 2 if spec != "%ld" else 0 if "ld" in arg and variant else 64)
            )
        elif "MaybeWildcardInt" in arg:
            values.append("*" if wildcard else "64")
        elif "ComputeTypeSignature" in arg:
            values.append("_compute_bf16x9_r" if variant else "")
        elif "None" in arg:
            values.append("BFloat16" if variant else "None")
        elif "scale" in arg:
            values.append("Float8_e8m0fnu" if variant else "Float")
        elif "a_dtype" in arg or "b_dtype" in arg:
            values.append("Float4_e2m1fn_x2" if variant else "Float8_e4m3fn")
        else:
            values.append("BFloat16")
    out = fmt
    for v in values:
        out = re.sub(r"%(?:ld|hu|[cdsu])", lambda _, v=v: v, out, count=1)
    return out


def instances(f: Format) -> list[str]:
    out = []
    for wildcard, variant in itertools.product((False, True), (0, 1)):
        if wildcard and f.function != "DynamicSignature":
            continue
        base = _fill(f.fmt, f.args, wildcard, variant)
        out.append(base)
        for sfmt, sargs in f.suffixes:
            out.append(base + _fill(sfmt, sargs, wildcard, variant + 1))
    return out


def op_for(struct: str, params: str, names: list[str]) -> str:
    layout = params[:2].upper()
    family = PARAMS_TO_OP[struct]
    if family == "ScaledGemmTunableOp":
        return f"{family}_Float8_e4m3fn_Float8_e4m3fn_BFloat16_{layout}"
    return f"{family}_{'bfx9' if '_compute_' in params else names[0]}_{layout}"


@pytest.mark.parametrize("which", ["2.11", "newest"])
def test_every_signature_format_in_the_headers_is_read_recorded_and_keyed(
    which: str, torch211: Torch, newest: Torch, tmp_path: Path
) -> None:
    torch = torch211 if which == "2.11" else newest
    headers = Path(torch.run("api")["torch_dir"]) / "include" / "ATen" / "cuda" / "tunable"
    formats = signature_formats(headers)
    names = type_names(headers)
    assert {f.struct for f in formats} == set(PARAMS_TO_OP), formats
    assert {"float", "tf32", "BFloat16", "Half", "double", "Float8_e4m3fn"} <= set(names)
    if torch.release >= (2, 15):
        assert "bfx9" in names and "Float4_e2m1fn_x2" in names
        assert any("_a_%s_b_%s" in f.fmt for f in formats)  # CUDA's labelled ScaledGemm
        assert any("_swz_" in s for f in formats for s, _ in f.suffixes)  # ROCm's swizzle
        assert any(f.function == "DynamicSignature" for f in formats)
    rows = []
    for f in formats:
        for params in instances(f):
            for name in names:
                op = op_for(f.struct, params, [name])
                p = parse_param_signature(params, parse_op_signature(op))
                assert params.endswith(p.rest)
                rows.append((op, params))
    untuned = "".join(f"{op},{params}\n" for op, params in dict.fromkeys(rows))
    parsed = parse_untuned(untuned)
    assert parsed.dropped == [], parsed.warnings()
    (tmp_path / "workload_untuned0.csv").write_text(untuned)
    ((_, recorded),) = collect_untuned(tmp_path)
    assert len(recorded.rows) == len(dict.fromkeys(rows))
    assert all(gemm_cost(r) > 0 for r in recorded.rows)
    assert sum(len(s) for s in partition(recorded.rows, 3)) == len(recorded.rows)
    results = parse_results(
        CUDA215 + "".join(f"{o},{p},Default,0.1\n" for o, p in dict.fromkeys(rows))
    )
    assert results.dropped == [] and results.gemms == len(recorded.rows)
    assert library_key("M", results.validators, {})


@pytest.mark.parametrize("which", ["2.11", "newest"])
def test_every_solution_name_format_is_a_name_the_parser_keeps(
    which: str, torch211: Torch, newest: Torch
) -> None:
    torch = torch211 if which == "2.11" else newest
    headers = Path(torch.run("api")["torch_dir"]) / "include" / "ATen" / "cuda" / "tunable"
    formats = solution_formats(headers)
    assert "Gemm_Rocblas_%d" in formats or any(f.startswith("Gemm_Rocblas_") for f in formats)
    if torch.release >= (2, 14):
        assert any(f.startswith("Gemm_Cublaslt_id_") for f in formats)
    for fmt in formats:
        if not fmt.endswith(("%d", "%u", "%hu")) and "%" not in fmt:
            continue
        for value in ("7", "-1140857036"):
            name = re.sub(r"%(?:hu|[du])", value.lstrip("-") if "Cublaslt" in fmt else value, fmt)
            if "Cublaslt" in name and "_cluster_" not in name:
                name += "_inner_0_cluster_0"  # CUBLAS_VERSION >= 12000 appends it
            assert solution_problem(name) is None, name
            validators = CUDA215 if "Cublaslt" in name else ROCM
            row = f"GemmTunableOp_Half_TN,tn_8_8_8_ld_8_8_8,{name},0.1\n"
            assert parse_results(validators + row).gemms == 1, name
