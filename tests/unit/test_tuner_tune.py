"""`tuner_job tune` against a stub torch: the call sequence of the single- and multi-GPU paths,
how limits reach TunableOp, mgpu's path quirks, failures of one GEMM, and the wall-clock budget.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tuner_job.gpu import TunerError
from tuner_job.results import read_results
from tuner_job.tune import make_tuning_dir, path_is_mgpu_safe

FAKE_TORCH = Path(__file__).parent / "data" / "fake_torch"
REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"

LIMITS = {
    "maxDurationMs": 7,
    "maxIterations": 11,
    "warmupDurationMs": 3,
    "warmupIterations": 2,
    "rotatingBufferMB": 5,
    "numericalCheck": True,
    "budgetSeconds": 60,
}


def tune(
    tmp: Path, *untuned: Path, gpus: int = 1, limits: dict[str, Any] | None = None, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    (tmp / "config.json").write_text(json.dumps({"gpus": gpus, "tuning": limits or LIMITS}))
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "TUNEFLEET_"))}
    full.update(
        PYTHONPATH=os.pathsep.join([str(FAKE_TORCH), str(REPO)]),
        FAKE_TORCH_LOG=str(tmp / "calls.jsonl"),
        FAKE_TORCH_GPUS=str(max(gpus, 1)),
        **env,
    )
    done = subprocess.run(
        [sys.executable, "-m", "tuner_job", "--termination-log", str(tmp / "tl"), "tune"]
        + ["--config", str(tmp / "config.json"), "--out", str(tmp / "results.csv"), "--untuned"]
        + [str(p) for p in untuned],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = tmp / "calls.jsonl"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, calls


def unique_keys(*paths: Path) -> set[tuple[str, str]]:
    return {tuple(line.split(",")[:2]) for p in paths for line in p.read_text().splitlines()}  # type: ignore[misc]


def tunable_on_cuda(keys: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """torch 2.11 on CUDA runs _scaled_mm outside TunableOp: its untuned rows tune to nothing."""
    return {k for k in keys if not k[0].startswith("ScaledGemm")}


def many_gemms(tmp: Path, n: int, marker: str = "") -> Path:
    path = tmp / "many_untuned0.csv"
    path.write_text(
        "".join(
            f"GemmTunableOp_BFloat16_TN,tn_{64 + i}_64_64{marker}_ld_64_64_{64 + i}\n"
            for i in range(n)
        )
    )
    return path


def test_single_gpu_sets_limits_through_the_python_api_then_tunes_each_gemm(
    tmp_path: Path,
) -> None:
    files = (DATA / "untuned0.csv", DATA / "untuned1.csv")
    # A user's own env value would override the Python API: the tuner drops it for the child.
    done, calls = tune(tmp_path, *files, PYTORCH_TUNABLEOP_MAX_TUNING_ITERATIONS="999")
    assert done.returncode == 0, done.stderr

    names = [c["event"] for c in calls]
    first_tune = names.index("tune_gemm_in_file")
    api = {c["event"]: c.get("value") for c in calls[:first_tune]}
    assert api["set_max_tuning_duration"] == 7
    assert api["set_max_tuning_iterations"] == 11
    assert api["set_rotating_buffer_size"] == 5
    # torch 2.11 has no Python API for the warm-up limits: they go by environment variable.
    assert "set_max_warmup_duration" not in names and "set_max_warmup_iterations" not in names
    assert api["set_numerical_check_tolerances"][0] is True
    assert api["enable"] is True and api["tuning_enable"] is True
    assert api["record_untuned_enable"] is False

    tunes = [c for c in calls if c["event"] == "tune_gemm_in_file"]
    expected = unique_keys(*files)
    assert len(tunes) == len(expected)  # de-duplicated: each GEMM tuned once
    assert "mgpu_tune_gemm_in_file" not in names
    for call in tunes:
        env = call["env"]
        assert env["MAX_TUNING_ITERATIONS"] is None and env["MAX_TUNING_DURATION_MS"] is None
        assert (env["MAX_WARMUP_DURATION_MS"], env["MAX_WARMUP_ITERATIONS"]) == ("3", "2")
        assert env["FILENAME"].endswith("tuned%d.csv")  # a fresh results path per run

    results = read_results(tmp_path / "results.csv")
    assert results.keys() == tunable_on_cuda(expected) != expected
    assert f"tuned {len(results.keys())} of {len(expected)} GEMM(s)" in done.stderr
    assert results.validators == {"PT_VERSION": "2.11.0+standin"}
    assert {r.solution for r in results.rows} == {"Default"}  # CUDA's only candidate


def by_pid(calls: list[dict[str, Any]], event: str) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for c in calls:
        if c["event"] == event:
            out.setdefault(c["pid"], []).append(c)
    return out


def test_multi_gpu_tunes_in_one_process_per_gpu_each_on_its_own_device(tmp_path: Path) -> None:
    """Defect: torch 2.11's mgpu_tune_gemm_in_file is a process pool whose workers never select
    a device and name their results file after their first GEMM: GEMMs of two GPUs could be
    timed on one at once. Now each GPU has its own process, device and share."""
    files = (DATA / "untuned0.csv", DATA / "untuned1.csv")
    done, calls = tune(tmp_path, *files, gpus=2)
    assert done.returncode == 0, done.stderr
    assert not [c for c in calls if c["event"] == "mgpu_tune_gemm_in_file"]
    tunes = by_pid(calls, "tune_gemm_in_file")
    assert len(tunes) == 2  # two worker processes
    devices = {pid: {c["device"] for c in cs} for pid, cs in tunes.items()}
    assert sorted(d for ds in devices.values() for d in ds) == [0, 1], devices
    limits = by_pid(calls, "set_max_tuning_duration")
    assert set(limits) == set(tunes) and all(cs[0]["value"] == 7 for cs in limits.values())
    for cs in tunes.values():
        env = cs[0]["env"]
        assert env["MAX_TUNING_DURATION_MS"] is None  # the API sets it, in each worker
        assert (env["MAX_WARMUP_DURATION_MS"], env["MAX_WARMUP_ITERATIONS"]) == ("3", "2")
    filenames = by_pid(calls, "set_filename")
    assert sorted(Path(cs[0]["value"][0]).name for cs in filenames.values()) == [
        "tuned0.csv",
        "tuned1.csv",
    ]
    assert read_results(tmp_path / "results.csv").keys() == tunable_on_cuda(unique_keys(*files))
    assert "split across 2 GPU(s)" in done.stderr


def test_numerical_check_reaches_every_worker_through_the_api(tmp_path: Path) -> None:
    done, calls = tune(
        tmp_path, DATA / "untuned0.csv", gpus=2, limits={**LIMITS, "numericalCheck": False}
    )
    assert done.returncode == 0, done.stderr
    checks = by_pid(calls, "set_numerical_check_tolerances")
    assert len(checks) == 2 and all(cs[0]["value"] == [False, 0.01, 0.01] for cs in checks.values())


@pytest.mark.parametrize("persona", ["2.11", "2.15"])
def test_with_n_gpus_a_rejected_gemm_is_skipped_and_reported(tmp_path: Path, persona: str) -> None:
    """Defect: with N GPUs one GEMM torch's offline tuner rejects failed the whole run (2.11's
    mgpu re-raises, 2.15's raises "offline tuning processes failed"), no report was written
    and every earlier chunk was discarded."""
    path = many_gemms(tmp_path, 6)
    refused = "GemmAndBiasTunableOp_BFloat16_NN,nn_64_64_64_ld_64_64_64\n"
    path.write_text(refused + path.read_text())
    done, _ = tune(tmp_path, path, gpus=2, FAKE_TORCH_PERSONA=persona)
    assert done.returncode == 0, done.stderr
    assert len(read_results(tmp_path / "results.csv").rows) == 6
    assert (
        "rejected GemmAndBiasTunableOp_BFloat16_NN,nn_64_64_64_ld_64_64_64: AssertionError"
        in done.stderr
    )
    assert "tuned 6 of 7 GEMM(s)" in done.stderr


def test_no_process_but_the_workers_holds_a_cuda_context(tmp_path: Path) -> None:
    """Defect: the tuner's process kept a CUDA context on GPU 0 while its child tuned (and
    mgpu's parent made one with torch.cuda.synchronize())."""
    done, calls = tune(tmp_path, DATA / "untuned0.csv", gpus=2)
    assert done.returncode == 0, done.stderr
    workers = set(by_pid(calls, "tune_gemm_in_file"))
    contexts = by_pid(calls, "cuda_context")
    assert contexts and set(contexts) <= workers
    imports = [c["argv"] for c in calls if c["event"] == "import"]
    assert imports and all("_tune-worker" in argv for argv in imports), imports


def test_one_gemm_torch_refuses_does_not_cost_the_others(tmp_path: Path) -> None:
    path = many_gemms(tmp_path, 3)
    # torch's offline tuner asserts that a GemmAndBias GEMM has exactly one operand transposed,
    # and skips (with a warning) GEMMs with a size-1 dimension in some layouts.
    refused = "GemmAndBiasTunableOp_BFloat16_NN,nn_64_64_64_ld_64_64_64\n"
    skipped = "GemmTunableOp_BFloat16_TN,tn_64_1_64_ld_64_64_64\n"
    path.write_text(path.read_text() + refused + skipped)
    done, _ = tune(tmp_path, path)
    assert done.returncode == 0, done.stderr
    assert "AssertionError: [stand-in torch] transA and transB must differ" in done.stderr
    assert "Offline tuning is not supported for this GEMM" in done.stderr
    assert "tuned 3 of 5 GEMM(s)" in done.stderr
    assert len(read_results(tmp_path / "results.csv").rows) == 3


def test_budget_stops_between_gemms_and_keeps_what_was_tuned(tmp_path: Path) -> None:
    # The child stops 10% of the budget early (0.4s here), more than one GEMM takes (0.15s).
    path = many_gemms(tmp_path, 30)
    start = time.monotonic()
    done, calls = tune(
        tmp_path, path, limits={**LIMITS, "budgetSeconds": 4}, FAKE_TORCH_TUNE_SLEEP="0.15"
    )
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    tuned = len(read_results(tmp_path / "results.csv").rows)
    assert 1 <= tuned < 30
    assert tuned == len([c for c in calls if c["event"] == "tune_gemm_in_file"])
    assert f"budget reached after {tuned} of 30 GEMMs" in done.stderr
    assert "stopping the tuning process" not in done.stderr  # a clean stop, no kill
    assert "tuning budget ran out" in done.stderr
    assert elapsed < 4 + 3  # stopped near the budget, not after all 30 x 0.15s


def test_budget_kills_a_tuning_process_stuck_inside_torch(tmp_path: Path) -> None:
    # A GEMM stuck inside torch gives no chance to stop between GEMMs: the process group is
    # killed at the budget, and the results torch had already appended survive.
    path = many_gemms(tmp_path, 8)
    start = time.monotonic()
    done, _ = tune(
        tmp_path,
        path,
        gpus=2,
        limits={**LIMITS, "budgetSeconds": 4},
        FAKE_TORCH_TUNE_HANG_AFTER="1",
    )
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    assert "stopping the tuning process" in done.stderr
    assert len(read_results(tmp_path / "results.csv").rows) == 2  # one per worker, then stuck
    assert elapsed < 4 + 10


def test_budget_gone_before_anything_was_tuned_is_an_error(tmp_path: Path) -> None:
    path = many_gemms(tmp_path, 2)
    done, _ = tune(
        tmp_path, path, gpus=2, limits={**LIMITS, "budgetSeconds": 1}, FAKE_TORCH_TUNE_SLEEP="3"
    )
    assert done.returncode == 1
    assert "tuning produced no results for 2 GEMM(s): the budget ran out first" in done.stderr
    assert not (tmp_path / "results.csv").exists()


def test_a_malformed_untuned_row_is_dropped_with_its_line_and_the_rest_tuned(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad0.csv"
    bad.write_text("GemmTunableOp_BFloat16_TN,tn_64_64_64_ld_64_64_64\nGemmTunableOp_BFloat16_TN\n")
    done, _ = tune(tmp_path, bad)
    assert done.returncode == 0, done.stderr
    assert f"{bad}:2: untuned row needs 2 fields" in done.stderr
    assert read_results(tmp_path / "results.csv").keys() == {
        ("GemmTunableOp_BFloat16_TN", "tn_64_64_64_ld_64_64_64")
    }


@pytest.mark.parametrize(
    ("path", "safe"),
    [
        ("/tmp/tunefleet-tune-abc", True),
        ("/tmp/run.1/x", False),  # mgpu's glob is built around the first '.'
        ("/var/tmp/job0/x", False),  # its copies use replace("0", i) on the whole path
    ],
)
def test_mgpu_path_rules(path: str, safe: bool) -> None:
    assert path_is_mgpu_safe(path) is safe


def test_tuning_dir_skips_unsafe_bases() -> None:
    base = make_tuning_dir(["/tmp"])  # pytest's own tmp paths end in digits like 0
    try:
        assert path_is_mgpu_safe(str(base))
        unsafe = base / "with.dot"
        unsafe.mkdir()
        made = make_tuning_dir([str(unsafe), str(base)])
        assert made.parent == base and path_is_mgpu_safe(str(made))
        with pytest.raises(TunerError, match="no writable directory"):
            make_tuning_dir([str(unsafe)])
    finally:
        shutil.rmtree(base)


def test_a_torch_results_file_with_repeated_keys_or_a_cut_row_is_kept_not_dropped(
    tmp_path: Path,
) -> None:
    """Defect: a results file torch left with a key written twice was dropped whole as
    'unfinished' (2,038 GEMMs lost in a real file); torch keeps the first row of each key."""
    from tuner_job.tune import _torch_files

    rows = "".join(
        f"GemmTunableOp_Half_TN,tn_{i}_8_8_ld_8_8_{i},Default,0.0{i % 9 + 1}\n"
        for i in range(1, 40)
    )
    text = "Validator,PT_VERSION,2.11.0\n" + rows + rows.splitlines(keepends=True)[3]
    (tmp_path / "tuned0.csv").write_text(text + "GemmTunableOp_Half_TN,tn_99_8_8_ld_8_8_99,Defa")
    logged: list[str] = []
    (parsed,) = _torch_files(tmp_path, logged.append)
    assert parsed.gemms == 39 and parsed.duplicates
    assert any("cut off" in line for line in logged)
