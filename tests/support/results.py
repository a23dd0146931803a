"""`rows(i)`: a TunableOp results file of publisher i's own GEMMs plus GEMMs every publisher
shares (publisher 0 the fastest), with `VALIDATORS`, for tests of library entries and their
compaction (unit: tests/unit/test_gc.py; e2e: tests/e2e/test_gc_s3.py)."""

from __future__ import annotations

from tuner_job.results import ResultRow, ResultsFile

VALIDATORS = {"PT_VERSION": "2.11.0", "GCN_ARCH_NAME": "gfx942:sramecc+:xnack-"}


def rows(i: int, n: int = 10, shared: int = 5) -> ResultsFile:
    """n rows of publisher i's own, plus `shared` GEMMs every publisher has (publisher 0 the
    fastest), in TunableOp's format."""
    own = [
        ResultRow(
            "GemmTunableOp_BFloat16_TN",
            f"tn_{64 + j}_{1000 + i}_64_ld_64_64_{64 + j}",
            f"Gemm_Hipblaslt_{i}",
            f"0.{j + 1:03d}",
        )
        for j in range(n)
    ]
    common = [
        ResultRow(
            "GemmTunableOp_BFloat16_TN",
            f"tn_{64 + j}_77_64_ld_64_64_{64 + j}",
            f"Gemm_Rocblas_{i}",
            f"0.{i + 1:03d}",
        )
        for j in range(shared)
    ]
    return ResultsFile(dict(VALIDATORS), own + common)
