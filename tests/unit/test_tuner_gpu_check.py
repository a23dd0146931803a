"""scripts/gpu_check.py without a GPU: its arithmetic, its log parsing, its deadline, and one dry
run of scripts/gpu-check.sh with the stand-in torch (GPU_CHECK_WORKLOAD=matmul), so the single
unattended run on a lent GPU machine does not fail on the script itself."""

from __future__ import annotations

import collections
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKE_TORCH = Path(__file__).parent / "data" / "fake_torch"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


gc = load_script()


def test_clock_gives_each_step_what_is_left() -> None:
    clock = gc.Clock(100, now=0.0)
    assert clock.cap(30, now=10.0) == 30
    assert clock.cap(300, reserve=20, now=10.0) == 70
    assert clock.cap(30, reserve=20, now=95.0) == 0


def test_spread_is_median_with_range_or_quartiles() -> None:
    s = gc.spread([5.0, 1.0, 3.0])
    assert (s.n, s.median, s.low, s.high) == (3, 3.0, 1.0, 5.0)
    assert s.text(1, False) == "3.0 [1.0..5.0]"
    q = gc.spread([1.0, 2.0, 3.0, 4.0, 5.0], quartiles=True)
    assert (q.median, q.low, q.high, q.lo, q.hi) == (3.0, 2.0, 4.0, 1.0, 5.0)
    assert q.text(2, True) == "3.00 [2.00..4.00] (1.00..5.00)"
    assert gc.spread([7.0]).text(1, False) == "7.0 (one sample)"
    assert gc.spread([]) is None


LOG = """\
reading tuning results from /x/tunableop_results0.csv
ResultEntry found for GemmTunableOp_BFloat16_TN,tn_512_256_128_ld_128_128_512
ResultEntry found for GemmTunableOp_BFloat16_TN,tn_512_256_128_ld_128_128_512
missing params_signature, returning null ResultEntry for GemmTunableOp_BFloat16_TN,tn_1_8_64_ld_64_64_1
[stand-in torch] missing op_signature, returning null ResultEntry for GemmTunableOp_Half_NN,nn_2_2_2_ld_2_2_2
no result, using default
"""


def test_lookups_are_counted_from_tunableops_verbose_log() -> None:
    hits, misses = gc.parse_lookups(LOG)
    assert hits == {("GemmTunableOp_BFloat16_TN", "tn_512_256_128_ld_128_128_512"): 2}
    assert set(misses) == {
        ("GemmTunableOp_BFloat16_TN", "tn_1_8_64_ld_64_64_1"),
        ("GemmTunableOp_Half_NN", "nn_2_2_2_ld_2_2_2"),
    }


def test_lookup_checks_fail_when_loaded_results_are_not_used() -> None:
    tuned = {("A", "a"), ("B", "b")}
    recorded = tuned | {("C", "c")}
    failures, notes = gc.lookup_checks(
        collections.Counter({("A", "a"): 3}),
        collections.Counter({("B", "b"): 1, ("C", "c"): 2, ("D", "d"): 1}),
        tuned,
        recorded,
    )
    assert len(failures) == 1 and "loaded, not used" in failures[0]
    assert any("were not tuned" in n for n in notes)
    assert any("recording never saw" in n for n in notes)
    failures, _ = gc.lookup_checks(collections.Counter(), collections.Counter(), tuned, recorded)
    assert failures == ["no TunableOp lookup hit the loaded results"]


def test_tuner_timing_is_read_from_its_log() -> None:
    stderr = (
        "tuner_job: recorded 16 unique GEMM(s) in 1 file(s) in 12.25s\n"
        "tuner_job: tuning loop: 8.70s of the tuning process's 20.10s (the rest is ...)\n"
    )
    assert gc.parse_tuner_log(stderr) == {
        "record_s": 12.25,
        "loop_s": 8.7,
        "tuning_process_s": 20.1,
    }


def test_outcome_lines_say_when_only_default_was_tuned() -> None:
    lines = gc.outcome_lines({"tuned": 0, "default": 12})
    lt = gc.outcome_lines({"tuned": 0, "default": 12}, {"torch": "2.15.0+cu132", "hip": None})
    assert "no cuBLASLt algorithm beat Default" in " ".join(lt)
    assert lines[0].startswith("tuned rows: 12 Default, 0 other")
    assert "measures TunableOp's" in " ".join(lines) and "overhead" in " ".join(lines)
    assert len(gc.outcome_lines({"tuned": 3, "default": 9})) == 1


def test_a_step_past_its_time_is_stopped_with_its_children() -> None:
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    started = time.monotonic()
    with pytest.raises(gc.Failed, match="did not finish within 1s"):
        gc.run([sys.executable, "-c", code], dict(os.environ), 1.0, "stuck", min_s=0.5)
    assert time.monotonic() - started < 20
    with pytest.raises(gc.Skipped, match="deadline leaves"):
        gc.run([sys.executable, "-c", "pass"], dict(os.environ), 2.0, "late", min_s=5.0)


@pytest.mark.parametrize("persona", ["2.11", "2.15"])
def test_dry_run_with_the_stand_in_torch_prints_the_table(tmp_path: Path, persona: str) -> None:
    """The stand-in plays torch 2.11 and 2.15 on CUDA (the lent GPU machines run one of them):
    the script must run through under either."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "FAKE_TORCH"))}
    env.update(
        PYTHONPATH=str(FAKE_TORCH),
        PYTHON=sys.executable,
        GPU_CHECK_WORKLOAD="matmul",
        GPU_CHECK_DEADLINE_SECONDS="300",
        FAKE_TORCH_PERSONA=persona,
    )
    done = subprocess.run(
        [str(REPO / "scripts" / "gpu-check.sh"), "--repeats", "2", "--iters", "4"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    table = out[out.rindex("tunefleet gpu-check:") :]
    assert "Stand-in GPU" in table and f"torch {persona}.0+standin" in table
    assert "of a 285s deadline" in table
    assert "tuned rows: " in table
    if persona == "2.11":  # Default is CUDA 2.11's only candidate; 2.15 has cuBLASLt's
        assert " Default, 0 other" in table
        assert "offline-vs-off difference measures TunableOp's" in table
    else:
        assert " Default, 0 other" not in table
    assert "record-untuned with results loaded: " in table and "every GEMM" in table
    assert "of which the tuning loop" in table
    assert "lookups in an offline run:" in table
    for label in ("(a) TunableOp off", "(b) online tuning", "(c) offline results"):
        assert f"{label}" in table and "2 proc, 4 it" in table
    assert "tests/gpu: passed" in table
    assert table.rstrip().endswith("loaded and used by TunableOp on this GPU")


def test_a_deadline_too_short_for_every_step_is_incomplete_not_ok(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "FAKE_TORCH"))}
    env.update(PYTHONPATH=str(FAKE_TORCH), GPU_CHECK_WORKLOAD="matmul")
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--deadline-seconds", "120"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 1
    table = done.stdout[done.stdout.rindex("tunefleet gpu-check:") :]
    assert "INCOMPLETE: timing, TunableOp off #1: skipped, the deadline leaves" in table
    assert "GEMMs recorded:" in table  # what was measured is still shown
    assert "OK:" not in table


def test_the_deadline_must_stay_within_450_seconds() -> None:
    env = {**os.environ, "GPU_CHECK_DEADLINE_SECONDS": "451"}
    done = subprocess.run(
        [str(REPO / "scripts" / "gpu-check.sh")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and "60..450" in done.stderr
