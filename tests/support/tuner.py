"""Running the tuner (`python -m tuner_job`) as the tune step does, on the stand-in torch of
tests/unit/data/fake_torch (or none), with a tuning config written for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FAKE_TORCH = REPO / "tests" / "unit" / "data" / "fake_torch"


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
