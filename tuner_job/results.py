"""TunableOp CSV files: one parser and model for results and untuned files.

TunableOp writes two kinds of file (aten/src/ATen/cuda/tunable):

* results: ``Validator,KEY,VALUE`` lines, then ``OpSig,ParamSig,Solution,ms`` rows;
* untuned (record mode): ``OpSig,ParamSig`` rows.

With ``PYTORCH_TUNABLEOP_BLAS_LOG=1`` either kind gets one more field, ``BLAS_PARAMS: - { ... }``,
which itself contains commas, so it is taken as the rest of the line.

OpSig is ``<Family>TunableOp_<types>_<AB>``: ``GemmTunableOp_BFloat16_TN``,
``GemmStridedBatchedTunableOp_float_NN``, ``GemmAndBiasTunableOp_Half_TN``,
``ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN``.
ParamSig is ``<ab>_<m>_<n>_<k>[_B_<batch>][_ld_<lda>_<ldb>_<ldc>][<suffix>]`` (GemmCommon.h's
``Signature()``): ``tn_4096_4096_4096_ld_4096_4096_4096``, ``tn_128_128_64_B_96_ld_64_64_128``.
Dimensions are non-negative (a leading dimension can be 0) or ``*`` (the wildcard entries of
torch 2.15's dynamic shapes). Suffixes: scaled GEMMs end in ``_rw_<0|1>_bias_<dtype|None>``
(ROCm, and CUDA's wildcard form), plus ``_swz_<a>_<b>`` on ROCm 2.15, or in CUDA 2.15's labelled
``_a_<T>_b_<T>_c_<T>_as_<T>_bs_<T>_ast_<n>_bst_<n>_dscale_<0|1>_fast_<0|1>_bias_<T>``; float GEMMs
of 2.15 may end in a compute type (``_compute_bf16x9_r``). A suffix this module does not know
(a newer torch's) is kept verbatim. The ``_ld_`` part is absent in files of torch 2.4 and 2.6.
The letters and dimensions are cuBLAS's column-major ones: ``torch.mm(A, B)`` on row-major
tensors runs as ``C^T = B^T A^T``, so its ``m`` is the product's columns, ``n`` its rows.

Torch's own reader (TuningContext::ReadFile) is the reference for what a file means, and this
parser reads as it reads: lines split on ``\n`` only, blank lines skipped, fields split on ``,``
the way ``std::getline`` does (a trailing empty field is no field), a line of one or two fields
dropped, a row of three fields has time 0, fields after the fourth are ignored, validator lines
may come anywhere, the first row of a repeated key wins, times are read C-style (``atof``:
``0.25ms`` is 0.25, ``abc`` is 0). On top of that, because a results file is content-addressed
and shipped to every pod of a fleet:

* a row that torch would load as garbage (no solution; a number where the solution goes; a
  solution with spaces, quotes or control characters; an operator or parameter signature no
  GEMM ever looks up; a last line without its newline that ends before its time field, so that
  its solution may be a fragment; a solution other than ``Default`` on a CUDA torch before
  2.14, whose TunableOp then throws) is *dropped* from what is published, with its line and
  reason in ``ResultsFile.dropped``, and never counted (a complete last row without its
  newline is read as torch reads it: loaded);
* a repeated key keeps its first row, as in torch, and is counted in ``ResultsFile.duplicates``;
* the whole file is refused (``CsvFormatError``, with its line) only for what makes torch drop
  the whole file or load rows tuned under other validators: a byte-order mark, a carriage return
  or NUL or non-UTF-8 byte in a validator line (CRLF files), no PT_VERSION validator, or one
  validator given twice with different values (torch keeps the last).

``check_validators`` is the other half of torch's check (ValidateAll): the file's validator set
must be exactly the loading torch's, value for value. docs/tuner.md lists every deliberate
difference from torch's reader; tests/conformance checks the rest against real torch.

This module is stdlib-only: it runs in the user's image (tuner) and in ours (publish, fetch).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

VALIDATOR = "Validator"
BLAS_PREFIX = "BLAS_PARAMS:"
# TunableOp refuses a results file without this validator (TuningResultsValidator mandatory key).
MANDATORY_VALIDATOR = "PT_VERSION"

KNOWN_FAMILIES = ("Gemm", "GemmStridedBatched", "GemmAndBias", "ScaledGemm")

_OP_RE = re.compile(
    r"^(?P<family>[A-Za-z]+)TunableOp_(?P<types>[A-Za-z0-9_:<>]+)_(?P<layout>[NT]{2})$"
)
_DIM = r"(?:\d+|\*)"  # ints as %ld writes them (0 included: a leading dimension can be 0), or *
_PARAM_RE = re.compile(
    rf"^(?P<ta>[ntcNTC])(?P<tb>[ntcNTC])_(?P<m>{_DIM})_(?P<n>{_DIM})_(?P<k>{_DIM})"
    rf"(?:_B_(?P<batch>{_DIM}))?"
    rf"(?:_ld_(?P<lda>{_DIM})_(?P<ldb>{_DIM})_(?P<ldc>{_DIM}))?"
    r"(?P<rest>(?:_[^_,\s]+)*)$"
)
# A suffix starts with a word, never a number or the ld/B parts (those mean a cut-off or
# mangled signature): "_compute_bf16x9_r", "_rw_0_bias_None_swz_1_1", "_a_Float8_e4m3fn_...".
_SUFFIX_RE = re.compile(r"^_(?!ld_|B_)[A-Za-z][A-Za-z0-9]*(?:_[^_,\s]+)*$")
_TYPE = r"[A-Za-z][A-Za-z0-9_]*?"
SCALED_ROCM_RE = re.compile(rf"^_rw_[01]_bias_{_TYPE}(?:_swz_\d+_\d+)?$")
SCALED_CUDA_RE = re.compile(
    rf"^_a_{_TYPE}_b_{_TYPE}_c_{_TYPE}_as_{_TYPE}_bs_{_TYPE}_ast_\d+_bst_\d+"
    rf"_dscale_[01]_fast_[01]_bias_{_TYPE}$"
)
COMPUTE_RE = re.compile(r"^_compute_[A-Za-z0-9_]+$")
_NUMBER_RE = re.compile(
    r"^[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|0[xX][0-9a-fA-F.]+(?:[pP][+-]?\d+)?"
    r"|inf(?:inity)?|nan(?:\([^)]*\))?)$",
    re.IGNORECASE,
)
# What a solution name looks like: Default, Gemm_Rocblas_-123, Gemm_Hipblaslt_TN_6139,
# Gemm_Cublaslt_id_..._cluster_0. Spaces, quotes, control or non-ASCII characters never occur.
_SOLUTION_RE = re.compile(r"^[A-Za-z][\x21-\x7e]*$")
_BAD_SOLUTION_CHARS = re.compile(r"[\",']")
DEFAULT_SOLUTION = "Default"  # TunableOp's name for the untuned BLAS call (ResultEntry::Default)
# CUDA builds before this release register only the Default candidate (TunableGemm.h); from it
# on they have cuBLASLt candidates and the CUBLASLT_VERSION and CUDA_DEVICE validators.
CUDA_CANDIDATES_FROM = (2, 14)


class CsvFormatError(ValueError):
    """A TunableOp CSV that TunableOp would misread; names the file, line and rule."""

    def __init__(self, source: str, line: int, message: str, rule: str = "") -> None:
        self.source = source
        self.line = line
        self.message = message
        self.rule = rule  # one of FILE_RULES
        where = f"{source}:{line}" if line > 0 else source
        super().__init__(f"{where}: {message}")


class ValidatorMismatchError(ValueError):
    """Results tuned under different validators cannot be combined: TunableOp would reject them."""


@dataclass(frozen=True)
class OpSignature:
    raw: str
    family: str
    types: str
    layout: str  # "TN": transA, transB as TunableOp's template arguments


@dataclass(frozen=True)
class ParamSignature:
    raw: str
    trans_a: str
    trans_b: str
    m: int | None  # None: a "*" wildcard dimension
    n: int | None
    k: int | None
    batch: int | None
    lda: int | None
    ldb: int | None
    ldc: int | None
    rest: str  # the suffix after the dimensions, verbatim ("" when none)

    @property
    def wildcard(self) -> bool:
        return None in (self.m, self.n, self.k) or "*" in self.raw


def c_atof(text: str) -> float:
    """What C's atof (strtod) reads from text: the longest number at its start, else 0."""
    s = text.lstrip(" \t\n\v\f\r")
    m = re.match(
        r"[+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?"
        r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?)",
        s,
        re.IGNORECASE,
    )
    if m is None:
        return 0.0
    num = m.group(0)
    low = num.lower().lstrip("+-")
    sign = -1.0 if num.startswith("-") else 1.0
    if low.startswith("0x"):
        body = low[2:]
        exp = 0
        if "p" in body:
            body, e = body.split("p", 1)
            exp = int(e)
        whole, _, frac = body.partition(".")
        value = float(int(whole or "0", 16))
        for i, ch in enumerate(frac, start=1):
            value += int(ch, 16) / 16.0**i
        return sign * value * 2.0**exp
    if low.startswith("nan"):
        return math.nan
    if low.startswith("inf"):
        return sign * math.inf
    try:
        return float(num)
    except OverflowError:  # pragma: no cover - float() returns inf rather than raising
        return sign * math.inf


@dataclass(frozen=True)
class ResultRow:
    op: str
    params: str
    solution: str
    ms_text: str | None  # exactly as written, so a round trip keeps the bytes; None: 3 fields
    blas: str | None = None
    line: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return (self.op, self.params)

    @property
    def ms(self) -> float | None:
        """The measured time, or None when there is none: no time field, or one that is not a
        finite non-negative number as written (torch would read ``abc`` as 0 and ``-1`` as -1,
        neither of which is a measurement)."""
        if self.ms_text is None or not _NUMBER_RE.match(self.ms_text.strip()):
            return None
        value = c_atof(self.ms_text)
        return value if math.isfinite(value) and value >= 0 else None

    @property
    def torch_ms(self) -> float:
        """The time torch reads from this row: atof of the field, 0 without one."""
        return 0.0 if self.ms_text is None else c_atof(self.ms_text)


@dataclass(frozen=True)
class UntunedRow:
    op: str
    params: str
    blas: str | None = None
    line: int = 0
    source: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.op, self.params)


# Why a whole file is refused, and why a line is kept out of what is published. Rules marked
# torch=True are what torch's reader does too (it drops such lines); the others are deliberate
# differences, each listed in docs/tuner.md ("What the parser does differently from torch").
FILE_RULES = {
    "bom": "a byte-order mark at the start",
    "validator-bad-bytes": "a CR, NUL or non-UTF-8 byte in a validator line",
    "conflicting-validator": "one validator given twice with different values",
    "no-pt-version": "no PT_VERSION validator",
    "no-rows": "no GEMM rows where rows are required",
}
ROW_RULES = {
    "short-line": ("a line of 1 or 2 fields", True),
    "short-validator": ("a Validator line of 2 fields", True),
    "cut-off": ("a last line without its newline, cut before its time field", False),
    "bad-bytes": ("a CR, NUL or non-UTF-8 byte in a row", False),
    "no-solution": ("an empty solution", False),
    "number-as-solution": ("a number where the solution goes", False),
    "bad-solution": ("a solution with spaces, quotes, control or non-ASCII characters", False),
    "never-looked-up": ("an operator or parameter signature no GEMM looks up", False),
    "cuda-default-only": ("a solution other than Default on CUDA torch before 2.14", False),
}


@dataclass(frozen=True)
class Dropped:
    """A line kept out of what is published, and why (what torch would do with it first)."""

    line: int
    reason: str
    text: str = ""
    rule: str = ""  # one of ROW_RULES
    key: tuple[str, str] | None = None  # for a row: its (op, params), which torch loads

    def describe(self, source: str = "") -> str:
        where = f"{source}:{self.line}" if source else f"line {self.line}"
        shown = self.text if len(self.text) <= 120 else self.text[:117] + "..."
        return f"{where}: {self.reason}: {shown!r}"


@dataclass
class ResultsFile:
    validators: dict[str, str] = field(default_factory=dict)
    rows: list[ResultRow] = field(default_factory=list)
    # Rows torch would load as garbage, and lines it skips itself: not in rows, not counted.
    dropped: list[Dropped] = field(default_factory=list)
    # (line, line of the first row with that key): torch keeps the first, and so do we.
    duplicates: list[tuple[int, int]] = field(default_factory=list)

    @property
    def gemms(self) -> int:
        return len(self.rows)

    def keys(self) -> set[tuple[str, str]]:
        return {r.key for r in self.rows}

    def warnings(self, source: str = "") -> list[str]:
        """One line per dropped line, then one for the repeated keys (the first 20 each)."""
        out = [d.describe(source) for d in self.dropped[:20]]
        if len(self.dropped) > 20:
            out.append(f"{source or 'results'}: {len(self.dropped) - 20} more lines dropped")
        if self.duplicates:
            pairs = ", ".join(f"{a}<-{b}" for a, b in self.duplicates[:20])
            more = f" and {len(self.duplicates) - 20} more" if len(self.duplicates) > 20 else ""
            out.append(
                f"{source or 'results'}: {len(self.duplicates)} GEMM key(s) appear more than "
                f"once; the first row of each is kept, as TunableOp does (line<-first: "
                f"{pairs}{more})"
            )
        return out


@dataclass
class UntunedFile:
    rows: list[UntunedRow] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)

    def warnings(self, source: str = "") -> list[str]:
        return [d.describe(source) for d in self.dropped]


@functools.lru_cache(maxsize=4096)
def parse_op_signature(text: str) -> OpSignature:
    # Cached: a file has thousands of rows but only a handful of distinct operators.
    m = _OP_RE.match(text)
    if m is None:
        raise ValueError(
            f"operator signature {text!r} is not <Family>TunableOp_<types>_<NN|NT|TN|TT>"
        )
    return OpSignature(text, m["family"], m["types"], m["layout"])


def _dim(value: str | None) -> int | None:
    if value is None or value == "*":
        return None
    return int(value)


def _match_params(text: str, op: OpSignature | None) -> re.Match[str]:
    """Validate a parameter signature (against its operator when given); cheap, per row."""
    m = _PARAM_RE.match(text)
    if m is None:
        raise ValueError(
            f"parameter signature {text!r} is not <ab>_<m>_<n>_<k>[_B_<b>][_ld_...][_suffix]"
        )
    rest = m["rest"]
    if rest and not _SUFFIX_RE.match(rest):
        # e.g. a cut-off "..._ld_4096_40": the ld group did not match and fell through here.
        raise ValueError(f"parameter signature {text!r} has unexpected trailing {rest!r}")
    if op is not None:
        # The op's layout letters and the params' trans flags come from the same call; a
        # disagreement means a hand edit or a spliced line ('c', conjugate, is a transpose).
        flags = ("N" if m["ta"] in "nN" else "T") + ("N" if m["tb"] in "nN" else "T")
        if flags != op.layout:
            raise ValueError(f"layout {op.layout} of {op.raw} disagrees with {text!r}")
        if op.family == "GemmStridedBatched" and m["batch"] is None:
            raise ValueError(f"strided-batched GEMM {text!r} has no _B_<batch> part")
        if op.family in KNOWN_FAMILIES and op.family != "GemmStridedBatched" and m["batch"]:
            raise ValueError(f"{op.family} GEMM {text!r} has a batch part")
    return m


def parse_param_signature(text: str, op: OpSignature | None = None) -> ParamSignature:
    m = _match_params(text, op)
    return ParamSignature(
        raw=text,
        trans_a=m["ta"].lower(),
        trans_b=m["tb"].lower(),
        m=_dim(m["m"]),
        n=_dim(m["n"]),
        k=_dim(m["k"]),
        batch=_dim(m["batch"]),
        lda=_dim(m["lda"]),
        ldb=_dim(m["ldb"]),
        ldc=_dim(m["ldc"]),
        rest=m["rest"],
    )


def check_signatures(op: str, params: str) -> str | None:
    """Why no GEMM would ever look this (op, params) up, or None when one can."""
    try:
        _match_params(params, parse_op_signature(op))
    except ValueError as exc:
        return f"never looked up: {exc}"
    return None


def solution_problem(solution: str) -> tuple[str, str] | None:
    """(rule, reason) when torch would load this solution as garbage, else None."""
    if solution == "":
        return "no-solution", "no solution"
    if _NUMBER_RE.match(solution.strip()):
        return "number-as-solution", (
            f"a number where the solution goes ({solution!r}: a row that lost its solution?)"
        )
    if not _SOLUTION_RE.match(solution) or _BAD_SOLUTION_CHARS.search(solution):
        return "bad-solution", (
            f"solution {solution!r} is not a name TunableOp registers (it has spaces, quotes, "
            "control or non-ASCII characters)"
        )
    return None


def _release(version: str) -> tuple[int, int] | None:
    m = re.match(r"^(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def only_default_candidates(validators: Mapping[str, str]) -> bool:
    """A CUDA torch before 2.14 (its only validator is PT_VERSION; ROCm builds always add HIP,
    BLAS and arch validators): TunableOp registers Default alone, and a row naming any other
    solution makes its GEMM throw (TunableOp.h: TORCH_CHECK(iter != ops_.end()))."""
    if set(validators) != {MANDATORY_VALIDATOR}:
        return False
    release = _release(validators[MANDATORY_VALIDATOR])
    return release is not None and release < CUDA_CANDIDATES_FROM


def getline_fields(line: str) -> list[str]:
    """Fields as ``std::getline(ss, field, ',')`` yields them: a trailing empty one is none."""
    fields = line.split(",")
    if len(fields) > 1 and fields[-1] == "":
        fields.pop()
    elif fields == [""]:
        return []
    return fields


def _split(line: str) -> tuple[list[str], str | None]:
    """Split a CSV line, keeping a BLAS_PARAMS tail (which contains commas) whole."""
    idx = line.find("," + BLAS_PREFIX)
    if idx >= 0:
        return getline_fields(line[:idx]) or [""], line[idx + 1 :]
    return getline_fields(line), None


_CRLF_FIX = (
    "TunableOp splits lines on \\n only, keeps the \\r in the last field and so drops the whole "
    "file; convert the file to LF line endings"
)


def _bad_chars(line: str) -> str | None:
    if "\r" in line:
        if line.endswith("\r") and "\r" not in line[:-1]:
            return "CRLF line ending (\\r\\n)"
        return "a carriage return (\\r)"
    if "\x00" in line:
        return "NUL byte"
    if any("\udc80" <= ch <= "\udcff" for ch in line):
        return "not UTF-8 text"
    return None


def _lines(text: str, source: str) -> Iterable[tuple[int, str, bool]]:
    """(number, line, complete): every non-blank line; complete is False for a last line
    without its newline (TunableOp reads it as is; a file torch wrote always ends in one)."""
    if text.startswith("\ufeff"):
        raise CsvFormatError(
            source,
            1,
            "starts with a UTF-8 byte-order mark (BOM): TunableOp reads the BOM as part of the "
            "first line, which is then no Validator line, and drops the whole file; "
            "save the file as UTF-8 without a BOM",
            "bom",
        )
    lines = text.split("\n")
    last = len(lines)
    for number, line in enumerate(lines, start=1):
        if line.strip(" \t") == "":
            continue  # TunableOp skips empty lines (and drops whitespace-only ones)
        yield number, line, number < last


def _time_begun(line: str) -> bool:
    """Whether a row's solution field ended (a comma follows it): what comes after it, the
    time and any BLAS_PARAMS tail, is all a cut could have shortened."""
    idx = line.find("," + BLAS_PREFIX)
    head = line[:idx] if idx >= 0 else line
    return head.count(",") >= 3 or (idx >= 0 and head.count(",") >= 2)


def _row_problem(
    op: str, params: str, solution: str, bad: str | None, complete: bool
) -> tuple[str, str] | None:
    if not complete:
        return "cut-off", "last line has no newline and ends before its time (cut off?)"
    if bad:
        return "bad-bytes", bad
    found = solution_problem(solution)
    if found:
        return found
    why = check_signatures(op, params)
    return ("never-looked-up", why) if why else None


def parse_results(
    text: str, source: str = "<results>", *, require_rows: bool = False
) -> ResultsFile:
    """Parse a TunableOp results CSV as torch reads it (see the module docstring).

    Rows torch would load as garbage go to ``dropped``; repeated keys keep their first row and
    are counted in ``duplicates``. Raises CsvFormatError, naming the line, only for what makes
    torch drop the whole file (or mix tunings).
    """
    out = ResultsFile()
    validator_lines: dict[str, int] = {}
    seen: dict[tuple[str, str], int] = {}
    for number, line, complete in _lines(text, source):
        fields, blas = _split(line)
        bad = _bad_chars(line)
        if not complete and _time_begun(line):
            # torch reads a last line without its newline as any other (std::getline): where
            # its solution ended with a comma, only the time (or the BLAS tail) may be short.
            complete = True
            if blas is not None and not blas.rstrip().endswith("}"):
                blas = None  # a BLAS_PARAMS tail cut off is no record of the GEMM
        if fields and fields[0] == VALIDATOR:
            _read_validator(out, validator_lines, source, _Line(number, line, fields, bad))
            continue
        if len(fields) < 3:
            # TunableOp: "could not parse line"; a 2-field row is an untuned file's.
            why = f"{len(fields)} field(s): not a result row (TunableOp drops it too)"
            out.dropped.append(Dropped(number, why, line, "short-line"))
            continue
        op, params, solution = fields[0], fields[1], fields[2]
        row_key = (op, params)
        if row_key in seen:
            out.duplicates.append((number, seen[row_key]))
            continue
        seen[row_key] = number
        problem = _row_problem(op, params, solution, bad, complete)
        if problem:
            out.dropped.append(Dropped(number, problem[1], line, problem[0], row_key))
            continue
        ms_text = fields[3] if len(fields) >= 4 else None
        out.rows.append(ResultRow(op, params, solution, ms_text, blas, number))
    if MANDATORY_VALIDATOR not in out.validators:
        raise CsvFormatError(
            source,
            0,
            f"no Validator,{MANDATORY_VALIDATOR} line: TunableOp would ignore the file",
            "no-pt-version",
        )
    if only_default_candidates(out.validators):
        _drop_all_but_default(out)
    if require_rows and not out.rows:
        raise CsvFormatError(source, 0, "no tuned GEMM rows", "no-rows")
    return out


class _Line(NamedTuple):
    """One line of a results file as split: its number, text, fields and bad characters."""

    number: int
    text: str
    fields: list[str]
    bad: str | None


def _read_validator(out: ResultsFile, first_lines: dict[str, int], source: str, at: _Line) -> None:
    """One Validator line into `out.validators` (as TunableOp reads it), or why the file or
    the line is refused. `first_lines`: the line each validator was first seen on."""
    number, line, fields, bad = at
    if bad:
        what = f"{bad} in a validator line"
        fix = _CRLF_FIX if "\r" in line else "TunableOp would compare it and drop the file"
        raise CsvFormatError(source, number, f"{what}: {fix}", "validator-bad-bytes")
    if len(fields) < 3:
        why = "a Validator line needs 3 fields (TunableOp skips it)"
        out.dropped.append(Dropped(number, why, line, "short-validator"))
        return
    key, value = fields[1], fields[2]
    if key in out.validators and out.validators[key] != value:
        raise CsvFormatError(
            source,
            number,
            f"validator {key} is {value!r} here but {out.validators[key]!r} on line "
            f"{first_lines[key]}: TunableOp keeps the last, and the rows tuned "
            "under the other would load as if tuned under it",
            "conflicting-validator",
        )
    out.validators[key] = value
    first_lines.setdefault(key, number)


def _drop_all_but_default(out: ResultsFile) -> None:
    """A CUDA torch that registers only Default: every other solution would throw on load."""
    kept = []
    for row in out.rows:
        if row.solution == DEFAULT_SOLUTION:
            kept.append(row)
            continue
        why = (
            f"solution {row.solution!r} on CUDA torch {out.validators[MANDATORY_VALIDATOR]}, "
            "which registers only Default: TunableOp would throw on this GEMM"
        )
        text_ = f"{row.op},{row.params},{row.solution}"
        out.dropped.append(Dropped(row.line, why, text_, "cuda-default-only", row.key))
    out.rows = kept


def check_validators(results: ResultsFile, expected: Mapping[str, str]) -> None:
    """TunableOp's ValidateAll: exactly the loading torch's validators, value for value, or it
    loads nothing. Raises ValidatorMismatchError naming each difference."""
    got = results.validators
    if got == dict(expected):
        return
    problems = []
    for k in sorted(set(got) | set(expected)):
        if k not in expected:
            problems.append(f'"{k}" is provided, but this torch does not consume it')
        elif k not in got:
            problems.append(f'"{k}" is required, but the file does not provide it')
        elif got[k] != expected[k]:
            problems.append(f"{k} {got[k]!r}, this torch {expected[k]!r}")
    raise ValidatorMismatchError("TunableOp would load nothing: " + "; ".join(problems))


def parse_untuned(text: str, source: str = "<untuned>") -> UntunedFile:
    """Parse an untuned-GEMM CSV written by PYTORCH_TUNABLEOP_RECORD_UNTUNED=1.

    A row that torch's offline tuner could not rebuild (an operator or parameter signature no
    GEMM has, a cut-off last line, stray characters) is dropped with its reason; a results file
    (validator lines) is refused.
    """
    out = UntunedFile()
    seen: set[tuple[str, str]] = set()
    for number, line, complete in _lines(text, source):
        fields, blas = _split(line)
        if fields and fields[0] == VALIDATOR:
            raise CsvFormatError(
                source, number, "validator line in an untuned file (is this a results file?)"
            )
        problem: tuple[str, str] | None = None
        bad = _bad_chars(line)
        if bad:
            problem = "bad-bytes", bad
        elif not complete:
            problem = "cut-off", "last line has no newline (cut off?)"
        elif len(fields) != 2:
            why = f"untuned row needs 2 fields (OpSig,ParamSig), has {len(fields)}"
            problem = "short-line", why
        else:
            signatures = check_signatures(fields[0], fields[1])
            problem = ("never-looked-up", signatures) if signatures else None
        if problem:
            out.dropped.append(Dropped(number, problem[1], line, problem[0]))
            continue
        if (fields[0], fields[1]) in seen:
            continue  # torch writes a GEMM once per process; a second one changes nothing
        seen.add((fields[0], fields[1]))
        out.rows.append(UntunedRow(fields[0], fields[1], blas, number, source))
    return out


def read_results(path: str | Path, *, require_rows: bool = False) -> ResultsFile:
    p = Path(path)
    return parse_results(_read_text(p), str(p), require_rows=require_rows)


def read_untuned(path: str | Path) -> UntunedFile:
    p = Path(path)
    return parse_untuned(_read_text(p), str(p))


def _read_text(path: Path) -> str:
    """The file's text; bytes that are not UTF-8 become surrogates, so that the lines holding
    them are dropped (or, in a validator line, refused) like any other bad line."""
    return path.read_bytes().decode("utf-8", errors="surrogateescape")


def decode(data: bytes) -> str:
    """Bytes of a results file as parse_results takes them (see _read_text)."""
    return data.decode("utf-8", errors="surrogateescape")


def format_ms(value: float) -> str:
    """Format a time the way TunableOp's C++ stream does (6 significant digits)."""
    return format(value, ".6g")


def format_results(results: ResultsFile) -> str:
    """Canonical text: validators then rows, each sorted, so equal content hashes equal."""
    lines = [f"{VALIDATOR},{k},{v}" for k, v in sorted(results.validators.items())]
    for row in sorted(results.rows, key=lambda r: r.key):
        fields = [row.op, row.params, row.solution]
        if row.ms_text is not None:
            fields.append(row.ms_text)
        if row.blas is not None:
            fields.append(row.blas)
        lines.append(",".join(fields))
    return "".join(line + "\n" for line in lines)


def format_untuned(rows: Iterable[UntunedRow]) -> str:
    return "".join(
        f"{r.op},{r.params}" + (f",{r.blas}" if r.blas is not None else "") + "\n" for r in rows
    )


def dedupe_untuned(files: Sequence[UntunedFile]) -> list[UntunedRow]:
    """Unique GEMMs across files (every device ordinal records its own), first seen first."""
    seen: set[tuple[str, str]] = set()
    out: list[UntunedRow] = []
    for f in files:
        for row in f.rows:
            if row.key not in seen:
                seen.add(row.key)
                out.append(row)
    return out


def is_placeholder(row: ResultRow) -> bool:
    """A row that records no measurement: no time (or none that is a finite non-negative
    number), or ``Default`` with time 0.

    ``ResultEntry::Default()`` in torch is ("Default", 0.0): what TunableOp falls back to without
    timing anything. A ``Default`` row with a positive time was measured like any other solution.
    """
    ms = row.ms
    return ms is None or (row.solution == DEFAULT_SOLUTION and ms == 0.0)


def _rank(row: ResultRow) -> tuple[int, float, str, str, str]:
    # A measured solution beats a placeholder; among measured ones the faster wins. The rest of
    # the key orders every distinct row, so merge(a, b) == merge(b, a) byte for byte.
    placeholder = is_placeholder(row)
    ms = 0.0 if placeholder else (row.ms or 0.0)
    return (int(placeholder), ms, row.solution, row.ms_text or "", row.blas or "")


def merge_results(files: Sequence[ResultsFile]) -> ResultsFile:
    """Union of results; for the same operator and parameters, the measured and faster solution.

    A timed row beats a placeholder (no time, or ``Default`` with time 0); among timed rows the
    lower time wins; remaining ties go by solution name, so the result does not depend on the
    order of the inputs.

    All inputs must carry the same validators: TunableOp loads a file only when every validator
    matches the running process, so rows tuned under different ones can never be served together.
    """
    if not files:
        raise ValueError("nothing to merge")
    merger = ResultsMerger()
    for f in files:
        merger.add(f)
    return merger.result()


class ResultsMerger:
    """merge_results one file at a time: memory grows with the distinct GEMMs, not the inputs
    (the sync sidecar merges a library of many overlapping entries this way)."""

    def __init__(self) -> None:
        self.validators: dict[str, str] | None = None
        self.best: dict[tuple[str, str], ResultRow] = {}
        self.inputs = 0

    def add(self, f: ResultsFile) -> None:
        """Raises ValidatorMismatchError (and keeps nothing of f) on other validators."""
        self.inputs += 1
        if self.validators is None:
            self.validators = dict(f.validators)
        elif f.validators != self.validators:
            validators = self.validators
            raise ValidatorMismatchError(
                f"results were tuned under different validators (input 1 vs input {self.inputs}): "
                + "; ".join(
                    f"{k} {_shown(validators.get(k))} vs {_shown(f.validators.get(k))}"
                    for k in sorted(set(validators) | set(f.validators))
                    if validators.get(k) != f.validators.get(k)
                )
            )
        best = self.best
        for row in f.rows:
            current = best.get(row.key)
            if current is None or _rank(row) < _rank(current):
                best[row.key] = row

    def keys(self) -> set[tuple[str, str]]:
        return set(self.best)

    def result(self) -> ResultsFile:
        best = self.best
        return ResultsFile(dict(self.validators or {}), [best[k] for k in sorted(best)])


def _shown(value: str | None) -> str:
    return "(absent)" if value is None else repr(value)


@dataclass(frozen=True)
class Outcomes:
    """How a results file's GEMMs came out: ``tuned + default == gemms``.

    ``tuned``: a solution other than ``Default`` won. ``default``: ``Default`` won, or was the
    only candidate (CUDA builds of torch before 2.14 have no other), so TunableOp only adds its
    per-GEMM lookup to what the untuned call costs.
    """

    tuned: int
    default: int

    @property
    def gemms(self) -> int:
        return self.tuned + self.default

    def to_dict(self) -> dict[str, int]:
        return {"tuned": self.tuned, "default": self.default}


def count_outcomes(results: ResultsFile) -> Outcomes:
    """Count a results file's GEMMs by outcome (one row per GEMM: its winning solution)."""
    default = sum(1 for r in results.rows if r.solution == DEFAULT_SOLUTION)
    return Outcomes(tuned=len(results.rows) - default, default=default)
