"""Reuse that respects the tuning settings (issue 17): a library entry records what its rows
were tuned with, and a run reuses only entries tuned with the same or stronger settings.

Through the real programs against a file:// store, as tests/unit/test_library_flow.py does, with
the stand-in torch (it computes nothing: counts of GEMMs are real, times are not).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.wrappers import make_tuner_run
from testbed.library_pod import Pod
from tuner_job.library import Settings

ROCM = {"FAKE_TORCH_BACKEND": "rocm"}
DEFAULTS = Settings(30, 100, 0, 0, -1, False, 1e-2, 1e-2, None)


def first_then(tmp: Path, **tuning: Any) -> dict[str, Any]:
    run = make_tuner_run(tmp / "store", "first", range(8)).env(**ROCM)
    first = Pod(run.fields(revision="rev-first").obj(), tmp / "a").run()
    assert first.tune.returncode == 0, first.tune.stderr
    assert first.manifest()["settings"] == DEFAULTS.to_dict()
    second = Pod(
        run.fields(profile="second", revision="rev-second", tuning=tuning).obj(), tmp / "b"
    ).run()
    assert second.tune.returncode == 0, second.tune.stderr
    return second.manifest()


@pytest.mark.parametrize(
    ("tuning", "why"),
    [
        ({"maxDurationMs": 60}, "maxDurationMs 30 < 60"),
        ({"maxIterations": 500}, "maxIterations 100 < 500"),
        ({"numericalCheck": True}, "numericalCheck off, this run checks"),
        ({"rotatingBufferMB": 512}, "rotatingBufferMB -1 vs 512"),
    ],
)
def test_following_the_no_gain_advice_retunes(
    tmp_path: Path, tuning: dict[str, Any], why: str
) -> None:
    """Defect: the library key had no tuning settings, so raising maxDurationMs or
    maxIterations as the no-gain message advises (or turning numericalCheck on) made a new
    revision that reused every row and tuned nothing ("reused 2, to tune 0")."""
    m = first_then(tmp_path, **tuning)
    assert (m["reused"], m["newlyTuned"]) == (0, 8)
    assert m["library"]["skippedCount"] == 1
    assert why in m["library"]["skipped"][0]["reason"]
    assert "weaker settings" in m["library"]["skipped"][0]["reason"]


def test_a_run_with_weaker_settings_reuses_the_stronger_entries(tmp_path: Path) -> None:
    m = first_then(tmp_path, maxDurationMs=10, maxIterations=20, rotatingBufferMB=-1)
    assert (m["reused"], m["newlyTuned"]) == (8, 0)
    assert m["settings"]["maxDurationMs"] == 10


def test_an_entry_without_settings_is_not_reused(tmp_path: Path) -> None:
    run = make_tuner_run(tmp_path / "store", "first", range(8)).env(**ROCM)
    first = Pod(run.fields(revision="rev-first").obj(), tmp_path / "a").run()
    entry = Path(first.publish.stderr.split("library: file://")[1].split()[0])  # type: ignore[union-attr]
    doc = json.loads(entry.read_text())
    del doc["settings"]  # an entry published before tunefleet recorded settings
    import hashlib

    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    entry.unlink()
    (entry.parent / f"{hashlib.sha256(data).hexdigest()}.json").write_bytes(data)
    second = Pod(run.fields(profile="second", revision="rev-second").obj(), tmp_path / "b").run()
    m = second.manifest()
    assert (m["reused"], m["newlyTuned"]) == (0, 8)
    assert "records no tuning settings" in m["library"]["skipped"][0]["reason"]


@pytest.mark.parametrize(
    ("entry", "wanted", "short"),
    [
        (DEFAULTS, DEFAULTS, None),
        (DEFAULTS, Settings(30, 100, 0, 0, 0, False, 1e-2, 1e-2, None), None),  # off is weakest
        (Settings(30, 100, 0, 0, 256, False, 1e-2, 1e-2, None),
         Settings(30, 100, 0, 0, 64, False, 1e-2, 1e-2, None), None),  # bigger covers smaller
        (Settings(30, 100, 0, 0, 64, False, 1e-2, 1e-2, None), DEFAULTS, "rotatingBufferMB"),
        (Settings(30, 100, 0, 0, -1, True, 1e-3, 1e-3, None),
         Settings(30, 100, 0, 0, -1, True, 1e-2, 1e-2, None), None),  # tighter covers looser
        (Settings(30, 100, 0, 0, -1, True, 1e-1, 1e-2, None),
         Settings(30, 100, 0, 0, -1, True, 1e-2, 1e-2, None), "looser"),
        (Settings(30, 100, 0, 0, -1, False, 1e-2, 1e-2, 8),
         Settings(30, 100, 0, 0, -1, False, 1e-2, 1e-2, 16), "cublasltAlgoCount 8 < 16"),
        (Settings(30, 100, 0, 0, -1, False, 1e-2, 1e-2, 16),
         Settings(30, 100, 0, 0, -1, False, 1e-2, 1e-2, 8), None),
        (DEFAULTS, Settings(30, 100, 5, 2, -1, False, 1e-2, 1e-2, None), "warmupDurationMs 0 < 5"),
    ],
)  # fmt: skip
def test_same_or_stronger_covers(entry: Settings, wanted: Settings, short: str | None) -> None:
    got = entry.falls_short_of(wanted)
    assert (got is None) if short is None else (got is not None and short in got), got
    assert Settings.from_dict(entry.to_dict()) == entry
