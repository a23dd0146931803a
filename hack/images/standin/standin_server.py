#!/usr/bin/env python3
"""Stand-in model server of the stand-in inference image (tests and the demo only).

It serves nothing. It shows what a model pod of tunefleet would get: which
PYTORCH_TUNABLEOP_* variables are set, and which per-ordinal results files
(tunableop_results0.csv, 1, ...) exist next to $PYTORCH_TUNABLEOP_FILENAME, with their
sizes and PT_VERSION validator line. Every line it prints starts with "[stand-in]". Then
it sleeps, so a Deployment stays Running, until SIGTERM/SIGINT (or exits at once with
--once). The torch in this image is a stand-in package that computes nothing.

With --gemms JSON (or $STANDIN_GEMMS), a list of shapes in spec.workload.shapes' form
([{"mnk": [m, n, k], "dtype": "bfloat16", "transA": false, "transB": true, "bias": false,
"batch": 1}, ...]), it runs those GEMMs through the stand-in torch as serving would
(torch.mm, addmm with a bias, bmm; operands made as tuner_job's record step makes them),
with whatever TunableOp settings the pod has, once at start and then every
$STANDIN_GEMMS_EVERY seconds (default 10): so a test can make production hit shapes an
artifact lacks. After each round it says how many TunableOp results the process holds and
how many rows its untuned file has.

With --tp N it starts N workers, one process per GPU ordinal as vLLM's and TGI's tensor
parallel workers are (each `--rank i`: torch.cuda.set_device(i) before its first GEMM, so
TunableOp reads and records the files of ordinal i), and waits for them.

With --tgi-warmup it replays, in that order, the TunableOp calls of TGI's ROCm warmup
(text-generation-inference server/text_generation_server/models/flash_causal_lm.py, warmup()):
tuning_enable(False) when PYTORCH_TUNABLEOP_ENABLED is set, a first round of GEMMs (TGI's
memory-profiling prefill), then enable(), tuning_enable(True) unless
PYTORCH_TUNABLEOP_TUNING=0, set_filename($HUGGINGFACE_HUB_CACHE/tunableop_<model>_tp<N>_rank<R>
.csv, False), read_file() of it if it exists, a warmup round, write_file() of it (where this
torch has one), tuning_enable(False) unless PYTORCH_TUNABLEOP_TUNING_AFTER_WARMUP=1. It shows
which settings win when a server drives TunableOp through the Python API (docs/serving.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PREFIX = "[stand-in]"
MAX_ORDINALS = 64


def say(msg: str) -> None:
    # One write per line: the workers of --tp share the pod's stdout.
    sys.stdout.write(f"{PREFIX} {msg}\n")
    sys.stdout.flush()


def ordinal_path(pattern: str, i: int) -> Path:
    """TunableOp's rule: %d becomes the ordinal, else it goes before the last '.'."""
    if "%d" in pattern:
        return Path(pattern.replace("%d", str(i)))
    stem, dot, ext = pattern.rpartition(".")
    return Path(f"{stem}{i}.{ext}" if dot else f"{pattern}{i}")


def validator_line(path: Path) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace", newline="") as f:
            for _, line in zip(range(200), f, strict=False):
                if line.startswith("Validator,PT_VERSION,"):
                    return line.rstrip("\r\n")
    except OSError as e:
        return f"(unreadable: {e})"
    return "(no Validator,PT_VERSION line)"


def report_torch() -> None:
    try:
        import torch  # the stand-in package, not PyTorch
    except Exception as e:  # its "broken" mode fails to import, like a torch missing a library
        say(f"torch: import failed: {e}")
        return
    cuda = getattr(torch, "cuda", None)
    try:
        available = bool(cuda.is_available()) if cuda else False
        count = int(cuda.device_count()) if cuda and available else 0
    except Exception as e:
        say(f"torch {torch.__version__} (stand-in package): device query failed: {e}")
        return
    mode = os.environ.get("FAKE_TORCH_MODE", "gpu")
    say(
        f"torch {torch.__version__} (stand-in package, FAKE_TORCH_MODE={mode}): "
        f"GPU available: {available}, devices: {count}"
    )


def report() -> None:
    say("stand-in model server: tests and demo only; no model, no real PyTorch, no GPU work")
    report_torch()
    env = {k: v for k, v in os.environ.items() if k.startswith("PYTORCH_TUNABLEOP_")}
    if not env:
        say("no PYTORCH_TUNABLEOP_* variables set")
    for key in sorted(env):
        say(f"env {key}={env[key]}")
    pattern = env.get("PYTORCH_TUNABLEOP_FILENAME")
    if not pattern:
        say("PYTORCH_TUNABLEOP_FILENAME not set: no results files to look for")
        return
    directory = ordinal_path(pattern, 0).parent
    found = 0
    for i in range(MAX_ORDINALS):
        path = ordinal_path(pattern, i)
        if path.is_file():
            found += 1
            size = path.stat().st_size
            say(f"results ordinal {i}: {path} ({size} bytes) {validator_line(path)}")
    if not found:
        listing = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else None
        where = f"{directory} has {listing}" if listing is not None else f"{directory} missing"
        say(f"no results files for {pattern} ({where})")
    else:
        say(f"{found} results file(s) in {directory}")


def _operands(torch: Any, shape: dict[str, Any], dtype: Any) -> tuple[Any, Any]:
    m, n, k = (int(d) for d in shape["mnk"])
    batch = int(shape.get("batch") or 1)
    if batch > 1:
        a = torch.rand(batch, m, k, dtype=dtype, device="cuda")
        return a, torch.rand(batch, k, n, dtype=dtype, device="cuda")
    a = (
        torch.rand(k, m, dtype=dtype, device="cuda").t()
        if shape.get("transA")
        else torch.rand(m, k, dtype=dtype, device="cuda")
    )
    b = (
        torch.rand(n, k, dtype=dtype, device="cuda").t()
        if shape.get("transB")
        else torch.rand(k, n, dtype=dtype, device="cuda")
    )
    return a, b


def run_gemms(shapes: list[dict[str, Any]]) -> None:
    """One round of the shapes' GEMMs, as a serving process runs them."""
    import torch  # the stand-in package

    for shape in shapes:
        dtype = getattr(torch, str(shape.get("dtype") or "bfloat16"))
        a, b = _operands(torch, shape, dtype)
        if int(shape.get("batch") or 1) > 1:
            torch.bmm(a, b)
        elif shape.get("bias"):
            n = int(shape["mnk"][1])
            torch.addmm(torch.rand(n, dtype=dtype, device="cuda"), a, b)
        else:
            torch.mm(a, b)
    loaded = len(torch.cuda.tunable.get_results())
    device = torch.cuda.current_device()
    untuned = os.environ.get("PYTORCH_TUNABLEOP_UNTUNED_FILENAME")
    rows = "no untuned file"
    if untuned:
        stem, dot, ext = untuned.rpartition(".")
        path = Path(f"{stem}{device}.{ext}" if dot else f"{untuned}{device}")
        count = len(path.read_text().splitlines()) if path.is_file() else 0
        rows = f"untuned file {path}: {count} row(s)"
    say(f"ran {len(shapes)} GEMM(s) on device {device}; TunableOp holds {loaded} result(s); {rows}")


def gemm_shapes(argv: list[str]) -> list[dict[str, Any]]:
    raw = os.environ.get("STANDIN_GEMMS", "")
    if "--gemms" in argv:
        raw = argv[argv.index("--gemms") + 1]
    if not raw:
        return []
    shapes = json.loads(raw)
    if not isinstance(shapes, list) or not all(
        isinstance(s, dict) and len(s.get("mnk") or []) == 3 for s in shapes
    ):
        raise SystemExit(f"{PREFIX} --gemms: a JSON list of {{mnk: [m, n, k], ...}} shapes")
    return shapes


def tgi_warmup(shapes: list[dict[str, Any]], rank: int, world: int) -> None:
    """TGI's ROCm warmup, its TunableOp calls in its order (see the module's docstring)."""
    import torch  # the stand-in package

    tunable = torch.cuda.tunable
    env = os.environ.get
    if env("PYTORCH_TUNABLEOP_ENABLED"):
        tunable.tuning_enable(False)
    run_gemms(shapes)  # TGI's first generate_token: TunableOp's first use
    if env("PYTORCH_TUNABLEOP_ENABLED") not in (None, "1"):
        say("tgi warmup: TunableOp disabled by PYTORCH_TUNABLEOP_ENABLED")
        return
    tunable.enable()
    if env("PYTORCH_TUNABLEOP_TUNING") != "0":
        tunable.tuning_enable(True)
    during = tunable.tuning_is_enabled()
    model = env("MODEL_ID", "standin/model").replace("/", "-")
    cache = env("HUGGINGFACE_HUB_CACHE", "/tmp/hub")
    path = os.path.join(cache, f"tunableop_{model}_tp{world}_rank{rank}.csv")
    tunable.set_filename(path, False)
    reused = os.path.isfile(path) and tunable.read_file(path)
    os.makedirs(cache, exist_ok=True)
    run_gemms(shapes)  # tunableop_warmup
    wrote = hasattr(tunable, "write_file") and tunable.write_file(path)
    if env("PYTORCH_TUNABLEOP_TUNING_AFTER_WARMUP") != "1":
        tunable.tuning_enable(False)
    say(
        f"tgi warmup rank {rank}: filename {tunable.get_filename()} (reused: {bool(reused)}, "
        f"written: {bool(wrote)}); TunableOp holds {len(tunable.get_results())} result(s); "
        f"tuning during warmup: {during}, after: {tunable.tuning_is_enabled()}"
    )


def _without(argv: list[str], flag: str) -> list[str]:
    i = argv.index(flag)
    return argv[:i] + argv[i + 2 :]


def run_workers(argv: list[str]) -> int:
    """--tp N: one worker process per GPU ordinal; the exit status is the worst of theirs."""
    n = int(argv[argv.index("--tp") + 1])
    rest = _without(argv, "--tp")
    env = {**os.environ, "FAKE_TORCH_GPUS": os.environ.get("FAKE_TORCH_GPUS", str(n))}
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, *rest, "--rank", str(i), "--world", str(n)], env=env
        )
        for i in range(n)
    ]
    signal.signal(signal.SIGTERM, lambda *_: [w.terminate() for w in workers])
    return max(w.wait() for w in workers)


def main(argv: list[str]) -> int:
    if "--tp" in argv:
        return run_workers(argv)
    rank = int(argv[argv.index("--rank") + 1]) if "--rank" in argv else 0
    world = int(argv[argv.index("--world") + 1]) if "--world" in argv else 1
    if "--rank" in argv:
        import torch  # the stand-in package

        torch.cuda.set_device(rank)  # before any GEMM, as a tensor parallel worker does
        say(f"worker rank {rank} of {world}: device {torch.cuda.current_device()}")
    report()
    shapes = gemm_shapes(argv)
    if shapes and "--tgi-warmup" in argv:
        tgi_warmup(shapes, rank, world)
    elif shapes:
        run_gemms(shapes)
    if "--once" in argv:
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    every = float(os.environ.get("STANDIN_GEMMS_EVERY", "10"))
    say("serving (SIGTERM to stop)" if shapes else "sleeping (SIGTERM to stop)")
    while True:
        time.sleep(every if shapes else 3600)
        if shapes:
            run_gemms(shapes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
