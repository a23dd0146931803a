"""What an artifact buys (tuner_job/gain.py): the statistics, the measuring loop and the gate,
and the tuner measuring a real run with the stand-in torch's timing knob.

The gate's promise is tested as a property over many seeded noisy runs: an artifact exactly as
fast as none is never failed by noise alone; a real loss is failed; a real gain passes.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.builders.tuner import write_config
from tests.support.tuner import tuner
from tuner_job.gain import (
    Figure,
    Gain,
    Measurement,
    judge,
    median_interval,
    paired,
)
from tuner_job.manifest import loads


def test_the_median_interval_widens_to_min_max_with_few_values_and_narrows_with_many() -> None:
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)
    values = [float(i) for i in range(1, 31)]
    low, high = median_interval(values)
    assert 1.0 < low < 15.5 < high < 30.0
    with pytest.raises(ValueError):
        median_interval([])


def test_a_figure_is_the_median_of_paired_ratios() -> None:
    f = paired("workload", [2.0, 2.0, 2.2], [1.0, 1.1, 1.0])
    assert f.speedup == pytest.approx(2.0)
    assert (f.low, f.high) == (pytest.approx(2.0 / 1.1), pytest.approx(2.2))
    assert f.saved_s == pytest.approx(2.0 - 1.0)
    assert f.repetitions == 3
    with pytest.raises(ValueError):
        paired("workload", [1.0], [0.0])
    with pytest.raises(ValueError):
        paired("workload", [1.0, 2.0], [1.0])


def _noisy(rng: random.Random, mean: float, noise: float) -> float:
    return mean * (1 + rng.uniform(-noise, noise))


def _measured(seed: int, base: float, tuned: float, noise: float, pairs: int = 15) -> Figure:
    rng = random.Random(seed)
    m = Measurement(
        "workload",
        lambda: _noisy(rng, base, noise),
        lambda: _noisy(rng, tuned, noise),
        budget_s=1e9,
        max_pairs=pairs,
    )
    got = m.run()
    assert got is not None
    return got


@pytest.mark.parametrize("noise", [0.02, 0.1, 0.3])
def test_noise_alone_never_fails_an_artifact_as_fast_as_none(noise: float) -> None:
    for seed in range(300):
        f = _measured(seed, 1.0, 1.0, noise)
        verdict = judge(Gain((f,)))
        assert verdict.passed, (seed, f, verdict.message)


@pytest.mark.parametrize("noise", [0.02, 0.1])
def test_a_real_loss_is_failed_and_says_which_figure_and_by_how_much(noise: float) -> None:
    for seed in range(100):
        f = _measured(seed, 1.0, 1.3, noise)  # 30% slower with the artifact
        verdict = judge(Gain((f,)))
        assert not verdict.passed, (seed, f)
        assert verdict.failed == "workload"
        assert "below the 1.00x spec.promotion asks" in verdict.message
        assert f"{f.speedup:.2f}x" in verdict.message


def test_a_real_gain_passes_and_a_minimum_gain_it_falls_short_of_fails() -> None:
    for seed in range(100):
        f = _measured(seed, 1.5, 1.0, 0.1)  # 1.5x
        assert judge(Gain((f,))).passed
        assert judge(Gain((f,)), min_gain=0.2).passed
        assert not judge(Gain((f,)), min_gain=1.0).passed  # asks for 2x


def test_every_figure_must_pass() -> None:
    good = paired("workload", [2.0] * 5, [1.0] * 5)
    bad = paired("gemms", [1.0] * 5, [2.0] * 5)
    verdict = judge(Gain((good, bad)))
    assert not verdict.passed and verdict.failed == "gemms"


def test_an_unmeasured_artifact_passes_and_says_so() -> None:
    assert judge(None).passed
    verdict = judge(Gain((), note="no time left"))
    assert verdict.passed and verdict.message == "not measured: no time left"


def test_stand_in_figures_are_labelled_wherever_the_verdict_is_shown() -> None:
    f = paired("gemms", [2.0] * 5, [1.0] * 5)
    assert "stand-in" in judge(Gain((f,), stand_in=True)).message
    assert "stand-in" not in judge(Gain((f,))).message
    lost = paired("gemms", [1.0] * 5, [2.0] * 5)
    assert "stand-in" in judge(Gain((lost,), stand_in=True)).message


def test_measuring_stops_when_the_interval_is_narrow_or_the_budget_ends() -> None:
    steady = Measurement("workload", lambda: 2.0, lambda: 1.0, budget_s=1e9)
    f = steady.run()
    assert f is not None and f.repetitions == 5  # settled at the minimum
    now = [0.0]

    def slow(seconds: float) -> float:
        now[0] += seconds
        return seconds

    capped = Measurement(
        "workload", lambda: slow(1.0), lambda: slow(2.0), budget_s=7.0, clock=lambda: now[0]
    )
    got = capped.run()
    # a pair takes 3 s: two fit in 7 s, a third would not (it is not started)
    assert got is not None and got.repetitions == 2
    assert Measurement("workload", lambda: 1.0, lambda: 1.0, budget_s=0).run() is None


def test_runs_alternate_abba_so_drift_hits_both_arms() -> None:
    order: list[str] = []
    Measurement(
        "workload",
        lambda: order.append("b") or 1.0,  # type: ignore[func-returns-value]
        lambda: order.append("t") or 1.0,  # type: ignore[func-returns-value]
        budget_s=1e9,
        max_pairs=4,
    ).run()
    assert "".join(order) == "bttbbttb"


def test_figures_round_trip_and_malformed_ones_are_dropped() -> None:
    f = paired("gemms", [2.0, 2.1, 1.9], [1.0, 1.0, 1.0])
    g = Gain((f,), stand_in=True, mode="CUDAGraphs", note="x")
    back = Gain.from_dict(json.loads(json.dumps(g.to_dict())))
    assert back is not None and back.stand_in and back.mode == "CUDAGraphs"
    assert back.figures[0].speedup == pytest.approx(f.speedup)
    bad = [
        {**f.to_dict(), "speedup": "fast"},
        {**f.to_dict(), "name": "other"},
        {**f.to_dict(), "low": 3.0},  # interval not around the median
        {**f.to_dict(), "repetitions": True},
        {**f.to_dict(), "speedup": float("nan")},
        "x",
    ]
    assert Gain.from_dict({"figures": bad}) == Gain()
    assert Gain.from_dict({"figures": "x"}) is None
    assert Gain.from_dict(None) is None


def _promotion(budget: float = 60) -> dict[str, object]:
    return {"measure": True, "servingMode": "Eager", "budgetSeconds": budget}


@pytest.mark.parametrize(("speedup", "passes"), [("3", True), ("0.4", False)])
def test_the_tuner_measures_the_gemms_it_tuned_with_the_stand_in_timing_knob(
    tmp_path: Path, speedup: str, passes: bool
) -> None:
    cfg = write_config(tmp_path, promotion=_promotion())
    done = tuner(
        tmp_path, "run", "--config", str(cfg), "--out", "out",
        env={"FAKE_TORCH_BACKEND": "rocm", "FAKE_TORCH_GEMM_SLEEP": "0.002",
             "FAKE_TORCH_TUNED_SPEEDUP": speedup},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    manifest = loads((tmp_path / "out" / "manifest.json").read_bytes())
    gain = manifest.gain
    assert gain is not None and gain.stand_in, done.stderr
    figure = gain.figure("gemms")
    assert figure is not None, gain
    assert figure.repetitions >= 3
    assert judge(gain).passed is passes, figure
    assert "measured gemms" in done.stderr and "[stand-in timings]" in done.stderr


def _tune_workload(
    tmp_path: Path, script: str, budget: float = 60
) -> tuple[subprocess.CompletedProcess[str], Gain | None]:
    """The tuner run on `script` as the workload (a torchCompile cache, measured with the
    stand-in's knob set so timings may be taken): the run, and the manifest's gain."""
    (tmp_path / "serve.py").write_text(script)
    cfg = write_config(
        tmp_path,
        workload={"command": [sys.executable, str(tmp_path / "serve.py")]},
        artifacts={"tunableop": False, "caches": [{"kind": "torchCompile"}]},
        promotion=_promotion(budget=budget),
    )
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out",
                 env={"FAKE_TORCH_GEMM_SLEEP": "0.001"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done, loads((tmp_path / "out" / "manifest.json").read_bytes()).gain


def test_the_tuner_measures_the_workload_with_and_without_its_caches(tmp_path: Path) -> None:
    # A workload that is slow while its cache directory is empty and fills it: what a compile
    # cache does. Each run starts from fresh directories, so only the tuned arm is warm.
    _, gain = _tune_workload(
        tmp_path,
        "import os, pathlib, time\n"
        "d = pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
        "if not any(d.iterdir()):\n"
        "    time.sleep(0.3)\n"
        "    (d / 'kernel.so').write_text('compiled')\n",
    )
    assert gain is not None
    f = gain.figure("workload")
    assert f is not None, gain
    assert f.speedup > 1.5 and f.saved_s > 0.2, f
    assert judge(gain).passed


def test_without_promotion_nothing_is_measured(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out")
    assert done.returncode == 0, done.stderr
    assert loads((tmp_path / "out" / "manifest.json").read_bytes()).gain is None
    assert "gain" not in json.loads((tmp_path / "out" / "manifest.json").read_text())


def test_the_stand_in_without_its_knob_is_not_measured_and_says_why(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, promotion=_promotion())
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out",
                 env={"FAKE_TORCH_BACKEND": "rocm"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    gain = loads((tmp_path / "out" / "manifest.json").read_bytes()).gain
    assert gain is not None and gain.figures == () and gain.stand_in
    assert "computes nothing" in gain.note
    assert judge(gain).passed


def test_a_workload_that_hangs_while_measured_is_stopped_at_the_budget_and_keeps_its_pairs(
    tmp_path: Path,
) -> None:
    # The first run fills the cache (the tuning run), then four measured runs answer; the next
    # one hangs. It is stopped where the measuring budget ends, and the two pairs measured
    # before it are the figure (not "not measured": the Job's time was spent on them).
    (tmp_path / "serve.py").write_text(
        "import os, pathlib, time\n"
        f"n = pathlib.Path({str(tmp_path / 'runs')!r})\n"
        "count = int(n.read_text()) + 1 if n.exists() else 1\n"
        "n.write_text(str(count))\n"
        "if count > 5:\n"
        "    time.sleep(600)\n"
        "d = pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
        "if not any(d.iterdir()):\n"
        "    (d / 'kernel.so').write_text('compiled')\n"
    )
    cfg = write_config(
        tmp_path,
        workload={"command": [sys.executable, str(tmp_path / "serve.py")]},
        artifacts={"tunableop": False, "caches": [{"kind": "torchCompile"}]},
        promotion=_promotion(budget=8),
    )
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out",
                 env={"FAKE_TORCH_GEMM_SLEEP": "0.001"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    gain = loads((tmp_path / "out" / "manifest.json").read_bytes()).gain
    assert gain is not None
    f = gain.figure("workload")
    assert f is not None and f.repetitions == 2, (gain, done.stderr[-2000:])
    assert "measuring stopped" in done.stderr


# --- fails closed: an arm that fails with the artifact rejects it --------------------------------


def test_a_workload_that_crashes_only_with_its_artifact_is_rejected_with_the_cause(
    tmp_path: Path,
) -> None:
    """Before, the crash made the workload "not measured" and the gate promoted it."""
    done, gain = _tune_workload(
        tmp_path,
        "import os, pathlib, signal\n"
        "d = pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
        "if any(d.iterdir()):\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)  # what a bad kernel in a cache does\n"
        "(d / 'kernel.so').write_text('compiled')\n",
    )  # measuring never fails the Job: the gate decides
    assert gain is not None and gain.failed is not None, (gain, done.stderr[-2000:])
    assert gain.failed.figure == "workload"
    assert "killed by SIGSEGV with the artifact loaded (without it, it ran)" in gain.failed.cause
    verdict = judge(gain)
    assert not verdict.passed and verdict.failed == "workload"
    assert verdict.message.startswith("workload failed with the artifact: the workload was killed")
    assert "the gate rejects it" in done.stderr


def test_a_workload_that_fails_without_the_artifact_too_is_not_the_artifacts_failure(
    tmp_path: Path,
) -> None:
    # Fails from the first measured run on, with or without: the workload is broken, the
    # artifact is not to blame (the tuning run itself, before, succeeded).
    _, gain = _tune_workload(
        tmp_path,
        "import os, pathlib, sys\n"
        f"n = pathlib.Path({str(tmp_path / 'runs')!r})\n"
        "count = int(n.read_text()) + 1 if n.exists() else 1\n"
        "n.write_text(str(count))\n"
        "d = pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
        "(d / 'kernel.so').write_text('compiled')\n"
        "sys.exit(0 if count == 1 else 7)\n",
    )
    assert gain is not None and gain.failed is None and gain.figures == (), gain
    assert "workload not measured: workload command exited with status 7" in gain.note
    assert judge(gain).passed


def test_torch_refusing_the_results_while_measuring_is_a_failure_not_unmeasured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import subprocess

    from tuner_job import measure

    class Cfg:
        class promotion:  # shaped like TuningConfig.promotion
            mode = "Eager"

        shapes = ()

    def child(code: int, stderr: str) -> object:
        return lambda *a, **k: subprocess.CompletedProcess(a, code, "", stderr)

    refused = "torch refused the results (/r.csv): read_file failed in the image they were tuned in"
    monkeypatch.setattr(measure.subprocess, "run", child(measure._REFUSED_EXIT, refused))
    got = measure._gemms(Cfg(), tmp_path / "r.csv", tmp_path, 10, lambda m: None)  # type: ignore[arg-type]
    assert got == measure.Failure("gemms", refused)
    monkeypatch.setattr(measure.subprocess, "run", child(-11, "Segmentation fault"))
    got = measure._gemms(Cfg(), tmp_path / "r.csv", tmp_path, 10, lambda m: None)  # type: ignore[arg-type]
    assert isinstance(got, measure.Failure) and "killed by SIGSEGV" in got.cause


def test_the_gemm_child_exits_refused_when_read_file_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import types

    from tuner_job import measure

    tunable = types.SimpleNamespace(
        tuning_enable=lambda on: None, record_untuned_enable=lambda on: None,
        enable=lambda on: None, set_filename=lambda *a: None, read_file=lambda path: False,
    )  # fmt: skip
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(tunable=tunable))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(measure._GemmBench, "_op", lambda self, s: lambda: None)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"results": "/r.csv", "mode": "Eager", "budgetSeconds": 1,
                                "shapes": [{"m": 8, "n": 8, "k": 8}]}))  # fmt: skip
    assert measure.child_main(str(spec)) == measure._REFUSED_EXIT
    assert "torch refused the results (/r.csv)" in capsys.readouterr().err


def test_a_failure_round_trips_and_a_malformed_one_still_fails() -> None:
    from tuner_job.gain import Failure

    gain = Gain((), False, "Eager", "", Failure("gemms", "torch refused the results"))
    assert Gain.from_dict(json.loads(json.dumps(gain.to_dict()))) == gain
    forged = Gain.from_dict({"figures": [], "failed": "yes"})
    assert forged is not None and not judge(forged).passed


# --- fails closed on hangs: a run with the artifact that never finishes rejects it (issue 54) ---

# Set only in the arm with the artifact: a torchCompile cache that is not empty.
_TUNED = "any(pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR']).iterdir())"
_FILL = "(pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR']) / 'kernel.so').write_text('k')\n"


def test_a_workload_that_hangs_only_with_its_artifact_is_rejected_with_the_figure(
    tmp_path: Path,
) -> None:
    """Before, the hang made the workload "not measured" and the gate promoted it: a run 10%
    slower was rejected, one that never finished was served."""
    done, gain = _tune_workload(
        tmp_path,
        f"import os, pathlib, time\nif {_TUNED}:\n    time.sleep(600)\n{_FILL}",
        budget=2,
    )
    assert gain is not None and gain.failed is not None, (gain, done.stderr[-2000:])
    assert gain.failed.figure == "workload" and gain.figures == ()
    assert gain.failed.cause.startswith("with the artifact the workload did not finish in ")
    assert "; without it, it took " in gain.failed.cause, gain.failed.cause
    verdict = judge(gain)
    assert not verdict.passed and verdict.failed == "workload"
    assert "did not finish in" in verdict.message
    assert "the gate rejects it" in done.stderr


def test_a_workload_that_hangs_without_its_artifact_too_is_not_measured_not_rejected(
    tmp_path: Path,
) -> None:
    # Only the tuning run (the first) finishes: the baseline hangs as well, so there is nothing
    # to compare and the artifact is not to blame.
    done, gain = _tune_workload(
        tmp_path,
        "import os, pathlib, time\n"
        f"n = pathlib.Path({str(tmp_path / 'runs')!r})\n"
        "count = int(n.read_text()) + 1 if n.exists() else 1\n"
        "n.write_text(str(count))\n"
        "if count > 1:\n"
        "    time.sleep(600)\n" + _FILL,
        budget=2,
    )
    assert gain is not None and gain.failed is None and gain.figures == (), done.stderr[-2000:]
    assert "without the artifact the workload did not finish in" in gain.note, gain.note
    verdict = judge(gain)
    assert verdict.passed and verdict.message.startswith("not measured: workload not measured")


def test_a_workload_merely_slower_with_its_artifact_is_rejected_by_its_figure(
    tmp_path: Path,
) -> None:
    # It finishes every time: a figure, judged against minGain, not a failure.
    done, gain = _tune_workload(
        tmp_path, f"import os, pathlib, time\nif {_TUNED}:\n    time.sleep(0.3)\n{_FILL}", budget=3
    )
    assert gain is not None and gain.failed is None, (gain, done.stderr[-2000:])
    f = gain.figure("workload")
    assert f is not None and f.speedup < 0.8, gain
    verdict = judge(gain)
    assert not verdict.passed and verdict.failed == "workload"
    assert "below the 1.00x spec.promotion asks" in verdict.message


def test_a_run_with_the_artifact_cut_short_by_the_budget_is_not_blamed_on_it(
    tmp_path: Path,
) -> None:
    # As fast either way (1.2 s), but the baseline leaves the arm with the artifact 1 s of a
    # 1.5 s budget: it is stopped, and that is the budget's end, not a hang to reject.
    done, gain = _tune_workload(
        tmp_path, f"import os, pathlib, time\ntime.sleep(1.2)\n{_FILL}", budget=1.5
    )
    assert gain is not None and gain.failed is None and gain.figures == (), done.stderr[-2000:]
    assert "the budget ended" in gain.note, gain.note
    assert judge(gain).passed


# --- a served model's capacity and speed: what a cache may not cost ---------------------------

# A workload that serves a model and reports like examples/vllm/warmup.py (tuner_job/
# serving.py's contract): with the cache warm it is ready sooner, but its server's KV cache
# holds 5% fewer tokens (vllm#54383: a compiled model's profiling leaves it less memory) or, in
# the second case, decoding is slower.
_SERVER = (
    "import json, os, pathlib, time\n"
    "d = pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
    "warm = any(d.iterdir())\n"
    "if not warm:\n"
    "    time.sleep(0.3)\n"
    "    (d / 'kernel.so').write_text('compiled')\n"
    "kv, tps = {kv}, {tps}\n"
    "report = {{'version': 1, 'readySeconds': 0.05 if warm else 0.35,\n"
    "          'kvCacheTokens': kv if warm else 100000,\n"
    "          'decodeTokensPerSecond': tps if warm else 40.0, 'emptyArtifact': {empty}}}\n"
    "if 'TUNEFLEET_SERVING_REPORT' in os.environ:  # set while measuring only\n"
    "    pathlib.Path(os.environ['TUNEFLEET_SERVING_REPORT']).write_text(json.dumps(report))\n"
)


def test_a_cache_that_costs_kv_cache_capacity_is_rejected_with_the_figure(tmp_path: Path) -> None:
    _, gain = _tune_workload(tmp_path, _SERVER.format(kv=95000, tps=40.0, empty="''"))
    assert gain is not None and gain.serving is not None, gain
    f = gain.figure("workload")
    assert f is not None and f.speedup > 1.5  # faster to start...
    assert gain.serving.kv_tokens == (100000, 95000) and gain.serving.kv_spread == 0
    verdict = judge(gain)  # ...and rejected all the same
    assert not verdict.passed and verdict.failed == "serving"
    assert verdict.message.startswith(
        "the KV cache holds 95,000 tokens with the artifact against 100,000 without (-5.0%"
    ), verdict.message
    # status and `kubectl tunefleet why` carry the figures: they round-trip.
    again = Gain.from_dict(json.loads(json.dumps(gain.to_dict())))
    assert again is not None and again.serving == gain.serving
    assert not judge(again).passed


def test_a_cache_that_slows_decoding_is_rejected_and_one_within_noise_passes(
    tmp_path: Path,
) -> None:
    for arm in ("slow", "same"):
        (tmp_path / arm).mkdir()
    _, slow = _tune_workload(tmp_path / "slow", _SERVER.format(kv=100000, tps=30.0, empty="''"))
    assert slow is not None and slow.serving is not None
    verdict = judge(slow)
    assert not verdict.passed and verdict.failed == "serving"
    assert "decoding runs at 30 tokens/s with the artifact against 40 without: 0.75x" in (
        verdict.message
    )
    _, same = _tune_workload(tmp_path / "same", _SERVER.format(kv=99500, tps=39.8, empty="''"))
    assert same is not None and same.serving is not None
    verdict = judge(same)
    assert verdict.passed, verdict.message
    assert "KV cache 100,000 -> 99,500 tokens" in verdict.message


def test_a_cache_whose_compiled_model_loads_empty_is_refused(tmp_path: Path) -> None:
    said = "reconstructed serializable fn from standalone compile artifacts. num_artifacts=0"
    _, gain = _tune_workload(tmp_path, _SERVER.format(kv=100000, tps=40.0, empty=repr(said)))
    assert gain is not None and gain.failed is not None
    assert gain.failed.cause.startswith("the server loaded an empty compiled model from it")
    assert not judge(gain).passed


def test_serving_figures_that_do_not_parse_are_dropped_whole() -> None:
    good = {"pairs": 5, "kvCacheTokens": {"baseline": 100, "tuned": 90, "baselineSpread": 0.0}}
    assert Gain.from_dict({"figures": [], "serving": good}).serving is not None  # type: ignore[union-attr]
    for bad in (
        {**good, "pairs": 0},
        {**good, "kvCacheTokens": {"baseline": 100.5, "tuned": 90, "baselineSpread": 0}},
        {"pairs": 5, "decodeTokensPerSecond": {"baseline": 4, "tuned": 5, "ratio": 2,
                                               "low": 2.5, "high": 3}},
        "nope",
    ):  # fmt: skip
        assert Gain.from_dict({"figures": [], "serving": bad}).serving is None  # type: ignore[union-attr]


_FAKE_VLLM = Path(__file__).parent / "data" / "fake_vllm"
_WARMUP = Path(__file__).resolve().parents[2] / "examples" / "vllm" / "warmup.py"


@pytest.mark.parametrize("empty", [False, True])
def test_the_vllm_workload_writes_the_report_the_tuner_reads(tmp_path: Path, empty: bool) -> None:
    """examples/vllm/warmup.py against a stand-in server speaking vLLM's lines: its report is
    what tuner_job/serving.py parses (the contract's two ends), the figures from the log and
    from timing decoding."""
    import socket

    from tuner_job import serving as sv

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    report = tmp_path / "report.json"
    env = {"PYTHONPATH": str(_FAKE_VLLM), "PATH": "/usr/bin:/bin", sv.REPORT_ENV: str(report),
           "FAKE_VLLM_TOKEN_S": "0.005", "FAKE_VLLM_KV": "12,345",
           **({"FAKE_VLLM_EMPTY": "1"} if empty else {})}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(_WARMUP), "--port", str(port), "--", "--model", "/m"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = sv.parse(report.read_text())
    assert got is not None
    assert got.kv_cache_tokens == 12345
    assert got.ready_s is not None and got.ready_s > 0
    # 64 tokens after the first, at 5 ms each: about 200 tokens/s (HTTP round trips cancel).
    assert got.decode_tps is not None and 100 < got.decode_tps < 210, got
    assert bool(got.empty_artifact) is empty
    if empty:
        assert "num_artifacts=0" in got.empty_artifact
    result = json.loads(done.stdout.split("TUNEFLEET_RESULT ", 1)[1].splitlines()[0])
    assert result["kvCacheTokens"] == 12345 and result["decodeTokensPerSecond"] == got.decode_tps
