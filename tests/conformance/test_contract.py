"""Contract: every torch.cuda.tunable function and PYTORCH_TUNABLEOP_* variable tuner_job (and
scripts/gpu_check.py) uses exists, with the parameters used, in torch 2.11 and the newest
pinned release (hack/torch-versions.txt); read from the modules (inspect) and from the strings in the wheels' libraries. The
one table of what is used is tuner_job/torchapi.py; a source scan keeps it complete.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support.torches import REPO, Torch, standin
from tuner_job.torchapi import API, ENV

SOURCES = [
    *sorted((REPO / "tuner_job").glob("*.py")),
    REPO / "scripts" / "gpu_check.py",
    REPO / "operator" / "tunefleet" / "capture" / "hook.py",  # runs in the user's torch too
]


def _params(signature: str) -> list[str]:
    inner = signature[1 : signature.rindex(")")]
    return [
        p.split(":")[0].split("=")[0].strip() for p in re.split(r",\s*(?![^\[]*\])", inner) if p
    ]


def test_the_table_lists_everything_the_tuner_uses() -> None:
    used_api: set[str] = set()
    used_env: set[str] = set()
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        used_api |= set(re.findall(r"\btunable\.([a-z_]+)\(", text))
        used_api |= set(re.findall(r'hasattr\(tunable, "([a-z_]+)"\)', text))
        used_env |= set(re.findall(r"PYTORCH_TUNABLEOP_[A-Z0-9_]+", text))
    assert used_api - set(API) == set(), "tunable functions used but not in torchapi.API"
    assert used_env - set(ENV) == set(), "PYTORCH_TUNABLEOP_* used but not in torchapi.ENV"


@pytest.mark.parametrize("which", ["2.11", "newest"])
def test_every_function_used_exists_with_the_parameters_used(
    which: str, torch211: Torch, newest: Torch
) -> None:
    torch = torch211 if which == "2.11" else newest
    api = torch.run("api")
    for name, (params, since) in API.items():
        if torch.release < since:
            assert name not in api["functions"] or name in api["all"], name
            continue
        assert name in api["functions"], f"torch {torch.version} has no tunable.{name}"
        assert name in api["all"], f"tunable.{name} is not public in torch {torch.version}"
        have = _params(api["functions"][name])
        assert have[: len(params)] == list(params), (name, have)


@pytest.mark.parametrize("which", ["2.11", "newest"])
def test_every_variable_used_is_one_torchs_libraries_read(
    which: str, torch211: Torch, newest: Torch
) -> None:
    torch = torch211 if which == "2.11" else newest
    names = set(torch.run("env-names")["names"])
    for name, since in ENV.items():
        if torch.release >= since:
            assert name in names, f"torch {torch.version}'s libraries never read {name}"
        else:
            assert name not in names, f"{name} is in torch {torch.version}, before {since}"


@pytest.mark.parametrize("which", ["2.11", "newest"])
def test_record_untuned_with_results_loaded_records_every_gemm_unless_read_file(
    which: str, torch211: Torch, newest: Torch, tmp_path: Path
) -> None:
    """Per version, what docs/tuner.md says: with PYTORCH_TUNABLEOP_RECORD_UNTUNED=1 the
    results manager's lazy start does not read the results file (so every GEMM is a miss and
    recorded); only an explicit read_file() loads it (then only true misses are recorded)."""
    torch = torch211 if which == "2.11" else newest
    path = tmp_path / "r.csv"
    path.write_text(
        f"Validator,PT_VERSION,{torch.version}\nGemmTunableOp_float_NT,nt_8_8_8_ld_8_8_8,Default,0.1\n"
    )
    recording, control = torch.run("record-lazy", str(path)), torch.run("lazy", str(path))
    assert recording["record_untuned"] and not recording["lazy_read"]
    assert recording["explicit_read"]  # read_file() does read it
    assert not control["record_untuned"] and control["lazy_read"]


@pytest.mark.parametrize("which", ["2.11", "newest"])
def test_torchs_defaults_are_what_tunefleet_assumes(
    which: str, torch211: Torch, newest: Torch
) -> None:
    torch = torch211 if which == "2.11" else newest
    api = torch.run("api")
    assert api["defaults"]["get_max_tuning_duration"] == 30
    assert api["defaults"]["get_max_tuning_iterations"] == 100
    if torch.release >= (2, 14):
        assert api["defaults"]["get_cublaslt_requested_algo_count"] == 8
        assert api["clamps"]["set_cublaslt_requested_algo_count(0)"] == 1
    # Tolerances as torch checks them: > 0 each, whatever the switch; tunefleet's pass.
    assert api["setters"]["tolerances(True, 1e-2, 1e-2)"] is None
    assert "must be positive" in api["setters"]["tolerances(False, -1, 0)"]
    # The default rotating buffer is the device's L2 size: asking for it needs the device.
    nodev = torch.run("no-device")
    assert not nodev["get_rotating_buffer_size()"]["ok"]
    assert all(api["setters"][f"rotating({v})"] is None for v in (-1, 0, 64))


@pytest.mark.parametrize("which", ["2.11", "newest", "stand-in"])
def test_the_capture_hook_loads_the_results_while_misses_are_recorded(
    which: str, torch211: Torch, newest: Torch, tmp_path: Path
) -> None:
    """docs/capture.md's claim, on the real wheels: with the hook first on PYTHONPATH and
    record-untuned on, importing torch queues the results load for CUDA's initialisation
    (nothing is initialised at import), and that call loads the results file while recording,
    which torch's own lazy start does not (the test above). Where it runs at a real CUDA
    initialisation, and that a GEMM the file has is then not recorded, needs a GPU:
    scripts/gpu-check.sh checks it (step 4c)."""
    from tunefleet.capture.sidecar import install_hook

    torch = {"2.11": torch211, "newest": newest}.get(which) or standin("2.11.0")
    hook = tmp_path / "hook"
    install_hook(hook)
    pt = torch.version if not torch.standin else f"{torch.version}+standin"
    path = tmp_path / "r0.csv"
    path.write_text(
        f"Validator,PT_VERSION,{pt}\nGemmTunableOp_float_NT,nt_8_8_8_ld_8_8_8,Default,0.1\n"
    )
    paths = [str(hook), *(p for p in [dict(torch.env).get("PYTHONPATH", "")] if p)]
    env = {
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTORCH_TUNABLEOP_ENABLED": "1",
        "PYTORCH_TUNABLEOP_TUNING": "0",
        "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "1",
        "PYTORCH_TUNABLEOP_FILENAME": str(tmp_path / "r%d.csv"),
    }
    got = torch.run("capture-hook", str(path), env=env)
    assert got["hook"] and got["queued"], got
    assert not got["initialized"]  # the hook touches no GPU at import
    assert got["record_untuned"]
    if torch.release < (2, 14):  # 2.15 loads nothing without a device (its validators)
        assert got["rows"] == 1 and got["reads"] == 1, got
        assert any("loaded TunableOp results" in ln for ln in got["hook_said"]), got
    else:
        assert got["hook_said"], got  # one line saying it could not, no exception
