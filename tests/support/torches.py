"""The torches the conformance suite asks, run as subprocesses (tests/conformance/probe.py):
`Torch` (a real venv's interpreter, or the stand-in under a persona), `standin`, and which
versions are pinned and built (hack/torch-venvs.sh). The fixtures that hand them to tests are
in tests/conformance/conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "conformance" / "probe.py"
FAKE_TORCH = REPO / "tests" / "unit" / "data" / "fake_torch"
BASELINE = "2.11.0"


@dataclass(frozen=True)
class Torch:
    """One torch to ask: a real venv's interpreter, or the stand-in under a persona."""

    version: str  # "2.11.0", "2.15.0"
    python: str
    env: tuple[tuple[str, str], ...] = ()
    standin: bool = False

    @property
    def release(self) -> tuple[int, int]:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    @property
    def name(self) -> str:
        return f"stand-in {self.version}" if self.standin else f"torch {self.version}"

    def run(self, *args: str, timeout: float = 600, env: dict[str, str] | None = None) -> Any:
        """Run a probe; its one JSON document. Probes without files or extra environment are
        asked once per session (their answers depend on the torch alone)."""
        cacheable = env is None and args[0] in ("api", "env-names", "no-device")
        key = (self, args)
        if cacheable and key in _ANSWERS:
            return _ANSWERS[key]
        answer = self._run(args, timeout, env)
        if cacheable:
            _ANSWERS[key] = answer
        return answer

    def _run(self, args: tuple[str, ...], timeout: float, env: dict[str, str] | None) -> Any:
        full = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTORCH_", "FAKE_TORCH_", "CUDA_")) and k != "PYTHONPATH"
        }
        full.update(dict(self.env))
        full.update(env or {})
        full.setdefault("CUDA_VISIBLE_DEVICES", "")  # no GPU is ever used, even where one is
        done = subprocess.run(
            [self.python, str(PROBE), *args],
            env=full,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"probe {args[0]} under {self.name} failed ({done.returncode}):\n{done.stderr}"
            )
        return json.loads(done.stdout)

    def read(self, paths: Sequence[Path]) -> list[dict[str, Any]]:
        answers: list[dict[str, Any]] = self.run("read", *map(str, paths))
        return answers


_ANSWERS: dict[tuple[Torch, tuple[str, ...]], Any] = {}


SCRIPT = REPO / "hack" / "torch-venvs.sh"


@cache
def pinned() -> tuple[str, ...]:
    """The torch versions CI tests (hack/torch-versions.txt, or TUNEFLEET_TORCH_VERSIONS)."""
    done = subprocess.run(
        [str(SCRIPT), "--pinned"], capture_output=True, text=True, check=True, timeout=60
    )
    return tuple(done.stdout.split())


@cache
def listed() -> dict[str, str]:
    """The built venvs of the pinned versions (others a past run built are not tested)."""
    done = subprocess.run([str(SCRIPT), "--list"], capture_output=True, text=True, check=False)
    found = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in pinned() and Path(parts[1]).is_file():
            found[parts[0]] = parts[1]
    return found


def version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".") if p.isdigit())


def standin(persona: str, **env: str) -> Torch:
    """The stand-in torch as this persona, without a device (as the real ones run here)."""
    base = {
        "PYTHONPATH": str(FAKE_TORCH),
        "FAKE_TORCH_PERSONA": persona,
        "FAKE_TORCH_MODE": "no-device",
    }
    base.update(env)
    return Torch(persona, sys.executable, tuple(sorted(base.items())), standin=True)
