"""The store and library pieces tunefleet-gc stands on: a listing of the whole store, and the
library reader's newest-first order past its bounds."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from tunefleet.artifacts.library import library_prefix, read_library
from tunefleet.storage.filesystem import DirStore
from tunefleet.storage.registry import parse_uri
from tuner_job.library import EntrySource, library_key, make_entry
from tuner_job.results import ResultRow, ResultsFile, format_results

MODEL = "AMD_Instinct_MI300X_OAM"
VALIDATORS = {"PT_VERSION": "2.11.0", "GCN_ARCH_NAME": "gfx942:sramecc+:xnack-"}
IDENTITY = {"gpuName": "AMD Instinct MI300X", "arch": "gfx942:sramecc+:xnack-"}
KEY = library_key(MODEL, VALIDATORS, IDENTITY)


def rows(i: int, n: int = 10) -> ResultsFile:
    return ResultsFile(
        dict(VALIDATORS),
        [
            ResultRow(
                "GemmTunableOp_BFloat16_TN",
                f"tn_{64 + j}_{1000 + i}_64_ld_64_64_{64 + j}",
                f"Gemm_Hipblaslt_{i}",
                f"0.{j + 1:03d}",
            )
            for j in range(n)
        ],
    )


def place(store: DirStore, results: ResultsFile, profile: str) -> str:
    data = make_entry(
        gpu_model=MODEL,
        validators=VALIDATORS,
        identity=IDENTITY,
        source=EntrySource("ml", profile, "3f2a9c01de", "ab" * 32),
        results_text=format_results(results),
    )
    prefix = library_prefix(store.location, "namespace", "ml", MODEL, KEY)
    key = f"{prefix}/{hashlib.sha256(data).hexdigest()}.json"
    store.put(key, data, "application/json")
    return key


def test_library_reads_past_the_byte_cap_prefer_the_newest_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tunefleet.artifacts.library as lib

    store = DirStore(parse_uri(f"file://{tmp_path}"))
    a, b = place(store, rows(1), "a"), place(store, rows(2), "b")
    older, newer = sorted([a, b])  # the first by key is the older: key order would read it
    now = time.time()
    os.utime(tmp_path / older, (now - 600, now - 600))
    os.utime(tmp_path / newer, (now - 60, now - 60))
    monkeypatch.setattr(lib, "MAX_TOTAL_BYTES", (tmp_path / newer).stat().st_size + 10)
    view = read_library(store, store.location, "namespace", "ml", MODEL, KEY, VALIDATORS)
    assert view.entries == 1
    assert [o for o, _ in view.skipped] == [older]
    assert format_results(view.results) == format_results(rows(1 if newer == a else 2))


def test_the_whole_store_lists_with_an_empty_prefix(tmp_path: Path) -> None:
    store = DirStore(parse_uri(f"file://{tmp_path}"))
    key = place(store, rows(1), "a")
    store.put("ml/llama/x.json", b"{}", "application/json")
    assert [o.key for o in store.list("", 100)] == sorted([key, "ml/llama/x.json"])
