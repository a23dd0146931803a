"""The stand-in torch (tests/unit/data/fake_torch) against the real wheels, by the same probes.

Where it claims to behave as torch 2.11 (its default persona) or 2.15 (FAKE_TORCH_PERSONA=2.15),
it does; where it cannot, the test says why. Both run here without a GPU (the stand-in in its
no-device mode), which is where real torch's answers can be had.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.corpus import CASES, generated
from tests.support.torches import Torch, standin

PERSONAS = ["2.11", "newest"]


def _persona(which: str, real: dict[str, Torch], newest: Torch) -> tuple[Torch, Torch]:
    ref = real["2.11.0"] if which == "2.11" else newest
    return ref, standin(ref.version)


def _params(signature: str) -> list[str]:
    """Parameter names and defaults of an inspect.signature string, without annotations."""
    inner = signature[1 : signature.rindex(")")]
    out = []
    for part in re.split(r",\s*(?![^\[]*\])", inner) if inner else []:
        name = part.split(":")[0].split("=")[0].strip()
        default = part.split("=", 1)[1].strip() if "=" in part else None
        out.append(f"{name}={default}" if default is not None else name)
    return out


def _message(error: Any) -> Any:
    """An error as both print it: type and text, without the stand-in's prefix."""
    if not isinstance(error, str):
        return error
    return error.replace("[stand-in torch] ", "")


@pytest.mark.parametrize("which", PERSONAS)
def test_the_api_has_the_functions_and_parameters_of_the_release(
    which: str, real: dict[str, Torch], newest: Torch
) -> None:
    ref, fake = _persona(which, real, newest)
    if fake.release != ref.release:
        pytest.skip(f"the stand-in has no {ref.version} persona (tests/unit/test_torch_matrix.py)")
    theirs, ours = ref.run("api"), fake.run("api")
    assert ours["all"] == theirs["all"]
    assert {n: _params(s) for n, s in ours["functions"].items()} == {
        n: _params(s) for n, s in theirs["functions"].items()
    }
    assert ours["defaults"] == theirs["defaults"]
    assert ours["clamps"] == theirs["clamps"]
    assert {k: _message(v) for k, v in ours["setters"].items()} == theirs["setters"]


@pytest.mark.parametrize("which", PERSONAS)
def test_without_a_device_the_same_calls_raise(
    which: str, real: dict[str, Torch], newest: Torch
) -> None:
    ref, fake = _persona(which, real, newest)
    if fake.release != ref.release:
        pytest.skip(f"the stand-in has no {ref.version} persona")
    theirs, ours = ref.run("no-device"), fake.run("no-device")
    assert {k: v["ok"] for k, v in ours.items()} == {k: v["ok"] for k, v in theirs.items()}
    for call, answer in theirs.items():
        if not answer["ok"]:
            assert _message(ours[call]["error"]) == answer["error"], call
    # What the stand-in's validators are differs on purpose (its PT_VERSION marks it).
    if theirs["get_validators()"]["ok"]:
        assert ours["get_validators()"]["value"] != theirs["get_validators()"]["value"]


@pytest.mark.parametrize("which", PERSONAS)
def test_record_untuned_keeps_the_results_file_unread_as_in_torch(
    which: str, real: dict[str, Torch], newest: Torch, tmp_path: Path
) -> None:
    ref, fake = _persona(which, real, newest)
    if fake.release != ref.release:
        pytest.skip(f"the stand-in has no {ref.version} persona")
    row = "GemmTunableOp_float_NT,nt_64_64_64_ld_64_64_64,Default,0.01\n"
    answers = {}
    for torch in (ref, fake):
        pt = torch.version if not torch.standin else f"{torch.version}+standin"
        path = tmp_path / f"{torch.standin}.csv"
        path.write_text(f"Validator,PT_VERSION,{pt}\n{row}", encoding="utf-8")
        answers[torch.standin] = (torch.run("record-lazy", str(path)), torch.run("lazy", str(path)))
    for theirs, ours in zip(answers[False], answers[True], strict=True):
        # Both: the lazy start reads the file unless record-untuned is on (2.11 and 2.15).
        assert (ours["lazy_read"], ours["explicit_read"]) == (
            theirs["lazy_read"],
            theirs["explicit_read"],
        )
        if ref.release < (2, 14):  # 2.15 loads nothing without a device (its validators)
            assert ours == theirs


def _as_standin(text: str) -> str:
    """The same file for the stand-in, whose PT_VERSION is 2.11.0+standin."""
    return re.sub(r"(Validator,PT_VERSION,)2\.11\.0(?=[,\r\n]|$)", r"\g<1>2.11.0+standin", text)


def _norm_warning(w: str) -> str:
    w = w.replace("[stand-in torch] ", "")
    return re.sub(r"\s*\(Triggered internally at .*\)$", "", w).strip()


def test_the_stand_in_reads_results_files_as_torch_211_reads_them(
    torch211: Torch, tmp_path: Path
) -> None:
    files = {**CASES, **generated(120, seed=3)}
    real_paths, fake_paths = [], []
    for name, text in files.items():
        (tmp_path / f"real-{name}.csv").write_bytes(text.encode())
        (tmp_path / f"fake-{name}.csv").write_bytes(_as_standin(text).encode())
        real_paths.append(tmp_path / f"real-{name}.csv")
        fake_paths.append(tmp_path / f"fake-{name}.csv")
    theirs = torch211.read(real_paths)
    ours = standin("2.11.0").read(fake_paths)
    for name, t, o in zip(files, theirs, ours, strict=True):
        assert (o["loaded"], o["rows"]) == (t["loaded"], t["rows"]), name
        assert [_norm_warning(w) for w in o["warnings"]] == [
            _norm_warning(w) for w in t["warnings"]
        ], name


def test_the_215_persona_refuses_files_without_its_validators_as_215_does(
    newest: Torch, tmp_path: Path
) -> None:
    if newest.release != (2, 15):
        pytest.skip(f"this checks 2.15's validators; the newest pinned torch is {newest.version}")
    path = tmp_path / "only-pt.csv"
    cases = {
        "pt-only": "Validator,PT_VERSION,{v}\n",
        "with-both": "Validator,PT_VERSION,{v}\nValidator,CUBLASLT_VERSION,1\n"
        "Validator,CUDA_DEVICE,x\n",
    }
    for name, text in cases.items():
        path.write_text(text.format(v="2.15.0"))
        (theirs,) = newest.read([path])
        path.write_text(text.format(v="2.15.0+standin"))
        (ours,) = standin("2.15.0").read([path])
        assert ours["loaded"] == theirs["loaded"], name
        assert [_norm_warning(w) for w in ours["warnings"]] == [
            _norm_warning(w) for w in theirs["warnings"]
        ], name
        # With all three, both raise (their validators query the device).
        assert ("error" in ours) == ("error" in theirs), name
