"""The operator starts again, once, under the allocator it runs best with (tunefleet/__main__.py):
jemalloc where installed, else glibc's malloc with two arenas; what the environment sets is kept."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tunefleet import __main__ as entry
from tunefleet.reconciler import controller

OURS = ("PYTHONMALLOC", "LD_PRELOAD", "MALLOC_CONF", *entry.GLIBC_ENV, "TUNEFLEET_ALLOCATOR")


def clean(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in OURS}, **extra}


def test_jemalloc_where_installed_and_glibc_else(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lib = tmp_path / entry.JEMALLOC
    lib.write_text("")
    monkeypatch.setattr(entry, "jemalloc_path", lambda: str(lib))
    got = entry.allocator_env(clean())
    assert got == {
        "PYTHONMALLOC": "malloc",
        "LD_PRELOAD": str(lib),
        "MALLOC_CONF": entry.JEMALLOC_CONF,
    }
    # Once exec'd with it, nothing is missing: no second exec (and no loop).
    assert entry.allocator_env(clean(**got)) == {}
    # Opted out, or another preloaded library: glibc's settings, the preload kept as it was.
    assert entry.allocator_env(clean(TUNEFLEET_ALLOCATOR="glibc")) == {
        "PYTHONMALLOC": "malloc",
        **entry.GLIBC_ENV,
    }
    other = entry.allocator_env(clean(LD_PRELOAD="/opt/libtcmalloc.so"))
    assert "LD_PRELOAD" not in other and other["MALLOC_ARENA_MAX"] == "2"
    # The user's own jemalloc settings are kept.
    assert "MALLOC_CONF" not in entry.allocator_env(clean(MALLOC_CONF="narenas:1"))

    monkeypatch.setattr(entry, "jemalloc_path", lambda: None)
    glibc = entry.allocator_env(clean())
    assert glibc == {"PYTHONMALLOC": "malloc", **entry.GLIBC_ENV}
    assert entry.allocator_env(clean(**glibc)) == {}
    # Asked for by name but not there: said, not silently replaced.
    with pytest.raises(SystemExit, match="libjemalloc2"):
        entry.allocator_env(clean(TUNEFLEET_ALLOCATOR="jemalloc"))
    with pytest.raises(SystemExit, match="not one of auto, jemalloc, glibc"):
        entry.allocator_env(clean(TUNEFLEET_ALLOCATOR="tcmalloc"))


def test_it_starts_again_under_the_allocator_when_unset(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    for k in OURS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(entry, "jemalloc_path", lambda: None)
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
    monkeypatch.setattr(entry, "jemalloc_path", lambda: None)
    for k, v in {"PYTHONMALLOC": "malloc", **entry.GLIBC_ENV}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("TUNEFLEET_ALLOCATOR", raising=False)

    def fail(*a: Any) -> None:
        raise AssertionError("exec'd again")

    monkeypatch.setattr(os, "execve", fail)
    entry._with_allocator()


def test_the_entry_point_still_runs_once_started_again() -> None:
    code = "import sys, tunefleet.__main__ as m; sys.argv=['x', '--help']; m.main()"
    out = subprocess.run(
        [sys.executable, "-c", code], env=clean(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tunefleet-operator" in out.stdout  # --help of the exec'd process


@pytest.mark.skipif(entry.jemalloc_path() is None, reason="libjemalloc2 is not installed here")
def test_under_jemalloc_the_process_runs_it_and_purges_through_it() -> None:
    """The real library, preloaded as the operator preloads it: malloc is jemalloc's, and
    release_memory purges its arenas (mallctl found) rather than trimming glibc's heap."""
    code = (
        "import ctypes, sys; from tunefleet.reconciler import controller; "
        "maps = open('/proc/self/maps').read(); "
        "assert 'libjemalloc' in maps, 'not preloaded'; "
        "assert getattr(ctypes.CDLL(None), 'mallctl', None) is not None; "
        "x = [bytes(2000) for _ in range(20000)]; del x; controller.release_memory(); "
        "print('ok')"
    )
    env = clean(**entry.allocator_env(clean()))
    assert "LD_PRELOAD" in env
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_under_glibc_release_memory_trims() -> None:
    # No mallctl in a glibc process: the trim path, which must not raise.
    assert getattr(ctypes.CDLL(None), "mallctl", None) is None or "jemalloc" in os.environ.get(
        "LD_PRELOAD", ""
    )
    controller.release_memory()
