"""python -m tuner_job end to end on CPU: no-GPU errors, config errors, and `run` with a stub torch.

The stub (tests/unit/data/fake_torch) stands in for torch so the tuner's own logic runs; what it
"tunes" is made up. The real path is exercised by scripts/gpu-check.sh on a GPU machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner_job._fs import sha256_hex
from tuner_job.manifest import loads
from tuner_job.results import read_results, read_untuned

FAKE_TORCH = Path(__file__).parent / "data" / "fake_torch"
REPO = Path(__file__).resolve().parents[2]


def tuner(
    tmp: Path, *args: str, fake: str | None = "gpu", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "TUNEFLEET_"))}
    paths = [str(REPO)]
    if fake is not None:
        paths.insert(0, str(FAKE_TORCH))
        full["FAKE_TORCH_MODE"] = fake
    full["PYTHONPATH"] = os.pathsep.join(paths)
    full["FAKE_TORCH_LOG"] = str(tmp / "torch-calls.jsonl")
    full.update(env or {})
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner_job",
            "--termination-log",
            str(tmp / "termination-log"),
            *args,
        ],
        env=full,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )


def write_config(tmp: Path, **over: Any) -> Path:
    doc: dict[str, Any] = {
        "namespace": "ml",
        "profile": "llama",
        "gpuModel": "NVIDIA-H200",
        "revision": "3f2a9c01de",
        "gpus": 1,
        "workload": {
            "shapes": [
                {"m": 256, "n": 512, "k": 128, "dtype": "bfloat16", "transB": True},
                {"m": 64, "n": 64, "k": 32, "batch": 8, "dtype": "float16"},
                {"m": 256, "n": 512, "k": 128, "dtype": "bfloat16", "transB": True},
            ]
        },
        "tuning": {"maxDurationMs": 7, "maxIterations": 11, "budgetSeconds": 60},
    }
    doc.update(over)
    path = tmp / "config.json"
    path.write_text(json.dumps(doc))
    return path


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert lines, "no error printed"
    return lines[-1]


def test_help_works_without_torch(tmp_path: Path) -> None:
    done = tuner(tmp_path, "--help", fake=None)
    assert done.returncode == 0 and "record" in done.stdout and "identify" in done.stdout


@pytest.mark.parametrize(
    ("fake", "expected"),
    [
        (
            "no-device",
            "tuner_job: error: TunableOp needs a ROCm or CUDA GPU: torch 2.11.0+fake reports no "
            "GPU device (torch.cuda.is_available() is False)",
        ),
        (
            "cpu-build",
            "tuner_job: error: TunableOp needs a ROCm or CUDA GPU: torch 2.11.0+cpu is a CPU-only "
            "build (torch.version.cuda and torch.version.hip are both None)",
        ),
        (
            "broken",
            "tuner_job: error: torch is not importable in this image (ImportError: libcudart.so.13: "
            "cannot open shared object file: No such file or directory)",
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
    assert done.stderr.strip() == expected  # exactly one line, nothing else
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
    assert "asks for 4 GPUs but torch 2.11.0+fake sees 2" in error_line(done)


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
    torch.mm(a, b)
    if sys.argv[1] == "1":
        torch.mm(torch.rand(32, 16, dtype=torch.bfloat16), torch.rand(16, 8, dtype=torch.bfloat16))
    sys.exit(0)
for rank in ("0", "1"):
    subprocess.run([sys.executable, __file__, rank], check=True)
assert os.environ["PYTORCH_TUNABLEOP_RECORD_UNTUNED"] == "1"
assert os.environ["SERVE_SETTING"] == "kept"  # the container's own env reaches the workload
"""


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

    untuned = sorted((tmp_path / "work" / "record").glob("*_untuned*.csv"))
    assert [p.name for p in untuned] == [
        "shapes_untuned0.csv",
        "workload_untuned0.csv",
        "workload_untuned1.csv",
    ]
    keys = [r.key for p in untuned for r in read_untuned(p).rows]
    unique = set(keys)
    assert len(keys) > len(unique)  # the per-device files overlap; tuning sees each GEMM once

    data = (tmp_path / "out" / "results.csv").read_bytes()
    results = read_results(tmp_path / "out" / "results.csv")
    assert results.keys() == unique
    manifest = loads((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest.results_sha256 == sha256_hex(data)
    assert (manifest.gemms, manifest.recorded) == (len(unique), len(unique))
    assert manifest.validators == results.validators == {"PT_VERSION": "2.11.0+fake"}
    assert (manifest.namespace, manifest.profile, manifest.gpu_model, manifest.revision) == (
        "ml",
        "llama",
        "NVIDIA-H200",
        "3f2a9c01de",
    )
    assert manifest.identity["gpuName"] == "Fake GPU 80GB"
    assert manifest.identity["gpuCount"] == "2" and manifest.identity["arch"] == "sm_90"
    assert done.stdout.strip().endswith("out/manifest.json")
    assert sha256_hex(data) in done.stdout


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


def test_record_subcommand_writes_untuned_files(tmp_path: Path) -> None:
    done = tuner(tmp_path, "record", "--config", str(write_config(tmp_path)), "--work", "w")
    assert done.returncode == 0, done.stderr
    rows = read_untuned(tmp_path / "w" / "shapes_untuned0.csv").rows
    assert [r.op for r in rows] == [
        "GemmTunableOp_BFloat16_NT",
        "GemmStridedBatchedTunableOp_Half_NN",
        "GemmTunableOp_BFloat16_NT",
    ]
    assert "recorded 2 unique GEMM(s)" in done.stdout


def test_identify_prints_identity_and_validators(tmp_path: Path) -> None:
    done = tuner(tmp_path, "identify")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["validators"] == {"PT_VERSION": "2.11.0+fake"}
    assert all(isinstance(v, str) for v in doc["identity"].values())
    assert {"gpuName", "arch", "gpuCount", "driver", "torch", "cuda"} <= set(doc["identity"])
