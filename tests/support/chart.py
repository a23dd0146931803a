"""The chart as `helm template` renders it, for unit tests: `template(*sets)` (the completed
process; skips the test when helm is not built: make tools) and `rendered(*sets)` (its
documents, asserting it rendered). `CHART` is charts/tunefleet."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tunefleet"


def helm_bin() -> str:
    found = shutil.which("helm")
    if found:
        return found
    out = subprocess.run(
        [str(ROOT / "hack" / "build-tools.sh"), "--dir"], capture_output=True, text=True
    )
    candidate = Path(out.stdout.strip().splitlines()[-1]) / "helm" if out.stdout.strip() else None
    if candidate and candidate.exists():
        return str(candidate)
    pytest.skip("helm not built (make tools)")


def template(*sets: str) -> subprocess.CompletedProcess[str]:
    args = [helm_bin(), "template", "tf", str(CHART), "-n", "tf-system", "--kube-version", "1.36.3"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def rendered(*sets: str) -> list[dict[str, Any]]:
    out = template(*sets)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]
