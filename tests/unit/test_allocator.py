"""The operator starts under glibc's malloc with two arenas (tunefleet/__main__.py), once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tunefleet import __main__ as entry


def test_it_starts_again_under_the_allocator_when_unset(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # set by the user: kept
    script = tmp_path / "tunefleet-operator"  # the console script, as the chart starts it
    script.write_text("")
    monkeypatch.setattr(sys, "argv", [str(script), "--verbose"])
    monkeypatch.setattr(os, "execve", lambda *a: calls.append(a))
    entry._with_allocator()
    ((exe, argv, env),) = calls
    # The same command line as before: ps, pkill and the e2e find it by the script's name.
    assert exe == sys.executable and argv[1:] == [str(script), "--verbose"]
    assert env["PYTHONMALLOC"] == "malloc" and env["MALLOC_ARENA_MAX"] == "4"
    # Started as `python -m tunefleet` (sys.argv[0] is the package's __main__.py): as a module.
    calls.clear()
    monkeypatch.setattr(sys, "argv", [entry.__file__, "--verbose"])
    entry._with_allocator()
    assert calls[0][1][1:] == ["-m", "tunefleet", "--verbose"]


def test_it_does_not_start_again_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in entry.ALLOCATOR_ENV.items():
        monkeypatch.setenv(k, v)

    def fail(*a: Any) -> None:
        raise AssertionError("exec'd again")

    monkeypatch.setattr(os, "execve", fail)
    entry._with_allocator()


def test_the_entry_point_still_runs_once_started_again() -> None:
    env = {k: v for k, v in os.environ.items() if k not in entry.ALLOCATOR_ENV}
    code = "import sys, tunefleet.__main__ as m; sys.argv=['x', '--help']; m.main()"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tunefleet-operator" in out.stdout  # --help of the exec'd process
