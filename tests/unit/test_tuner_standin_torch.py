"""The stand-in torch (tests/unit/data/fake_torch) behaves as torch 2.11 does where tuner_job
depends on it, and says it is a stand-in in everything it produces.

It is also installed in the stand-in inference image of the e2e tests and the demo, so what it
writes must never pass for real results: a real torch rejects its PT_VERSION.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner_job.results import parse_results, read_untuned

FAKE_TORCH = Path(__file__).parent / "data" / "fake_torch"

# torch/cuda/tunable.py's __all__ in torch 2.11: no set_max_warmup_* (warm-up limits are
# environment variables only) and no write_file / write_file_on_exit (results are appended to
# the results file as they are found).
TUNABLE_2_11 = {
    "enable",
    "is_enabled",
    "tuning_enable",
    "tuning_is_enabled",
    "record_untuned_enable",
    "record_untuned_is_enabled",
    "set_max_tuning_duration",
    "get_max_tuning_duration",
    "set_max_tuning_iterations",
    "get_max_tuning_iterations",
    "set_filename",
    "get_filename",
    "get_results",
    "get_validators",
    "read_file",
    "tune_gemm_in_file",
    "mgpu_tune_gemm_in_file",
    "set_rotating_buffer_size",
    "get_rotating_buffer_size",
    "set_numerical_check_tolerances",
}


def py(tmp: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "FAKE_TORCH"))}
    full.update(PYTHONPATH=str(FAKE_TORCH), **env)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp, env=full, capture_output=True, text=True, timeout=60
    )


def test_it_says_it_is_a_stand_in_everywhere(tmp_path: Path) -> None:
    done = py(
        tmp_path,
        "import json, torch; t = torch.cuda.tunable; print(json.dumps({'v': torch.__version__,"
        " 'name': torch.cuda.get_device_name(0), 'val': dict(t.get_validators())}))",
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["v"] == "2.11.0+standin" and doc["val"] == {"PT_VERSION": "2.11.0+standin"}
    assert doc["name"] == "Stand-in GPU (tunefleet test image: computes nothing)"
    assert done.stderr.strip()  # it announces itself ...
    assert all(ln.startswith("[stand-in torch] ") for ln in done.stderr.strip().splitlines())


@pytest.mark.parametrize(
    ("mode", "check"),
    [
        ("cpu-build", "torch.__version__ == '2.11.0+cpu.standin' and torch.version.cuda is None"),
        ("no-device", "not torch.cuda.is_available() and torch.cuda.device_count() == 0"),
    ],
)
def test_modes(tmp_path: Path, mode: str, check: str) -> None:
    done = py(tmp_path, f"import torch; assert {check}", FAKE_TORCH_MODE=mode)
    assert done.returncode == 0, done.stderr


def test_broken_mode_fails_to_import_and_says_so(tmp_path: Path) -> None:
    done = py(tmp_path, "import torch", FAKE_TORCH_MODE="broken")
    assert done.returncode == 1
    assert "ImportError: [stand-in torch] libcudart.so.13" in done.stderr


def test_tunable_has_exactly_the_torch_2_11_functions(tmp_path: Path) -> None:
    done = py(
        tmp_path,
        "import json, torch.cuda.tunable as t; "
        "print(json.dumps(sorted(n for n in dir(t) if not n.startswith('_'))))",
    )
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)) == TUNABLE_2_11


RECORD = {
    "PYTORCH_TUNABLEOP_ENABLED": "1",
    "PYTORCH_TUNABLEOP_TUNING": "0",
    "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "1",
    "PYTORCH_TUNABLEOP_UNTUNED_FILENAME": "untuned.csv",
}

GEMMS = """
import torch
d = "cuda"
a = torch.rand(256, 128, dtype=torch.bfloat16, device=d)        # A: m=256, k=128
w = torch.rand(512, 128, dtype=torch.bfloat16, device=d)        # a weight, n=512
torch.mm(a, w.t())                                              # x @ W^T
torch.mm(a, torch.rand(128, 512, dtype=torch.bfloat16, device=d))
torch.mm(torch.rand(128, 256, dtype=torch.bfloat16, device=d).t(), w.t())
torch.bmm(torch.rand(8, 64, 32, dtype=torch.half, device=d), torch.rand(8, 32, 16, dtype=torch.half, device=d))
torch.nn.functional.linear(a, w, torch.rand(512, dtype=torch.bfloat16, device=d))
torch.addmm(torch.rand(256, 512, dtype=torch.bfloat16, device=d), a, w.t())  # a 2-D "bias"
torch.backends.cuda.matmul.allow_tf32 = True
torch.mm(torch.rand(64, 32, device=d), torch.rand(32, 16, device=d))
torch.backends.cuda.matmul.allow_tf32 = False
torch.mm(torch.rand(64, 32, device=d), torch.rand(32, 16, device=d))
f8 = torch.float8_e4m3fn
one = torch.tensor(1.0, device=d)
torch._scaled_mm(torch.rand(64, 32, device=d).to(f8), torch.rand(16, 32, device=d).to(f8).t(),
                 scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
torch.mm(torch.rand(3, 3), torch.rand(3, 3))                    # CPU: no TunableOp
"""


def test_gemms_are_recorded_as_torch_names_them(tmp_path: Path) -> None:
    done = py(tmp_path, GEMMS, **RECORD)
    assert done.returncode == 0, done.stderr
    rows = [(r.op, r.params) for r in read_untuned(tmp_path / "untuned0.csv").rows]
    assert rows == [
        # cuBLAS is column-major: mm(A, B) runs as C^T = B^T A^T, so B's layout comes first
        # and the product's n (512) before its m (256).
        ("GemmTunableOp_BFloat16_TN", "tn_512_256_128_ld_128_128_512"),
        ("GemmTunableOp_BFloat16_NN", "nn_512_256_128_ld_512_128_512"),
        ("GemmTunableOp_BFloat16_TT", "tt_512_256_128_ld_128_256_512"),
        ("GemmStridedBatchedTunableOp_Half_NN", "nn_16_64_32_B_8_ld_16_32_16"),
        ("GemmAndBiasTunableOp_BFloat16_TN", "tn_512_256_128_ld_128_128_512"),
        # a 2-D bias is copied into the output and the GEMM is a plain one: already recorded
        ("GemmTunableOp_tf32_NN", "nn_16_64_32_ld_16_32_16"),
        ("GemmTunableOp_float_NN", "nn_16_64_32_ld_16_32_16"),
        # _scaled_mm on CUDA: not through TunableOp, so nothing
    ]


def test_scaled_mm_goes_through_tunableop_on_rocm_only(tmp_path: Path) -> None:
    done = py(tmp_path, GEMMS, FAKE_TORCH_BACKEND="rocm", **RECORD)
    assert done.returncode == 0, done.stderr
    ops = [r.op for r in read_untuned(tmp_path / "untuned0.csv").rows]
    assert ops[-1] == "ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN"


def test_e5m2_times_e5m2_is_refused_on_cuda(tmp_path: Path) -> None:
    code = (
        "import torch; f = torch.float8_e5m2; one = torch.tensor(1.0, device='cuda');"
        "torch._scaled_mm(torch.rand(64, 32, device='cuda').to(f),"
        " torch.rand(16, 32, device='cuda').to(f).t(), scale_a=one, scale_b=one)"
    )
    done = py(tmp_path, code)
    assert done.returncode == 1 and "Multiplication of two Float8_e5m2" in done.stderr


LOAD = """
import json, torch
torch.mm(torch.rand(64, 32, device="cuda"), torch.rand(32, 16, device="cuda"))
print(json.dumps([list(r) for r in torch.cuda.tunable.get_results()]))
"""


@pytest.mark.parametrize(
    ("text", "loaded"),
    [
        ("Validator,PT_VERSION,2.11.0+standin\n{row}\n", True),
        ("Validator,PT_VERSION,2.11.0+standin\r\n{row}\r\n", False),  # split on \n only
        ("\ufeffValidator,PT_VERSION,2.11.0+standin\n{row}\n", False),  # no PT_VERSION line
        ("Validator,PT_VERSION,2.11.0+cu130\n{row}\n", False),  # a real torch's file
    ],
)
def test_results_load_only_as_torch_would_load_them(
    tmp_path: Path, text: str, loaded: bool
) -> None:
    row = "GemmTunableOp_float_NN,nn_16_64_32_ld_16_32_16,Default,0.01"
    (tmp_path / "r0.csv").write_bytes(text.format(row=row).encode())
    env = {
        "PYTORCH_TUNABLEOP_ENABLED": "1",
        "PYTORCH_TUNABLEOP_TUNING": "0",
        "PYTORCH_TUNABLEOP_FILENAME": "r%d.csv",
        "PYTORCH_TUNABLEOP_VERBOSE": "3",
    }
    done = py(tmp_path, LOAD, **env)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert (results == [[*row.split(",")[:3], 0.01]]) is loaded
    # PYTORCH_TUNABLEOP_VERBOSE=3 logs every lookup, a miss as TunableOp words it
    hit = "ResultEntry found for GemmTunableOp_float_NN,nn_16_64_32_ld_16_32_16"
    miss = "missing op_signature, returning null ResultEntry for GemmTunableOp_float_NN,"
    assert (hit in done.stderr, miss in done.stderr) == (loaded, not loaded)


def test_tuning_appends_its_results_with_validators_first(tmp_path: Path) -> None:
    env = {"PYTORCH_TUNABLEOP_ENABLED": "1", "PYTORCH_TUNABLEOP_FILENAME": "t%d.csv"}
    done = py(tmp_path, GEMMS, **env)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "t0.csv").read_text()
    assert text.startswith("Validator,PT_VERSION,2.11.0+standin\n")
    results = parse_results(text)
    assert results.gemms == 7 and {r.solution for r in results.rows} == {"Default"}
