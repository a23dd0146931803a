"""The tuner against real torch and a real GPU (run by scripts/gpu-check.sh; marked gpu).

Runs with pytest (`pytest --noconftest -m gpu tests/gpu`) or, where pytest is not installed,
as a script (`python3 tests/gpu/test_tunableop.py`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from tuner_job.manifest import loads  # noqa: E402
from tuner_job.results import count_outcomes, read_results, read_untuned  # noqa: E402

try:
    import pytest

    pytestmark = pytest.mark.gpu
except ImportError:  # script mode on a GPU machine without pytest
    pytest = None  # type: ignore[assignment]

SHAPES = [
    {"m": 512, "n": 1024, "k": 256, "dtype": "bfloat16", "transB": True},
    {"m": 128, "n": 64, "k": 64, "batch": 4, "dtype": "float16"},
    {"m": 64, "n": 64, "k": 64, "dtype": "float32"},
]
TUNING = {"maxDurationMs": 5, "maxIterations": 5, "rotatingBufferMB": 0, "budgetSeconds": 120}
# The tuner's config.json, but for the workload (each run's own shapes) and the tuning.
CONFIG = {
    "namespace": "gpu-test",
    "profile": "shapes",
    "gpuModel": "GPU-TEST",
    "revision": "gputest",
}
_RUN: dict[str, Any] = {}
_SCRIPT = False  # set when run without pytest's runner


class _Skip(Exception):
    pass


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        _skip("torch is not installed")
    if not torch.cuda.is_available():
        _skip("no ROCm or CUDA GPU")
    return torch


def _skip(why: str) -> Any:
    if pytest is not None and not _SCRIPT:
        pytest.skip(why)
    raise _Skip(why)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTORCH_TUNABLEOP_")}
    ours = [str(REPO), str(REPO / "operator")]
    theirs = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ours]
    env["PYTHONPATH"] = os.pathsep.join([*ours, *theirs])  # appended to, not replaced
    env.update(extra)
    return env


def _run_tuner(work: Path, shapes: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    work.mkdir(parents=True, exist_ok=True)
    config = {**CONFIG, "workload": {"shapes": shapes}, "tuning": TUNING}
    (work / "config.json").write_text(json.dumps(config))
    return subprocess.run(
        [
            *(sys.executable, "-m", "tuner_job", "--termination-log", str(work / "tl")),
            *("run", "--config", str(work / "config.json"), "--out", str(work / "out")),
            *("--work", str(work / "w")),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _recorded(work: Path) -> set[tuple[str, str]]:
    # Each run records into a fresh record-* directory under --work.
    return {
        r.key
        for p in (work / "w").glob("record-*/shapes_untuned*.csv")
        for r in read_untuned(p).rows
    }


def _tuner_run() -> dict[str, Any]:
    """One real `tuner_job run` on the profile shapes, shared by the tests."""
    if not _RUN:
        work = Path(tempfile.mkdtemp(prefix="tunefleet-gputest-"))
        _RUN.update(work=work, done=_run_tuner(work, SHAPES))
    return _RUN


def test_tuner_records_and_tunes_real_gemms() -> None:
    torch = _torch()
    run = _tuner_run()
    done, work = run["done"], run["work"]
    assert done.returncode == 0, done.stderr
    recorded = _recorded(work)  # torch's own rows parse
    assert recorded, "torch wrote no untuned file in record mode"
    assert len(recorded) == len(SHAPES)
    families = {op.split("TunableOp_")[0] for op, _ in recorded}
    assert {"Gemm", "GemmStridedBatched"} <= families

    results = read_results(work / "out" / "results.csv", require_rows=True)
    assert results.keys() <= recorded and results.gemms >= 1
    assert results.validators == {str(k): str(v) for k, v in torch.cuda.tunable.get_validators()}
    manifest = loads((work / "out" / "manifest.json").read_bytes())
    assert (manifest.gemms, manifest.recorded) == (results.gemms, len(recorded))
    assert manifest.identity["gpuName"] == torch.cuda.get_device_name(0)
    assert manifest.outcomes == count_outcomes(results)
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if not torch.version.hip and (major, minor) < (2, 14):
        # CUDA builds before 2.14 have no candidate but Default (2.14+: cuBLASLt's too)
        assert manifest.outcomes is not None and manifest.outcomes.tuned == 0


LOAD_BACK = """
import json, torch
dev = "cuda"
torch.mm(torch.rand(512, 256, dtype=torch.bfloat16, device=dev),
         torch.rand(1024, 256, dtype=torch.bfloat16, device=dev).t())
torch.bmm(torch.rand(4, 128, 64, dtype=torch.float16, device=dev),
          torch.rand(4, 64, 64, dtype=torch.float16, device=dev))
torch.mm(torch.rand(64, 64, device=dev), torch.rand(64, 64, device=dev))
torch.cuda.synchronize()
t = torch.cuda.tunable
print(json.dumps({"results": [list(r[:3]) for r in t.get_results()], "tuning": t.tuning_is_enabled()}))
"""


def test_tuned_results_load_back_into_tunableop() -> None:
    _torch()
    run = _tuner_run()
    assert run["done"].returncode == 0, run["done"].stderr
    results = read_results(run["work"] / "out" / "results.csv")
    serve = run["work"] / "serve"
    serve.mkdir(exist_ok=True)
    shutil.copy(run["work"] / "out" / "results.csv", serve / "tunableop_results0.csv")
    done = subprocess.run(
        [sys.executable, "-c", LOAD_BACK],
        env=_env(
            PYTORCH_TUNABLEOP_ENABLED="1",
            PYTORCH_TUNABLEOP_TUNING="0",
            PYTORCH_TUNABLEOP_FILENAME=str(serve / "tunableop_results%d.csv"),
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded["tuning"] is False
    # Every row of our (canonically rewritten) file was accepted under torch's validators.
    assert {(op, p, s) for op, p, s in loaded["results"]} == {
        (r.op, r.params, r.solution) for r in results.rows
    }


# nn.Linear's GEMM (addmm with a 1-D bias: GemmAndBias) and a float32 GEMM with TF32 allowed
# (typed tf32): the rows a serving process looks up only if they were recorded the same way.
SERVED_SHAPES = [
    {"m": 512, "n": 1024, "k": 256, "dtype": "bfloat16", "transB": True, "bias": True},
    {"m": 64, "n": 128, "k": 64, "dtype": "float32", "tf32": True},
]
SERVE = """
import torch
dev = "cuda"
x = torch.rand(512, 256, dtype=torch.bfloat16, device=dev)
linear = torch.nn.Linear(256, 1024, device=dev, dtype=torch.bfloat16)
with torch.no_grad():
    linear(x)
torch.backends.cuda.matmul.allow_tf32 = True
torch.mm(torch.rand(64, 64, device=dev), torch.rand(64, 128, device=dev))
torch.cuda.synchronize()
"""


def test_bias_and_tf32_rows_are_the_ones_serving_looks_up() -> None:
    torch = _torch()
    work = Path(tempfile.mkdtemp(prefix="tunefleet-gputest-served-"))
    done = _run_tuner(work, SERVED_SHAPES)
    assert done.returncode == 0, done.stderr
    recorded = _recorded(work)
    families = sorted(op.split("TunableOp_")[0] + "/" + op.split("_")[1] for op, _ in recorded)
    assert families == ["Gemm/tf32", "GemmAndBias/BFloat16"], families
    tuned = read_results(work / "out" / "results.csv", require_rows=True).keys()
    assert tuned == recorded
    serve = work / "serve"
    serve.mkdir()
    shutil.copy(work / "out" / "results.csv", serve / "tunableop_results0.csv")
    log = serve / "tunableop-verbose.log"
    served = subprocess.run(
        [sys.executable, "-c", SERVE],
        env=_env(
            PYTORCH_TUNABLEOP_ENABLED="1",
            PYTORCH_TUNABLEOP_TUNING="0",
            PYTORCH_TUNABLEOP_FILENAME=str(serve / "tunableop_results%d.csv"),
            # level 3 logs every lookup: "ResultEntry found for OP,PARAMS" or
            # "missing ..._signature, returning null ResultEntry for OP,PARAMS" (Tunable.cpp)
            PYTORCH_TUNABLEOP_VERBOSE="3",
            PYTORCH_TUNABLEOP_VERBOSE_FILENAME=str(log),
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert served.returncode == 0, served.stderr
    text = log.read_text() if log.exists() else ""
    missed = [ln for ln in text.splitlines() if "returning null ResultEntry for" in ln]
    found = {ln.split("ResultEntry found for ", 1)[1].strip() for ln in text.splitlines()
             if "ResultEntry found for " in ln}  # fmt: skip
    assert not missed, missed
    assert found == {f"{op},{params}" for op, params in tuned}, (found, torch.__version__)


def test_float8_on_cuda_is_refused_before_recording() -> None:
    torch = _torch()
    if torch.version.hip:
        _skip("ROCm routes torch._scaled_mm through TunableOp")
    work = Path(tempfile.mkdtemp(prefix="tunefleet-gputest-fp8-"))
    shape = {"m": 64, "n": 128, "k": 64, "dtype": "float8_e4m3fn", "transB": True}
    done = _run_tuner(work, [shape])
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) >= (2, 14):  # CUDA's _scaled_mm goes through TunableOp from 2.14
        assert done.returncode == 0, done.stderr
        assert any(op.startswith("ScaledGemmTunableOp_") for op, _ in _recorded(work))
        return
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "workload.shapes[0]" in line and "float8_e4m3fn" in line, line
    assert not (work / "w").exists() or not list((work / "w").glob("record-*"))


def test_identify_describes_this_machine() -> None:
    torch = _torch()
    done = subprocess.run(
        [sys.executable, "-m", "tuner_job", "identify"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    identity = doc["identity"]
    assert identity["gpuName"] == torch.cuda.get_device_name(0)
    assert identity["gpuCount"] == str(torch.cuda.device_count())
    assert identity["torch"] == torch.__version__
    assert ("hip" in identity) == bool(torch.version.hip)
    assert doc["validators"]["PT_VERSION"]


if __name__ == "__main__":
    _SCRIPT = True
    failed = 0
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"PASS {name}")
            except _Skip as exc:
                print(f"SKIP {name}: {exc}")
            except Exception as exc:
                failed += 1
                print(f"FAIL {name}: {type(exc).__name__}: {exc}")
    sys.exit(1 if failed else 0)
