"""A tuning config as the tune step reads it (`python -m tuner_job --config`), for the tests
that run the tuner as a process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
