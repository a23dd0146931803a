"""tuner_job runs in the user's image, which may have Python 3.10 (torch 2.11 supports it).

The rest of the project is 3.11+; these tests run tuner_job itself under a 3.10 interpreter
when one is found (on PATH or under ~/.pyenv/versions), so a 3.11-only construct fails here
before it fails in a tuning pod, ahead of any termination message.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKE_TORCH = Path(__file__).parent / "data" / "fake_torch"


def find_python310() -> str | None:
    candidates = [shutil.which("python3.10")]
    candidates += sorted(
        str(p) for p in (Path.home() / ".pyenv" / "versions").glob("3.10*/bin/python3.10")
    )
    for candidate in candidates:
        if not candidate:
            continue
        try:
            done = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip() == "(3, 10)":
            return candidate
    return None


PY310 = find_python310()
needs_310 = pytest.mark.skipif(
    PY310 is None, reason="no Python 3.10 interpreter (looked on PATH and in ~/.pyenv/versions)"
)


def run310(
    *args: str, cwd: Path, fake: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    assert PY310 is not None
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "TUNEFLEET_"))}
    paths = [str(FAKE_TORCH), str(REPO)] if fake else [str(REPO)]
    full.update(PYTHONPATH=os.pathsep.join(paths), PYTHONDONTWRITEBYTECODE="1", **(env or {}))
    return subprocess.run(
        [PY310, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=120
    )


@needs_310
def test_tuner_job_imports_on_python_310(tmp_path: Path) -> None:
    done = run310("-c", "import tuner_job.cli", cwd=tmp_path)
    assert done.returncode == 0, done.stderr


@needs_310
def test_help_runs_on_python_310(tmp_path: Path) -> None:
    done = run310("-m", "tuner_job", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "record" in done.stdout and "identify" in done.stdout


@needs_310
def test_a_whole_run_works_on_python_310(tmp_path: Path) -> None:
    # Everything the tuner does at run time (record, the tuning child, the manifest), with the
    # stand-in torch, which the stand-in image may also run on 3.10.
    config = {
        "namespace": "ml",
        "profile": "p",
        "gpuModel": "NVIDIA-H200",
        "revision": "r1",
        "workload": {"shapes": [{"m": 64, "n": 32, "k": 16, "bias": True, "transB": True}]},
        "tuning": {"budgetSeconds": 60},
    }
    (tmp_path / "c.json").write_text(json.dumps(config))
    done = run310(
        "-m", "tuner_job", "--termination-log", str(tmp_path / "tl"),
        "run", "--config", "c.json", "--out", "out",
        cwd=tmp_path, fake=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["outcomes"] == {"tuned": 0, "default": 1}


@needs_310
def test_a_shard_with_an_exchange_directory_runs_on_python_310(tmp_path: Path) -> None:
    # The reuse/sharding path (no sidecar here: it waits 0 s and says so), on 3.10.
    config = {
        "namespace": "ml",
        "profile": "p",
        "gpuModel": "NVIDIA-H200",
        "revision": "r1",
        "shards": 2,
        "exchange": {"dir": str(tmp_path / "exchange"), "waitSeconds": 0},
        "workload": {"shapes": [{"m": 64 * i, "n": 32, "k": 16} for i in range(1, 7)]},
        "tuning": {"budgetSeconds": 60},
    }
    (tmp_path / "c.json").write_text(json.dumps(config))
    done = run310(
        "-m", "tuner_job", "--termination-log", str(tmp_path / "tl"),
        "run", "--config", "c.json", "--out", "out",
        cwd=tmp_path, fake=True, env={"JOB_COMPLETION_INDEX": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert (manifest["shard"], manifest["shards"], manifest["newlyTuned"]) == (1, 2, 3)
    assert manifest["resume"]["status"] == "none"
    assert (tmp_path / "exchange" / "progress.csv").exists()
