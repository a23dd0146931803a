"""Fixtures of the conformance suite: real torch as the reference, run as subprocesses.

The real wheels live in venvs outside the repo (hack/torch-venvs.sh, which `make test` runs
first): exactly the versions pinned in hack/torch-versions.txt (2.11.0, the reader's oracle,
and the newest pinned, which plays "the newest release"; TUNEFLEET_TORCH_VERSIONS overrides the
file as it does for the script). The project's .venv never imports torch; every
question to a torch goes through tests/conformance/probe.py run by that torch's interpreter,
or by this interpreter with the stand-in torch on PYTHONPATH (the same probes, so the stand-in
is checked where it claims to behave as torch).

Without the pinned venvs the suite is skipped, unless TUNEFLEET_CONFORMANCE=required (make test sets
it), where their absence fails it.
"""

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

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("probe.py")
FAKE_TORCH = REPO / "tests" / "unit" / "data" / "fake_torch"
BASELINE = "2.11.0"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.conformance)


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
def _listed() -> dict[str, str]:
    """The built venvs of the pinned versions (others a past run built are not tested)."""
    done = subprocess.run([str(SCRIPT), "--list"], capture_output=True, text=True, check=False)
    found = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in pinned() and Path(parts[1]).is_file():
            found[parts[0]] = parts[1]
    return found


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".") if p.isdigit())


@pytest.fixture(scope="session")
def venvs() -> dict[str, str]:
    found = _listed()
    missing = [v for v in pinned() if v not in found]
    if BASELINE not in pinned() or len(pinned()) < 2:
        pytest.fail(
            f"the torch matrix {list(pinned())} must pin {BASELINE} and a newer release "
            "(hack/torch-versions.txt)",
            pytrace=False,
        )
    if missing:
        why = (
            f"the real-torch venvs of {missing} are not built (pinned {list(pinned())}, found "
            f"{sorted(found) or 'none'}): run hack/torch-venvs.sh (make test does)"
        )
        if os.environ.get("TUNEFLEET_CONFORMANCE") == "required":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return found


@pytest.fixture(scope="session")
def torch211(venvs: dict[str, str]) -> Torch:
    return Torch(BASELINE, venvs[BASELINE])


@pytest.fixture(scope="session")
def newest(venvs: dict[str, str]) -> Torch:
    """The newest pinned torch (hack/torch-versions.txt), never whatever PyPI has now."""
    version = max(pinned(), key=_version_key)
    return Torch(version, venvs[version])


@pytest.fixture(scope="session")
def real(torch211: Torch, newest: Torch) -> dict[str, Torch]:
    """Both real torches, by version."""
    return {torch211.version: torch211, newest.version: newest}


def standin(persona: str, **env: str) -> Torch:
    """The stand-in torch as this persona, without a device (as the real ones run here)."""
    base = {
        "PYTHONPATH": str(FAKE_TORCH),
        "FAKE_TORCH_PERSONA": persona,
        "FAKE_TORCH_MODE": "no-device",
    }
    base.update(env)
    return Torch(persona, sys.executable, tuple(sorted(base.items())), standin=True)
