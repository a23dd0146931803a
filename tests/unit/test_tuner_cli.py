"""python -m tuner_job end to end on CPU: no-GPU errors, config errors, and `run` with a stub torch.

The stub (tests/unit/data/fake_torch) stands in for torch so the tuner's own logic runs; what it
"tunes" is made up. The real path is exercised by scripts/gpu-check.sh on a GPU machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.tuner import write_config
from tests.support.tuner import FAKE_TORCH, REPO, tuner
from tuner_job.files import sha256_hex
from tuner_job.manifest import loads
from tuner_job.results import Outcomes, count_outcomes, read_results, read_untuned

STANDIN = "[stand-in torch]"


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert lines, "no error printed"
    return lines[-1]


def own_stderr(done: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr without the stand-in torch's own lines (each of which says what it is)."""
    return [ln for ln in done.stderr.strip().splitlines() if not ln.startswith(STANDIN)]


def test_help_works_without_torch(tmp_path: Path) -> None:
    done = tuner(tmp_path, "--help", fake=None)
    assert done.returncode == 0 and "record" in done.stdout and "identify" in done.stdout


@pytest.mark.parametrize(
    ("fake", "expected"),
    [
        (
            "no-device",
            "tuner_job: error: TunableOp needs a ROCm or CUDA GPU: torch 2.11.0+standin reports "
            "no GPU device (torch.cuda.is_available() is False)",
        ),
        (
            "cpu-build",
            "tuner_job: error: TunableOp needs a ROCm or CUDA GPU: torch 2.11.0+cpu.standin is a "
            "CPU-only build (torch.version.cuda and torch.version.hip are both None)",
        ),
        (
            "broken",
            "tuner_job: error: torch is not importable in this image (ImportError: [stand-in torch] "
            "libcudart.so.13: cannot open shared object file: No such file or directory)",
        ),
    ],
)
@pytest.mark.parametrize("command", ["run", "identify"])
def test_without_a_gpu_it_says_so_in_one_line_and_fails(
    tmp_path: Path, fake: str, expected: str, command: str
) -> None:
    args = (
        [command]
        if command == "identify"
        else ["run", "--config", str(write_config(tmp_path)), "--out", "out"]
    )
    done = tuner(tmp_path, *args, fake=fake)
    assert done.returncode == 3
    assert own_stderr(done) == [expected]  # exactly one line of the tuner's own
    assert error_line(done) == expected  # and it is the last
    assert (tmp_path / "termination-log").read_text() == expected + "\n"
    assert not (tmp_path / "out").exists()  # never invented results


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_without_torch_at_all(tmp_path: Path) -> None:
    done = tuner(
        tmp_path, "run", "--config", str(write_config(tmp_path)), "--out", "out", fake=None
    )
    assert done.returncode == 3
    assert error_line(done).startswith("tuner_job: error: torch is not importable in this image")


def test_more_gpus_than_present_is_refused(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, gpus=4)
    done = tuner(
        tmp_path, "run", "--config", str(cfg), "--out", "out", env={"FAKE_TORCH_GPUS": "2"}
    )
    assert done.returncode == 3
    assert "asks for 4 GPUs but torch 2.11.0+standin sees 2" in error_line(done)


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ("{", "is not JSON"),
        (json.dumps({"namespace": "ml"}), "lacks profile, gpuModel, revision"),
        (
            json.dumps({"namespace": "a", "profile": "b", "gpuModel": "c", "revision": "d"}),
            "neither workload.command nor workload.shapes",
        ),
        (json.dumps({"workload": {"shapes": [{"m": 1, "n": 1, "k": 0}]}}), "shapes[0].k"),
        (
            json.dumps({"workload": {"shapes": [{"m": 1, "n": 1, "k": 1, "dtype": "int8"}]}}),
            "dtype",
        ),
        (json.dumps({"gpus": True}), "config.gpus"),
        (json.dumps({"tuning": {"budgetSeconds": 0}}), "budgetSeconds"),
        (json.dumps({"workload": {"command": "python serve.py"}}), "workload.command"),
    ],
)
def test_bad_configs_exit_2_with_the_reason(tmp_path: Path, doc: str, fragment: str) -> None:
    (tmp_path / "c.json").write_text(doc)
    done = tuner(tmp_path, "run", "--config", "c.json", "--out", "out")
    assert done.returncode == 2, done.stderr
    assert fragment in error_line(done)


def test_config_comes_from_the_environment_variable(tmp_path: Path) -> None:
    done = tuner(tmp_path, "run", "--out", "out")
    assert done.returncode == 2 and "TUNEFLEET_TUNING_CONFIG" in error_line(done)
    cfg = write_config(tmp_path).read_text()
    done = tuner(tmp_path, "run", "--out", "out", env={"TUNEFLEET_TUNING_CONFIG": cfg})
    assert done.returncode == 0, done.stderr


WORKLOAD = """
import os, subprocess, sys
import torch
if len(sys.argv) > 1:  # one process per device, as torchrun would start
    torch.cuda.set_device(int(sys.argv[1]))
    a = torch.rand(128, 64, dtype=torch.bfloat16, device="cuda")
    b = torch.rand(64, 32, dtype=torch.bfloat16, device="cuda")
    torch.mm(a, b)
    torch.mm(a, b)  # torch records a GEMM once per process
    if sys.argv[1] == "1":
        torch.mm(b.t(), a.t())
    # on the CPU: no TunableOp, nothing recorded
    torch.mm(torch.rand(32, 16, dtype=torch.bfloat16), torch.rand(16, 8, dtype=torch.bfloat16))
    sys.exit(0)
for rank in ("0", "1"):
    subprocess.run([sys.executable, __file__, rank], check=True)
assert os.environ["PYTORCH_TUNABLEOP_RECORD_UNTUNED"] == "1"
assert os.environ["SERVE_SETTING"] == "kept"  # the container's own env reaches the workload
"""


def record_dirs(work: Path) -> list[Path]:
    return sorted(p for p in work.iterdir() if p.name.startswith("record-"))


def test_run_records_workload_and_shapes_tunes_and_writes_the_artifact(tmp_path: Path) -> None:
    (tmp_path / "serve.py").write_text(WORKLOAD)
    cfg = write_config(tmp_path)
    doc = json.loads(cfg.read_text())
    doc["workload"]["command"] = [sys.executable, str(tmp_path / "serve.py")]
    cfg.write_text(json.dumps(doc))
    done = tuner(
        tmp_path,
        "run",
        "--config",
        str(cfg),
        "--out",
        "out",
        "--work",
        "work",
        env={"SERVE_SETTING": "kept", "FAKE_TORCH_GPUS": "2"},
    )
    assert done.returncode == 0, done.stderr

    (record,) = record_dirs(tmp_path / "work")
    untuned = sorted(record.glob("*_untuned*.csv"))
    assert [p.name for p in untuned] == [
        "shapes_untuned0.csv",
        "workload_untuned0.csv",
        "workload_untuned1.csv",
    ]
    keys = [r.key for p in untuned for r in read_untuned(p).rows]
    unique = set(keys)
    assert len(keys) > len(unique)  # the per-device files overlap; tuning sees each GEMM once
    assert len(unique) == 4  # 2 from the workload (the CPU matmul is not one), 2 shapes

    data = (tmp_path / "out" / "results.csv").read_bytes()
    results = read_results(tmp_path / "out" / "results.csv")
    assert results.keys() == unique
    manifest = loads((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest.results_sha256 == sha256_hex(data)
    assert (manifest.gemms, manifest.recorded) == (len(unique), len(unique))
    assert manifest.validators == results.validators == {"PT_VERSION": "2.11.0+standin"}
    # On CUDA, torch 2.11 has no candidate but Default: nothing was tuned, and it says so.
    assert manifest.outcomes == Outcomes(tuned=0, default=len(unique))
    assert {r.solution for r in results.rows} == {"Default"}
    assert (manifest.namespace, manifest.profile, manifest.gpu_model, manifest.revision) == (
        "ml",
        "llama",
        "NVIDIA-H200",
        "3f2a9c01de",
    )
    assert manifest.identity["gpuName"] == "Stand-in GPU (tunefleet test image: computes nothing)"
    assert manifest.identity["gpuCount"] == "2" and manifest.identity["arch"] == "sm_90"
    assert re.search(r"tuning loop: \d+\.\d\ds of the tuning process's \d+\.\d\ds", done.stderr)
    assert done.stdout.strip().endswith("out/manifest.json")
    assert sha256_hex(data) in done.stdout


# A stack that writes its compile cache where the variable says (as Inductor does), within the
# same workload run that TunableOp records.
CACHING_WORKLOAD = WORKLOAD.replace(
    "for rank in",
    "open(os.path.join(os.environ['TORCHINDUCTOR_CACHE_DIR'], 'graph'), 'w').write('g')\n"
    "for rank in",
)


def test_run_packs_the_caches_its_workload_filled_beside_the_results(tmp_path: Path) -> None:
    (tmp_path / "serve.py").write_text(CACHING_WORKLOAD)
    cfg = write_config(tmp_path)
    doc = json.loads(cfg.read_text())
    doc["workload"]["command"] = [sys.executable, str(tmp_path / "serve.py")]
    doc["artifacts"] = {"caches": [{"kind": "torchCompile"}, {"kind": "vllm"}]}
    cfg.write_text(json.dumps(doc))
    done = tuner(
        tmp_path, "run", "--config", str(cfg), "--out", "out",
        env={"SERVE_SETTING": "kept", "FAKE_TORCH_GPUS": "2"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    manifest = loads((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest.kind == "tunableop" and manifest.gemms > 0
    (cache,) = manifest.caches
    assert (cache.name, cache.files) == ("torchcompile", 1)
    assert sha256_hex((tmp_path / "out" / cache.payload).read_bytes()) == cache.sha256
    (skipped,) = manifest.caches_skipped
    assert skipped.name == "vllm" and "VLLM_CACHE_ROOT" in skipped.reason
    assert "cache vllm (vllm) not served: empty" in done.stderr


def test_run_on_a_rocm_build_records_its_identity_and_outcomes(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path,
        workload={
            "shapes": [
                {"m": 64 * i, "n": 128, "k": 64, "dtype": "bfloat16", "transB": True}
                for i in range(1, 9)
            ]
            + [{"m": 64, "n": 128, "k": 64, "dtype": "float8_e4m3fnuz", "transB": True}]
        },
    )
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out", "--work", "work",
                 env={"FAKE_TORCH_BACKEND": "rocm"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    manifest = loads((tmp_path / "out" / "manifest.json").read_bytes())
    results = read_results(tmp_path / "out" / "results.csv")
    assert manifest.outcomes is not None and manifest.outcomes.gemms == manifest.gemms == 9
    assert manifest.outcomes == count_outcomes(results)
    (record,) = record_dirs(tmp_path / "work")
    recorded = {r.key for p in record.glob("*_untuned*.csv") for r in read_untuned(p).rows}
    assert results.keys() == recorded  # the offline tuner tuned exactly the recorded keys
    assert manifest.outcomes.tuned > 0 and manifest.outcomes.default > 0  # this stub mixes both
    assert "ScaledGemmTunableOp_Float8_e4m3fnuz_Float8_e4m3fnuz_BFloat16_TN" in {
        r.op for r in results.rows
    }
    assert {"HIP_VERSION", "GCN_ARCH_NAME", "PT_VERSION"} <= set(manifest.validators)
    assert "ROCM_VERSION" not in manifest.validators  # recent torch validates HIP_VERSION
    assert manifest.identity["hipVersion"] == manifest.validators["HIP_VERSION"]
    assert manifest.identity["arch"] == "gfx942:sramecc+:xnack-"


def test_a_reused_work_directory_records_afresh(tmp_path: Path) -> None:
    # torch appends to an existing untuned file: a second run into the same file would bring
    # back the first run's GEMMs. Each run records into a directory of its own.
    first = write_config(tmp_path, workload={"shapes": [{"m": 64, "n": 32, "k": 16}]})
    done = tuner(tmp_path, "record", "--config", str(first), "--work", "w")
    assert done.returncode == 0, done.stderr
    second = write_config(tmp_path, workload={"shapes": [{"m": 256, "n": 128, "k": 64}]})
    done = tuner(tmp_path, "record", "--config", str(second), "--work", "w")
    assert done.returncode == 0, done.stderr
    assert "recorded 1 unique GEMM(s)" in done.stdout
    older, newer = sorted(record_dirs(tmp_path / "w"), key=lambda p: p.stat().st_mtime_ns)
    assert done.stdout.strip().endswith(f"into {Path('w') / newer.name}")
    (row,) = read_untuned(newer / "shapes_untuned0.csv").rows
    assert row.params == "nn_128_256_64_ld_128_64_128"
    assert len(read_untuned(older / "shapes_untuned0.csv").rows) == 1


def test_the_workload_command_can_come_after_a_double_dash(tmp_path: Path) -> None:
    # The operator's Job passes the user's command as the tune container's argv:
    # `tuner_job run --config FILE --out DIR -- COMMAND ARG...`, verbatim.
    (tmp_path / "serve.py").write_text(WORKLOAD)
    cfg = write_config(tmp_path, workload={})
    argv = ["--", sys.executable, str(tmp_path / "serve.py")]
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out", *argv,
                 env={"SERVE_SETTING": "kept", "FAKE_TORCH_GPUS": "2"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert loads((tmp_path / "out" / "manifest.json").read_bytes()).gemms == 2
    twice = write_config(tmp_path, workload={"command": [sys.executable, "-c", "pass"]})
    done = tuner(tmp_path, "run", "--config", str(twice), "--out", "out2", *argv)
    assert done.returncode == 2 and "workload command is given twice" in error_line(done)


def test_a_failing_workload_fails_the_run(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path, workload={"command": [sys.executable, "-c", "raise SystemExit(7)"]}
    )
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out")
    assert done.returncode == 1
    assert "workload command exited with status 7" in error_line(done)
    assert not (tmp_path / "out").exists()


def test_a_workload_without_gemms_is_an_error_not_an_empty_artifact(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, workload={"command": [sys.executable, "-c", "pass"]})
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out")
    assert done.returncode == 1
    assert "recording found no GEMMs" in error_line(done)


def test_record_writes_what_torch_writes_column_major(tmp_path: Path) -> None:
    # torch.mm(A, B.t()) on row-major tensors is cuBLAS's C^T = B^T A^T: layout TN, and the
    # product's n (512) before its m (256).
    done = tuner(tmp_path, "record", "--config", str(write_config(tmp_path)), "--work", "w")
    assert done.returncode == 0, done.stderr
    (record,) = record_dirs(tmp_path / "w")
    rows = read_untuned(record / "shapes_untuned0.csv").rows
    assert [(r.op, r.params) for r in rows] == [
        ("GemmTunableOp_BFloat16_TN", "tn_512_256_128_ld_128_128_512"),
        ("GemmStridedBatchedTunableOp_Half_NN", "nn_64_64_32_B_8_ld_64_32_64"),
    ]  # the third shape repeats the first: torch writes a GEMM once per process
    assert "recorded 2 unique GEMM(s)" in done.stdout


SHAPE = {"m": 256, "n": 512, "k": 128, "transB": True}


def test_bias_and_tf32_shapes_record_the_rows_serving_looks_up_and_tune(tmp_path: Path) -> None:
    shapes = [
        {**SHAPE, "dtype": "bfloat16", "bias": True},
        {**SHAPE, "dtype": "float32", "tf32": True},
        {**SHAPE, "dtype": "float32"},
        {**SHAPE, "dtype": "float16", "transA": True, "transB": False, "bias": True},
    ]
    cfg = write_config(tmp_path, workload={"shapes": shapes})
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out", "--work", "w")
    assert done.returncode == 0, done.stderr
    (record,) = record_dirs(tmp_path / "w")
    rows = [(r.op, r.params) for r in read_untuned(record / "shapes_untuned0.csv").rows]
    assert rows == [
        ("GemmAndBiasTunableOp_BFloat16_TN", "tn_512_256_128_ld_128_128_512"),
        ("GemmTunableOp_tf32_TN", "tn_512_256_128_ld_128_128_512"),
        ("GemmTunableOp_float_TN", "tn_512_256_128_ld_128_128_512"),
        ("GemmAndBiasTunableOp_Half_NT", "nt_512_256_128_ld_512_256_512"),
    ]
    # torch's offline tuner rebuilds each of them and tunes exactly that key
    assert read_results(tmp_path / "out" / "results.csv").keys() == set(rows)


def config_error(tmp_path: Path, shape: dict[str, Any], **env: str) -> tuple[int, str]:
    marker = tmp_path / "workload-ran"
    cfg = write_config(
        tmp_path,
        workload={
            "command": [sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
            "shapes": [{"m": 64, "n": 64, "k": 64}, shape],
        },
    )
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out", "--work", "w", env=env)
    assert not marker.exists(), "refused after the workload had run"
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "w").exists() or not record_dirs(tmp_path / "w")
    return done.returncode, error_line(done)


FP8 = {"m": 64, "n": 128, "k": 64, "transB": True}


@pytest.mark.parametrize(
    ("shape", "env", "fragments"),
    [
        pytest.param(
            {**FP8, "dtype": "float8_e4m3fn"},
            {},
            ["workload.shapes[1]", "float8_e4m3fn", "without TunableOp", "on CUDA"],
            id="fp8-on-cuda",
        ),
        pytest.param(
            {**FP8, "dtype": "float8_e5m2"},
            {},
            ["float8_e5m2", "e5m2 x e5m2", "use float8_e4m3fn"],
            id="e5m2-on-cuda",
        ),
        pytest.param(
            {**FP8, "dtype": "float8_e4m3fnuz"},
            {},
            ["float8_e4m3fnuz", "ROCm-only"],
            id="fnuz-on-cuda",
        ),
        pytest.param(
            {**SHAPE, "bias": True},
            {"DISABLE_ADDMM_CUDA_LT": "1"},
            ["bias", "DISABLE_ADDMM_CUDA_LT=1"],
            id="bias-with-lt-disabled",
        ),
        pytest.param(
            {**SHAPE, "dtype": "float64", "bias": True},
            {"FAKE_TORCH_BACKEND": "rocm"},
            ["float64", "on ROCm", "drop bias"],
            id="float64-bias-on-rocm",
        ),
    ],
)
def test_shapes_this_torch_cannot_tune_are_refused_before_recording(
    tmp_path: Path, shape: dict[str, Any], env: dict[str, str], fragments: list[str]
) -> None:
    code, line = config_error(tmp_path, shape, **env)
    assert code == 2, line
    assert line.startswith("tuner_job: error: workload.shapes[1] (m=")
    for fragment in fragments:
        assert fragment in line


@pytest.mark.parametrize(
    ("shape", "fragment"),
    [
        ({**SHAPE, "dtype": "bfloat16", "tf32": True}, "tf32 applies to float32 GEMMs only"),
        ({**SHAPE, "batch": 4, "bias": True}, "bias needs batch 1"),
        ({**SHAPE, "transB": False, "bias": True}, "exactly one of transA/transB"),
        ({**SHAPE, "transA": True, "bias": True}, "exactly one of transA/transB"),
        ({**SHAPE, "m": 1, "bias": True}, "m, n and k > 1"),
        ({**FP8, "dtype": "float8_e4m3fn", "k": 72}, "divisible by 16"),
        ({**SHAPE, "bias": "yes"}, "bias must be bool"),
    ],
)
def test_shapes_no_torch_routes_through_tunableop_are_bad_configs(
    tmp_path: Path, shape: dict[str, Any], fragment: str
) -> None:
    code, line = config_error(tmp_path, shape)
    assert code == 2 and fragment in line, line


def test_float8_on_rocm_records_a_scaled_gemm(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path, workload={"shapes": [{**FP8, "dtype": "float8_e4m3fn", "bias": True}]}
    )
    done = tuner(tmp_path, "record", "--config", str(cfg), "--work", "w",
                 env={"FAKE_TORCH_BACKEND": "rocm"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    (record,) = record_dirs(tmp_path / "w")
    (row,) = read_untuned(record / "shapes_untuned0.csv").rows
    assert row.op == "ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN"
    assert row.params == "tn_128_64_64_ld_64_64_128_rw_0_bias_BFloat16"


def test_identify_prints_identity_and_validators(tmp_path: Path) -> None:
    done = tuner(tmp_path, "identify")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["validators"] == {"PT_VERSION": "2.11.0+standin"}
    assert all(isinstance(v, str) for v in doc["identity"].values())
    assert {"gpuName", "arch", "gpuCount", "driver", "torch", "cuda"} <= set(doc["identity"])


def _calls(tmp: Path) -> list[dict[str, Any]]:
    log = tmp / "torch-calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


LINGER = """
import os, subprocess, sys, time, torch
# A server that leaves a worker behind (a data loader, a model shard): it would hold GPU memory.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(str(child.pid))
torch.mm(torch.rand(64, 64, device="cuda"), torch.rand(64, 64, device="cuda"))
"""


def test_what_the_workload_leaves_running_is_ended_after_recording(tmp_path: Path) -> None:
    """Defect: the workload's process group was not ended after a normal exit, so its children
    could hold GPU memory while tuning ran."""
    (tmp_path / "serve.py").write_text(LINGER)
    pid_file = tmp_path / "child.pid"
    cfg = write_config(tmp_path, workload={"command": [sys.executable, "serve.py", str(pid_file)]})
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out")
    assert done.returncode == 0, done.stderr
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "ended the processes the workload left running" in done.stderr


def test_the_tuners_own_process_never_imports_torch_or_makes_a_cuda_context(
    tmp_path: Path,
) -> None:
    """Defect: the tuner's process recorded the shapes and read the identity itself, keeping a
    CUDA context on GPU 0 while its child tuned."""
    cfg = write_config(tmp_path, gpus=2)
    done = tuner(
        tmp_path, "run", "--config", str(cfg), "--out", "out", env={"FAKE_TORCH_GPUS": "2"}
    )
    assert done.returncode == 0, done.stderr
    calls = _calls(tmp_path)
    imports = {c["pid"]: c["argv"] for c in calls if c["event"] == "import"}
    roles = sorted(next(a for a in argv if a.startswith("_")) for argv in imports.values())
    assert roles == ["_probe", "_tune-worker", "_tune-worker"], imports
    contexts = {c["pid"] for c in calls if c["event"] == "cuda_context"}
    probe_pid = next(p for p, argv in imports.items() if "_probe" in argv)
    first_tune = min(i for i, c in enumerate(calls) if c["event"] == "tune_gemm_in_file")
    # The probe (which ran the shapes) has exited before any GEMM is tuned.
    assert all(c["pid"] != probe_pid for c in calls[first_tune:])
    assert contexts <= set(imports)


def test_the_images_pythonpath_reaches_the_workload_and_a_users_cannot_hide_the_tuner(
    tmp_path: Path,
) -> None:
    """Run by path, as the Job runs it: a PYTHONPATH with another `tuner_job` first is the
    image's business, and neither it nor the tuner's children lose it."""
    shadow = tmp_path / "shadow" / "tuner_job"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ImportError('the user image has its own tuner_job')\n"
    )
    (tmp_path / "serve.py").write_text(
        "import os, sys, torch\n"
        "open(sys.argv[1], 'w').write(os.environ['PYTHONPATH'])\n"
        "torch.mm(torch.rand(8, 8, device='cuda'), torch.rand(8, 8, device='cuda'))\n"
    )
    seen = tmp_path / "pythonpath"
    cfg = write_config(tmp_path, workload={"command": [sys.executable, "serve.py", str(seen)]})
    pythonpath = os.pathsep.join([str(tmp_path / "shadow"), str(FAKE_TORCH)])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "TUNEFLEET_"))}
    env.update(PYTHONPATH=pythonpath, FAKE_TORCH_LOG=str(tmp_path / "torch-calls.jsonl"))
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "tuner_job"),
            "--termination-log",
            str(tmp_path / "tl"),
            "run",
            "--config",
            str(cfg),
            "--out",
            "out",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert seen.read_text() == pythonpath  # the image's PYTHONPATH, untouched


def test_captured_untuned_files_are_tuned_with_what_the_workload_records(tmp_path: Path) -> None:
    """A retune's production misses (workload.untunedFiles): tuned beside the recorded GEMMs,
    once each; a row torch's offline tuner could not rebuild is left out with why."""
    recorded = "GemmTunableOp_BFloat16_TN,tn_512_256_128_ld_128_128_512"  # shapes[0], as recorded
    captured = tmp_path / "captured.csv"
    captured.write_text(
        f"{recorded}\n"
        "GemmTunableOp_BFloat16_TN,tn_96_4096_512_ld_512_512_96\n"
        "GemmTunableOp_Half_TN,tn_48_2048_1024_ld_1024_1024_48\n"
        "NotAGemm,whatever\n"
    )
    cfg = write_config(tmp_path)
    doc = json.loads(cfg.read_text())
    doc["workload"]["untunedFiles"] = [str(captured)]
    cfg.write_text(json.dumps(doc))
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out", "--work", "work")
    assert done.returncode == 0, done.stderr
    keys = {f"{r.op},{r.params}" for r in read_results(tmp_path / "out" / "results.csv").rows}
    assert {
        "GemmTunableOp_BFloat16_TN,tn_96_4096_512_ld_512_512_96",
        "GemmTunableOp_Half_TN,tn_48_2048_1024_ld_1024_1024_48",
        recorded,
    } <= keys
    assert len(keys) == 4  # 2 shapes recorded + 2 captured ones new to them
    assert "2 captured GEMM(s) added to the 2 recorded (of 3 captured)" in done.stderr
    assert "not tuning captured" in done.stderr  # the bad row, said and left out
    manifest = loads((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest.recorded == 4


def test_a_missing_captured_file_is_a_clear_error(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    doc = json.loads(cfg.read_text())
    doc["workload"]["untunedFiles"] = [str(tmp_path / "absent.csv")]
    cfg.write_text(json.dumps(doc))
    done = tuner(tmp_path, "run", "--config", str(cfg), "--out", "out")
    assert done.returncode != 0
    assert "cannot read the captured GEMMs" in error_line(done)
