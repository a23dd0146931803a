"""Tuning settings that shape results (issue 17): the rotating buffer as torch defaults it, the
cuBLASLt algorithm count as a spec field, and what changing a default does to revisions."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.wrappers import make_profile
from tunefleet import naming
from tunefleet.api.models import TuningLimits
from tunefleet.builders.job import tuning_config

BASE = (
    make_profile()
    .image("registry.example.com/serve:1")
    .gpu("nvidia", "NVIDIA-H200")
    .shapes((64, 64, 64))
    .storage("s3://bkt/p")
)
FAKE_TORCH = Path(__file__).parent / "data" / "fake_torch"
REPO = Path(__file__).resolve().parents[2]


def test_the_rotating_buffer_defaults_to_torchs_l2_size_and_the_schema_takes_minus_one() -> None:
    """Defect: the buffer defaulted to 0 (off) and the schema forbade -1, so tunefleet measured
    hot-cache timings unless the user picked a size; torch's default is the L2 cache size."""
    assert TuningLimits().rotating_buffer_mb == -1
    assert BASE.tuning(rotatingBufferMB=-1).spec_model().tuning.rotating_buffer_mb == -1
    assert (
        tuning_config(BASE.tuning().spec_model(), "ml", "p", "M", "r")["tuning"]["rotatingBufferMB"]
        == -1
    )


def test_profiles_stored_before_keep_their_revision_and_a_new_default_is_a_new_one() -> None:
    # the API server wrote 0.1's default into it
    stored_before = BASE.tuning(rotatingBufferMB=0).spec_model()
    # tunefleet 0.1's revision for a spec whose tuning fields are at 0.1's defaults (what a
    # profile stored before this change looks like: rotatingBufferMB 0, written by the API
    # server at creation).
    s = stored_before
    shaping = {
        "image": s.image,
        "gpu": {"labelKey": None, "resourceName": None, "count": 1, "vendor": s.gpu.vendor},
        "workload": {"shapes": [{"batch": 1, "dtype": "bfloat16", "transA": False,
                                 "transB": False, "mnk": [64, 64, 64]}]},
        "tuning": {"maxDurationMs": 30, "maxIterations": 100, "warmupDurationMs": 0,
                   "warmupIterations": 0, "rotatingBufferMB": 0, "numericalCheck": False,
                   "budgetSeconds": 3600},
    }  # fmt: skip
    blob = json.dumps(shaping, sort_keys=True, separators=(",", ":")).encode()
    revision_of_01 = hashlib.sha256(blob).hexdigest()[:10]
    assert naming.revision(stored_before) == revision_of_01
    default = BASE.tuning().spec_model()
    assert naming.revision(default) != naming.revision(stored_before)  # -1 is not 0
    assert naming.revision(BASE.tuning(rotatingBufferMB=-1).spec_model()) == naming.revision(
        default
    )
    assert naming.revision(BASE.tuning(rotatingBufferMB=64).spec_model()) not in {
        naming.revision(default),
        naming.revision(stored_before),
    }


def test_the_cublaslt_algo_count_is_owned_by_the_spec_and_in_the_revision() -> None:
    default = BASE.tuning().spec_model()
    assert default.tuning.cublaslt_algo_count == 8  # torch's default
    assert naming.revision(BASE.tuning(cublasltAlgoCount=8).spec_model()) == naming.revision(
        default
    )
    assert naming.revision(BASE.tuning(cublasltAlgoCount=32).spec_model()) != naming.revision(
        default
    )
    assert (
        tuning_config(BASE.tuning(cublasltAlgoCount=32).spec_model(), "ml", "p", "M", "r")[
            "tuning"
        ]["cublasltAlgoCount"]
        == 32
    )
    with pytest.raises(ValueError, match="cublasltAlgoCount"):
        BASE.tuning(cublasltAlgoCount=0).spec_model()
    env = {"name": "PYTORCH_TUNABLEOP_CUBLASLT_REQUESTED_ALGO_COUNT", "value": "4"}
    with pytest.raises(ValueError, match=r"spec\.tuning instead"):
        BASE.set("spec", "workload", "env", value=[env]).spec_model()


def run_tune(tmp: Path, persona: str, tuning: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    (tmp / "u0.csv").write_text("GemmTunableOp_BFloat16_TN,tn_64_64_64_ld_64_64_64\n")
    (tmp / "c.json").write_text(json.dumps({"tuning": tuning}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "TUNEFLEET_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(FAKE_TORCH), str(REPO)]),
        FAKE_TORCH_PERSONA=persona,
        FAKE_TORCH_LOG=str(tmp / "calls.jsonl"),
        PYTORCH_TUNABLEOP_CUBLASLT_REQUESTED_ALGO_COUNT="99",  # the user's: the tuner owns it
    )
    done = subprocess.run(
        [
            *(sys.executable, "-m", "tuner_job", "--termination-log", str(tmp / "tl"), "tune"),
            *("--config", str(tmp / "c.json"), "--untuned", str(tmp / "u0.csv"), "--out", "r.csv"),
        ],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    calls = [json.loads(ln) for ln in (tmp / "calls.jsonl").read_text().splitlines()]
    return done.stderr, calls


def test_the_tuner_passes_the_rotating_buffer_and_algo_count_to_torch(tmp_path: Path) -> None:
    _, calls = run_tune(tmp_path, "2.15", {"cublasltAlgoCount": 3})
    values = {c["event"]: c.get("value") for c in calls}
    assert values["set_rotating_buffer_size"] == -1  # the L2 size, as torch by default
    assert values["set_cublaslt_requested_algo_count"] == 3
    results = (tmp_path / "r.csv").read_text()
    assert "Validator,CUBLASLT_VERSION," in results


def test_an_algo_count_on_a_torch_without_cublaslt_candidates_is_a_warning(tmp_path: Path) -> None:
    stderr, calls = run_tune(tmp_path, "2.11", {"cublasltAlgoCount": 3})
    assert "tuning.cublasltAlgoCount is ignored" in stderr
    assert "set_cublaslt_requested_algo_count" not in {c["event"] for c in calls}
    stderr, _ = run_tune(tmp_path, "2.11", {})
    assert "cublasltAlgoCount" not in stderr  # its default says nothing
