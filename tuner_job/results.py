"""TunableOp CSV files: one parser and model for results and untuned files.

TunableOp writes two kinds of file (aten/src/ATen/cuda/tunable):

* results: ``Validator,KEY,VALUE`` lines, then ``OpSig,ParamSig,Solution,ms`` rows;
* untuned (record mode): ``OpSig,ParamSig`` rows.

With ``PYTORCH_TUNABLEOP_BLAS_LOG=1`` either kind gets one more field, ``BLAS_PARAMS: - { ... }``,
which itself contains commas, so it is taken as the rest of the line.

OpSig is ``<Family>TunableOp_<types>_<AB>``: ``GemmTunableOp_BFloat16_TN``,
``GemmStridedBatchedTunableOp_float_NN``, ``GemmAndBiasTunableOp_Half_TN``,
``ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN``.
ParamSig is ``<ab>_<m>_<n>_<k>[_B_<batch>]_ld_<lda>_<ldb>_<ldc>[...]``, for example
``tn_4096_4096_4096_ld_4096_4096_4096`` or ``tn_128_128_64_B_96_ld_64_64_128``; scaled GEMMs end
in ``_rw_<0|1>_bias_<dtype|None>``. Dimensions may be ``*`` (wildcard entries of recent torch).
The ``_ld_`` part is optional: files written by torch 2.4 and 2.6 have none, 2.7.1's have it.
The letters and dimensions are cuBLAS's column-major ones: ``torch.mm(A, B)`` on row-major
tensors runs as ``C^T = B^T A^T``, so its ``m`` is the product's columns, ``n`` its rows.

TunableOp reads a file with ``std::getline`` (lines end at LF only) and compares validators as
exact strings: a CRLF file or a byte-order mark makes it drop the whole file. Both are refused.

The parser is strict on purpose: a results file is content-addressed and shipped to every pod of
a fleet, so anything TunableOp would misread is refused here, with its line number, instead.
This module is stdlib-only: it runs in the user's image (tuner) and in ours (publish, fetch).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

VALIDATOR = "Validator"
BLAS_PREFIX = "BLAS_PARAMS:"
# TunableOp refuses a results file without this validator (TuningResultsValidator mandatory key).
MANDATORY_VALIDATOR = "PT_VERSION"

KNOWN_FAMILIES = ("Gemm", "GemmStridedBatched", "GemmAndBias", "ScaledGemm")

_OP_RE = re.compile(
    r"^(?P<family>[A-Za-z]+)TunableOp_(?P<types>[A-Za-z0-9_:<>]+)_(?P<layout>[NT]{2})$"
)
_DIM = r"(?:[1-9]\d*|\*)"  # no zero (and no leading zeros) dimension
_PARAM_RE = re.compile(
    rf"^(?P<ta>[ntcNTC])(?P<tb>[ntcNTC])_(?P<m>{_DIM})_(?P<n>{_DIM})_(?P<k>{_DIM})"
    rf"(?:_B_(?P<batch>{_DIM}))?"
    rf"(?:_ld_(?P<lda>{_DIM})_(?P<ldb>{_DIM})_(?P<ldc>{_DIM}))?"
    r"(?P<rest>(?:_[A-Za-z0-9.]+)*)$"
)
_SCALED_REST_RE = re.compile(r"^_rw_[01]_bias_[A-Za-z0-9]+$")
_VALIDATOR_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
_SOLUTION_RE = re.compile(r"^[^\s,\"]+$")


class CsvFormatError(ValueError):
    """A TunableOp CSV that TunableOp would misread; names the file and line."""

    def __init__(self, source: str, line: int, message: str) -> None:
        self.source = source
        self.line = line
        self.message = message
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
    rest: str


@dataclass(frozen=True)
class ResultRow:
    op: str
    params: str
    solution: str
    ms_text: str | None  # exactly as written, so a round trip keeps the bytes
    blas: str | None = None
    line: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return (self.op, self.params)

    @property
    def ms(self) -> float | None:
        return None if self.ms_text is None else float(self.ms_text)


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


@dataclass
class ResultsFile:
    validators: dict[str, str] = field(default_factory=dict)
    rows: list[ResultRow] = field(default_factory=list)

    @property
    def gemms(self) -> int:
        return len(self.rows)

    def keys(self) -> set[tuple[str, str]]:
        return {r.key for r in self.rows}


@dataclass
class UntunedFile:
    rows: list[UntunedRow] = field(default_factory=list)


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
            f"parameter signature {text!r} is not <ab>_<m>_<n>_<k>[_B_<b>]_ld_... "
            "with positive dimensions"
        )
    if op is not None:
        # The op's layout letters and the params' trans flags come from the same call; a
        # disagreement means a hand edit or a spliced line ('c', conjugate, is a transpose).
        flags = ("N" if m["ta"] in "nN" else "T") + ("N" if m["tb"] in "nN" else "T")
        if flags != op.layout:
            raise ValueError(f"layout {op.layout} of {op.raw} disagrees with {text!r}")
        if op.family == "GemmStridedBatched" and m["batch"] is None:
            raise ValueError(f"strided-batched GEMM {text!r} has no _B_<batch> part")
        if op.family != "GemmStridedBatched" and m["batch"] is not None:
            raise ValueError(f"{op.family} GEMM {text!r} has a batch part")
        rest = m["rest"]
        if op.family == "ScaledGemm":
            if rest and not _SCALED_REST_RE.match(rest):
                raise ValueError(f"scaled GEMM {text!r} does not end in _rw_<0|1>_bias_<type>")
        elif rest and op.family in KNOWN_FAMILIES:
            # e.g. a cut-off "..._ld_4096_40": the ld group did not match and fell through here.
            raise ValueError(f"parameter signature {text!r} has unexpected trailing {rest!r}")
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


def _split(line: str) -> tuple[list[str], str | None]:
    """Split a CSV line, keeping a BLAS_PARAMS tail (which contains commas) whole."""
    idx = line.find("," + BLAS_PREFIX)
    if idx >= 0:
        return line[:idx].split(","), line[idx + 1 :]
    return line.split(","), None


def _lines(text: str, source: str) -> Iterable[tuple[int, str]]:
    if text.startswith("\ufeff"):
        raise CsvFormatError(
            source,
            1,
            "starts with a UTF-8 byte-order mark (BOM): TunableOp reads the BOM as part of the "
            "first line, which is then no Validator line, and drops the whole file; "
            "save the file as UTF-8 without a BOM",
        )
    if "\x00" in text:
        raise CsvFormatError(source, text[: text.index("\x00")].count("\n") + 1, "NUL byte")
    if text and not text.endswith("\n"):
        # TunableOp ends every line with a newline; a missing one is a cut-off file.
        raise CsvFormatError(
            source, text.count("\n") + 1, "last line has no newline (truncated file?)"
        )
    for number, line in enumerate(text.split("\n")[:-1], start=1):
        if "\r" in line:
            # TunableOp splits on \n only: "2.11.0\r" would not equal this torch's PT_VERSION.
            what = (
                "CRLF line ending (\\r\\n)"
                if line.endswith("\r") and "\r" not in line[:-1]
                else "a carriage return (\\r)"
            )
            raise CsvFormatError(
                source,
                number,
                f"{what}: TunableOp splits lines on \\n only, keeps the \\r in the last field "
                "and so drops the whole file; convert the file to LF line endings",
            )
        if line.strip() == "":
            continue  # TunableOp skips empty lines too
        yield number, line


def _check_ms(value: str) -> None:
    try:
        ms = float(value)
    except ValueError:
        raise ValueError(f"time {value!r} is not a number") from None
    if math.isnan(ms) or ms < 0:
        raise ValueError(f"time {value!r} is not a non-negative number")


def parse_results(
    text: str, source: str = "<results>", *, require_rows: bool = False
) -> ResultsFile:
    """Parse a TunableOp results CSV; raise CsvFormatError naming the offending line."""
    out = ResultsFile()
    validator_lines: dict[str, int] = {}
    seen: dict[tuple[str, str], int] = {}
    for number, line in _lines(text, source):
        fields, blas = _split(line)
        try:
            if fields[0] == VALIDATOR:
                if blas is not None or len(fields) != 3:
                    raise ValueError(
                        f"validator line needs exactly 3 fields (Validator,KEY,VALUE), "
                        f"has {len(fields) + (blas is not None)}"
                    )
                key, value = fields[1], fields[2]
                if not _VALIDATOR_KEY_RE.match(key):
                    raise ValueError(f"validator key {key!r} is not UPPER_CASE")
                if value == "" or value != value.strip():
                    raise ValueError(f"validator {key} has an empty or padded value")
                if key in out.validators and out.validators[key] != value:
                    raise ValueError(
                        f"validator {key} is {value!r} here but {out.validators[key]!r} "
                        f"on line {validator_lines[key]}"
                    )
                out.validators[key] = value
                validator_lines.setdefault(key, number)
                continue
            if len(fields) not in (3, 4):
                raise ValueError(
                    f"result row needs 4 fields (OpSig,ParamSig,Solution,ms), has {len(fields)}"
                )
            _match_params(fields[1], parse_op_signature(fields[0]))
            solution = fields[2]
            if not _SOLUTION_RE.match(solution):
                raise ValueError(f"solution {solution!r} is empty or has spaces or quotes")
            ms_text = fields[3] if len(fields) == 4 else None
            if ms_text is not None:
                _check_ms(ms_text)
            row_key = (fields[0], fields[1])
            if row_key in seen:
                # TunableOp keeps the first and silently drops the rest: refuse the ambiguity.
                raise ValueError(f"{fields[0]},{fields[1]} already appears on line {seen[row_key]}")
            seen[row_key] = number
            out.rows.append(ResultRow(fields[0], fields[1], solution, ms_text, blas, number))
        except ValueError as exc:
            raise CsvFormatError(source, number, str(exc)) from None
    if MANDATORY_VALIDATOR not in out.validators:
        raise CsvFormatError(
            source, 0, f"no Validator,{MANDATORY_VALIDATOR} line: TunableOp would ignore the file"
        )
    if require_rows and not out.rows:
        raise CsvFormatError(source, 0, "no tuned GEMM rows")
    return out


def parse_untuned(text: str, source: str = "<untuned>") -> UntunedFile:
    """Parse an untuned-GEMM CSV written by PYTORCH_TUNABLEOP_RECORD_UNTUNED=1."""
    out = UntunedFile()
    for number, line in _lines(text, source):
        fields, blas = _split(line)
        try:
            if fields[0] == VALIDATOR:
                raise ValueError("validator line in an untuned file (is this a results file?)")
            if len(fields) != 2:
                raise ValueError(f"untuned row needs 2 fields (OpSig,ParamSig), has {len(fields)}")
            _match_params(fields[1], parse_op_signature(fields[0]))
        except ValueError as exc:
            raise CsvFormatError(source, number, str(exc)) from None
        out.rows.append(UntunedRow(fields[0], fields[1], blas, number, source))
    return out


def read_results(path: str | Path, *, require_rows: bool = False) -> ResultsFile:
    p = Path(path)
    return parse_results(_read_text(p), str(p), require_rows=require_rows)


def read_untuned(path: str | Path) -> UntunedFile:
    p = Path(path)
    return parse_untuned(_read_text(p), str(p))


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise CsvFormatError(str(path), line, "not UTF-8 text") from None


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


DEFAULT_SOLUTION = "Default"  # TunableOp's name for the untuned BLAS call (ResultEntry::Default)


def is_placeholder(row: ResultRow) -> bool:
    """A row that records no measurement: no time, or ``Default`` with time 0.

    ``ResultEntry::Default()`` in torch is ("Default", 0.0): what TunableOp falls back to without
    timing anything. A ``Default`` row with a positive time was measured like any other solution.
    """
    ms = row.ms
    return ms is None or (row.solution == DEFAULT_SOLUTION and ms == 0.0)


def _rank(row: ResultRow) -> tuple[int, float, str, str, str]:
    # A measured solution beats a placeholder; among measured ones the faster wins. The rest of
    # the key orders every distinct row, so merge(a, b) == merge(b, a) byte for byte.
    placeholder = is_placeholder(row)
    ms = 0.0 if placeholder else float(row.ms_text or 0)
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
