"""Differential: tunefleet's parser against real torch 2.11's reader (read_file + get_results).

For every file of a generated corpus (tests/conformance/corpus.py), and for real files when
TUNEFLEET_REAL_CORPUS names a directory of them (local use only; their validators must be what
2.11 accepts), tunefleet either yields exactly the rows torch yields, or refuses the file or drops
a row with a rule that docs/tuner.md lists as a deliberate difference.

torch 2.15 cannot load a file without a GPU (its validators query CUDA); its ReadFile calls the
same std::getline/strtod as 2.11's (REPORT: disassembly), so 2.11 is the reader's oracle.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.corpus import CASES, generated
from tests.support.torches import REPO, Torch
from tuner_job.results import (
    FILE_RULES,
    ROW_RULES,
    CsvFormatError,
    ResultsFile,
    ValidatorMismatchError,
    check_validators,
    decode,
    parse_results,
)

EXPECTED = {"PT_VERSION": "2.11.0"}
# Refusals of a file torch may still load (it keeps a BOM'd first line as a row, takes the last
# of two validator values, compares a CR into the value): each a deliberate difference.
DELIBERATE_FILE_RULES = {"bom", "validator-bad-bytes", "conflicting-validator"}
DOCS = (REPO / "docs" / "tuner.md").read_text(encoding="utf-8")


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _ms(value: Any) -> float:
    return float(value) if not isinstance(value, str) else float(value.strip("'"))


def tunefleet(
    data: bytes, *, validate: bool = True
) -> ResultsFile | CsvFormatError | ValidatorMismatchError:
    try:
        parsed = parse_results(decode(data), "file")
        if validate:
            check_validators(parsed, EXPECTED)
    except (CsvFormatError, ValidatorMismatchError) as exc:
        return exc
    return parsed


def compare(
    name: str, data: bytes, answer: dict[str, Any], seen: dict[str, int], validate: bool = True
) -> None:
    ours = tunefleet(data, validate=validate)
    torch_rows = {(r[0], r[1]): (r[2], _ms(r[3])) for r in answer["rows"]}
    if isinstance(ours, ValidatorMismatchError):
        assert not answer["loaded"], (
            f"{name}: torch loaded what tunefleet says it would not: {ours}"
        )
        return
    if isinstance(ours, CsvFormatError):
        seen[ours.rule] = seen.get(ours.rule, 0) + 1
        if answer["loaded"] and torch_rows:
            assert ours.rule in DELIBERATE_FILE_RULES, (
                f"{name}: torch loads {len(torch_rows)} rows, tunefleet refuses: {ours}"
            )
        return
    assert answer["loaded"], f"{name}: tunefleet accepts, torch refuses: {answer['warnings']}"
    for row in ours.rows:
        got = torch_rows.get(row.key)
        assert got is not None, f"{name}: tunefleet row {row.key} is not torch's"
        assert got[0] == row.solution and _same(got[1], row.torch_ms), (
            f"{name}: {row.key}: tunefleet {(row.solution, row.torch_ms)}, torch {got}"
        )
    dropped = {d.key: d for d in ours.dropped if d.key is not None}
    for key in set(torch_rows) - {r.key for r in ours.rows}:
        assert key in dropped, f"{name}: torch loads {key} -> {torch_rows[key]}, tunefleet lost it"
        rule = dropped[key].rule
        assert rule in ROW_RULES and not ROW_RULES[rule][1], (name, rule)
        seen[rule] = seen.get(rule, 0) + 1


def run_corpus(
    torch: Torch, files: dict[str, bytes], tmp: Path, originals: dict[str, bytes] | None = None
) -> dict[str, int]:
    """torch reads files; tunefleet reads the same, or (originals) each file as it was before
    its validators were rewritten for torch, without checking them against torch's."""
    paths = []
    for name, data in files.items():
        path = tmp / f"{name}.csv"
        path.write_bytes(data)
        paths.append(path)
    answers = torch.read(paths)
    seen: dict[str, int] = {}
    for (name, data), answer in zip(files.items(), answers, strict=True):
        if originals is None:
            compare(name, data, answer, seen)
        else:
            compare(name, originals[name], answer, seen, validate=False)
    return seen


def test_generated_corpus_reads_as_torch_211_reads_it(torch211: Torch, tmp_path: Path) -> None:
    files = {n: t.encode("utf-8") for n, t in {**CASES, **generated()}.items()}
    seen = run_corpus(torch211, files, tmp_path)
    # The corpus reaches every deliberate difference (else it does not test them).
    deliberate = {r for r, (_, same) in ROW_RULES.items() if not same} | DELIBERATE_FILE_RULES
    assert deliberate <= set(seen), f"not reached: {deliberate - set(seen)}"
    assert {"bom", "conflicting-validator", "never-looked-up", "number-as-solution"} <= set(seen)


def test_every_deliberate_difference_is_listed_in_the_docs() -> None:
    rules = [r for r, (_, same) in ROW_RULES.items() if not same] + sorted(FILE_RULES)
    missing = [r for r in rules if f"`{r}`" not in DOCS]
    assert not missing, f"docs/tuner.md does not list {missing}"


def test_a_complete_last_row_without_its_newline_loads_as_in_torch_211(
    torch211: Torch, tmp_path: Path
) -> None:
    """torch reads lines with std::getline: a last line without '\\n' is still a line. Where
    the row's solution ended with a comma, tunefleet keeps exactly the rows torch keeps."""
    names = [n for n in CASES if n.startswith("no-trailing-newline")]
    for name in names:
        (tmp_path / f"{name}.csv").write_text(CASES[name], encoding="utf-8", newline="")
    answers = torch211.read([tmp_path / f"{n}.csv" for n in names])
    for name, answer in zip(names, answers, strict=True):
        assert answer["loaded"] and len(answer["rows"]) == 2, (name, answer)
        ours = tunefleet(CASES[name].encode())
        assert isinstance(ours, ResultsFile), (name, ours)
        assert not ours.dropped, (name, ours.dropped)
        theirs = {(r[0], r[1]): (r[2], _ms(r[3])) for r in answer["rows"]}
        assert {r.key: (r.solution, r.torch_ms) for r in ours.rows} == theirs, name


def test_non_utf8_and_nul_bytes_read_as_torch_reads_them(torch211: Torch, tmp_path: Path) -> None:
    files = {
        "latin1-solution": b"Validator,PT_VERSION,2.11.0\n"
        + CASES["base"].encode()[28:-1]
        + b"\xe9\n",
        "nul-solution": CASES["solution-nul"].encode(),
        "latin1-row": b"Validator,PT_VERSION,2.11.0\nGemmTunableOp_float_NT,nt_1_1_1_ld_1_1_1,"
        b"Gemm_\xe9,0.1\n",
    }
    for name, data in files.items():
        (tmp_path / f"{name}.csv").write_bytes(data)
    answers = torch211.read([tmp_path / f"{n}.csv" for n in files])
    for (name, data), answer in zip(files.items(), answers, strict=True):
        ours = tunefleet(data)
        assert isinstance(ours, ResultsFile), name
        # torch loads the row (get_results() then fails to decode it in Python); tunefleet
        # drops it: it would be served as garbage.
        assert answer["loaded"] or answer.get("error"), name
        assert all(d.rule == "bad-bytes" for d in ours.dropped if d.key), name


@pytest.mark.skipif(
    not os.environ.get("TUNEFLEET_REAL_CORPUS"),
    reason="set TUNEFLEET_REAL_CORPUS to a directory of real results files (local use only)",
)
def test_real_files_read_as_torch_211_reads_them(torch211: Torch, tmp_path: Path) -> None:
    root = Path(os.environ["TUNEFLEET_REAL_CORPUS"])
    files, originals = {}, {}
    for path in sorted(root.glob("*.csv")):
        # 2.11 CUDA accepts exactly PT_VERSION 2.11.0: every validator line becomes that one
        # for torch; tunefleet reads the file as it is (its ROCm validators and solutions).
        text = path.read_bytes()
        lines = [ln for ln in text.split(b"\n") if not ln.startswith(b"Validator,")]
        files[path.stem] = b"Validator,PT_VERSION,2.11.0\n" + b"\n".join(lines)
        originals[path.stem] = text
    assert files, f"no *.csv in {root}"
    seen = run_corpus(torch211, files, tmp_path, originals)
    print(f"real corpus: {len(files)} files, refusals and drops by rule: {seen}")
    # An empty file is refused by both (it has no PT_VERSION); nothing else may differ.
    assert set(seen) <= {"no-pt-version"}, seen


def test_oracle_answers_match_what_the_issue_saw(torch211: Torch, tmp_path: Path) -> None:
    """A spot check of the oracle itself, so a broken probe cannot pass the differential."""
    names = ["base", "duplicate", "time-ms-suffix", "crlf", "ld-zero", "lost-solution"]
    for name in names:
        (tmp_path / f"{name}.csv").write_text(CASES[name], encoding="utf-8", newline="")
    got = {
        a["path"].rsplit("/", 1)[-1][:-4]: a
        for a in torch211.read([tmp_path / f"{n}.csv" for n in names])
    }
    assert got["base"]["loaded"] and len(got["base"]["rows"]) == 1
    assert [r[3] for r in got["duplicate"]["rows"] if r[1] == "nt_64_64_64_ld_64_64_64"] == [0.5]
    assert [r[3] for r in got["time-ms-suffix"]["rows"] if "64" in r[1]] == [0.25]
    assert not got["crlf"]["loaded"]
    assert any(re.match(r"nn_256_32_1_ld_0_1_256", r[1]) for r in got["ld-zero"]["rows"])
    assert [r[2] for r in got["lost-solution"]["rows"] if "64" in r[1]] == ["0.0403"]
