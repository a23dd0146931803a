"""Running the tuner (`python -m tuner_job`) as the tune step does, on the stand-in torch of
tests/unit/data/fake_torch (or none), with a tuning config written for it
(testbed/builders/tuner.py's write_config)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
