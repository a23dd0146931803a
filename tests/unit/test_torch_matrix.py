"""The pinned torch matrix (hack/torch-versions.txt): hack/torch-venvs.sh builds exactly it, a
newer torch on PyPI is one notice line (never a failure), and the stand-in torch has a persona
for every pinned version. The venvs are faked as built (their stamp files and an interpreter
that answers `pip index versions torch` as PyPI would), so nothing is downloaded."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "torch-venvs.sh"
MATRIX = REPO / "hack" / "torch-versions.txt"
FAKE_TORCH = REPO / "tests" / "unit" / "data" / "fake_torch"


def matrix() -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in MATRIX.read_text().splitlines())
    return [line for line in lines if line]


def fake_built(cache: Path, versions: list[str], pip_answer: str) -> dict[str, Path]:
    """Each version's venv as hack/torch-venvs.sh leaves it built (stamp, interpreter); the
    interpreter runs `pip_answer` (a shell snippet) for `-m pip index versions torch`."""
    pythons = {}
    for v in versions:
        py = cache / "torch" / v / "venv" / "bin" / "python"
        py.parent.mkdir(parents=True)
        py.write_text(
            "#!/usr/bin/env bash\n"
            'if [[ "$*" == "-m pip index versions torch" ]]; then\n'
            f"{pip_answer}\n"
            "fi\n"
            'echo "unexpected call: $*" >&2; exit 99\n'
        )
        py.chmod(0o755)
        (py.parents[2] / f"stamp-{v}").write_text(f"torch=={v}\n")
        pythons[v] = py
    return pythons


def fake_resolver(cache: Path, body: str = "") -> Path:
    """A stand-in for hack/wheels.sh that logs each call (one line of its arguments) to
    cache/resolved and prints the directory as the real one does; `body` runs first."""
    script = cache / "fake-wheels.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(
        "#!/usr/bin/env bash\n"
        f"{body}\n"
        f'echo "$* pin=$WHEELS_PIN_SOURCE" >>"{cache}/resolved"\n'
        f'echo "{cache}/wheels/$1"\n'
    )
    script.chmod(0o755)
    return script


def run(cache: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TUNEFLEET_")}
    full.update(TUNEFLEET_CACHE=str(cache), **env)
    if "TUNEFLEET_WHEELS_SCRIPT" not in env:
        full["TUNEFLEET_WHEELS_SCRIPT"] = str(fake_resolver(cache))
    return subprocess.run(
        [str(SCRIPT)], env=full, capture_output=True, text=True, timeout=timeout, check=False
    )


PYPI_216 = (
    'echo "torch (2.16.0)"; echo "Available versions: 2.16.0, 2.15.0, 2.14.1, 2.11.0"; exit 0'
)


def test_the_matrix_file_pins_2_11_and_2_15_and_the_script_reads_exactly_it() -> None:
    assert matrix() == ["2.11.0", "2.15.0"]
    done = subprocess.run(
        [str(SCRIPT), "--pinned"], capture_output=True, text=True, check=True, timeout=30
    )
    assert done.stdout.split() == matrix()


def test_a_newer_torch_on_pypi_is_one_notice_and_only_the_pinned_are_listed(
    tmp_path: Path,
) -> None:
    pythons = fake_built(tmp_path, matrix(), PYPI_216)
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{v} {pythons[v]}" for v in matrix()]
    assert (tmp_path / "torch" / "venvs").read_text() == done.stdout
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        "torch-venvs: notice: torch 2.16.0 is on PyPI; the matrix tests 2.11.0 2.15.0. To add it:"
    )
    assert "hack/torch-versions.txt" in line and "docs/tuner.md" in line


@pytest.mark.parametrize(
    "answer",
    [
        'echo "torch (2.15.0)"; exit 0',  # PyPI's newest is the newest pinned
        'echo "torch (2.14.1)"; exit 0',  # older (a mirror behind)
        'echo "ERROR: Could not find a version (offline)" >&2; exit 1',
        'echo "WARNING: pip index is experimental"; exit 0',  # nothing parseable
    ],
    ids=["same", "older", "offline", "unparseable"],
)
def test_no_newer_torch_or_no_answer_says_nothing(tmp_path: Path, answer: str) -> None:
    pythons = fake_built(tmp_path, matrix(), answer)
    done = run(tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [f"{v} {pythons[v]}" for v in matrix()]


def test_a_hung_lookup_is_cut_off_silently(tmp_path: Path) -> None:
    fake_built(tmp_path, matrix(), "sleep 60")
    start = time.monotonic()
    done = run(tmp_path, TUNEFLEET_TORCH_PYPI_TIMEOUT="1")
    assert (done.returncode, done.stderr) == (0, "")
    assert time.monotonic() - start < 20


def test_the_lookup_can_be_turned_off(tmp_path: Path) -> None:
    fake_built(tmp_path, matrix(), 'echo "must not be asked" >&2; exit 98')
    done = run(tmp_path, TUNEFLEET_TORCH_PYPI_CHECK="0")
    assert (done.returncode, done.stderr) == (0, "")


def test_the_environment_overrides_the_matrix(tmp_path: Path) -> None:
    pythons = fake_built(tmp_path, ["2.11.0"], PYPI_216)
    done = run(tmp_path, TUNEFLEET_TORCH_VERSIONS="2.11.0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"2.11.0 {pythons['2.11.0']}"]
    assert "notice: torch 2.16.0 is on PyPI; the matrix tests 2.11.0." in done.stderr


def test_a_malformed_pin_fails_before_building(tmp_path: Path) -> None:
    done = run(tmp_path, TUNEFLEET_TORCH_VERSIONS="2.11.0 latest")
    assert done.returncode == 1
    assert "not a torch release: 'latest'" in done.stderr
    assert not (tmp_path / "torch" / "2.11.0").exists()


@pytest.mark.parametrize("version", matrix())
def test_the_stand_in_torch_has_a_persona_for_every_pinned_version(version: str) -> None:
    persona = ".".join(version.split(".")[:2])
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_TORCH_")}
    env.update(PYTHONPATH=str(FAKE_TORCH), FAKE_TORCH_PERSONA=persona, FAKE_TORCH_MODE="no-device")
    done = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (
        f"torch {version} is pinned in hack/torch-versions.txt but the stand-in torch has no "
        f"{persona} persona (docs/tuner.md, 'Adding a torch version'):\n{done.stderr}"
    )
    assert done.stdout.strip() == f"{version}+standin"


def test_the_wheels_are_resolved_every_run_even_when_every_venv_is_built(tmp_path: Path) -> None:
    """Resolution is not skipped on a warm machine: a deleted wheel comes back and a pin PyPI
    lacks fails there too, as on a fresh one (hack/wheels.sh; its own tests in test_wheels)."""
    fake_built(tmp_path, matrix(), 'echo "torch (2.15.0)"; exit 0')
    for _ in range(2):
        assert run(tmp_path).returncode == 0
    calls = (tmp_path / "resolved").read_text().splitlines()
    assert calls == [f"torch-{v} torch=={v} pin={MATRIX}" for v in matrix()] * 2


def test_a_pin_that_does_not_resolve_fails_at_once_naming_it(tmp_path: Path) -> None:
    fake_built(tmp_path, matrix(), 'echo "must not be asked" >&2; exit 98')
    resolver = fake_resolver(
        tmp_path, 'echo "wheels: could not resolve $2 (pip said: no such version)" >&2; exit 1'
    )
    done = run(tmp_path, TUNEFLEET_WHEELS_SCRIPT=str(resolver))
    assert done.returncode == 1 and done.stdout == ""
    assert f"could not resolve torch=={matrix()[0]}" in done.stderr
    assert f"torch=={matrix()[0]}: its wheels did not resolve" in done.stderr
    assert not (tmp_path / "torch" / "venvs").exists()
