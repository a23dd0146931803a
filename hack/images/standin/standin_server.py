#!/usr/bin/env python3
"""Stand-in model server of the stand-in inference image (tests and the demo only).

It serves nothing. It shows what a model pod of tunefleet would get: which
PYTORCH_TUNABLEOP_* variables are set, and which per-ordinal results files
(tunableop_results0.csv, 1, ...) exist next to $PYTORCH_TUNABLEOP_FILENAME, with their
sizes and PT_VERSION validator line. Every line it prints starts with "[stand-in]". Then
it sleeps, so a Deployment stays Running, until SIGTERM/SIGINT (or exits at once with
--once). The torch in this image is a stand-in package that computes nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

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


def main(argv: list[str]) -> int:
    report()
    if "--once" in argv:
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    say("sleeping (SIGTERM to stop)")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
