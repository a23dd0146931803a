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
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

PREFIX = "[stand-in]"
MAX_ORDINALS = 64


def say(msg: str) -> None:
    print(f"{PREFIX} {msg}", flush=True)


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
    untuned = os.environ.get("PYTORCH_TUNABLEOP_UNTUNED_FILENAME")
    rows = "no untuned file"
    if untuned:
        stem, dot, ext = untuned.rpartition(".")
        path = Path(f"{stem}{torch.cuda.current_device()}.{ext}" if dot else f"{untuned}0")
        count = len(path.read_text().splitlines()) if path.is_file() else 0
        rows = f"untuned file {path}: {count} row(s)"
    say(f"ran {len(shapes)} GEMM(s); TunableOp holds {loaded} result(s); {rows}")


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


def main(argv: list[str]) -> int:
    report()
    shapes = gemm_shapes(argv)
    if shapes:
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
