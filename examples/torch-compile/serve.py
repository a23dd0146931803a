"""A small model served under torch.compile, to measure what a torchCompile bundle buys.

Why: tunefleet tunes once and serves the result to every model pod. For torch.compile that
result is Inductor's cache directory; this script is the workload that fills it (in the tuning
Job) and the server that uses it (in model pods), on the local cluster's real node (CPU only).
It needs only the standard library and torch, so it runs in any torch image, mounted from a
ConfigMap (it is not baked into tunefleet.local/torch-cpu, so changing it rebuilds nothing).

The model is built in code (no download) and seeded, so every process computes the same
outputs. It is what a serving pod does at start, in miniature: build the model, compile it,
answer a first request, then serve. With --serve it then stays up, as a server would (SIGTERM
ends it, exit 0); without, it exits, as the tuning Job's workload run must.

    python3 serve.py --mode {eager,compiled,default,aot} [--iterations N] [--serve]
                     [--report PATH] [--mega-cache PATH]

Modes:
  eager     no compile: the baseline.
  compiled  torch.compile(mode="max-autotune"): Inductor also benchmarks its GEMM choices on
            CPU and keeps the winners in its cache. Falls back to the default mode, saying so
            on stderr and in the result, if max-autotune fails.
  default   torch.compile's default mode.
  aot       AOT precompile (experimental in torch 2.11: torch.compile(fullgraph=True)
            .aot_compile(), save_compiled_function(), torch.compiler.load_compiled_function()):
            loads $TUNEFLEET_AOT_DIR/model.aot if it is there, else compiles and saves it. Exits
            2 when this torch has no such API.

--mega-cache PATH: torch.compiler's "mega-cache": before compiling, load_cache_artifacts() from
PATH if it exists; else save_cache_artifacts() there after the first call.

One line on stdout, after the first request and N steady ones: ``TUNEFLEET_RESULT {json}``
with the mode, torch's version, the seconds from process start (or $TUNEFLEET_T0, an epoch
time) to the first answer, the first call alone, the steady median, Inductor's cache counters
(torch._dynamo.utils.counters: hits mean the cache served), where the caches were (the
variables tunefleet sets), and the first output's SHA-256, first values and sum, to compare
runs. Inductor reads TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR itself; this script never
sets them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

IMPORTED_AT = time.time()  # the process's start, near enough: before torch's import


def _start_time() -> float:
    """$TUNEFLEET_T0 (an epoch time, e.g. the container's start) or this module's import."""
    try:
        return float(os.environ["TUNEFLEET_T0"])
    except (KeyError, ValueError):
        return IMPORTED_AT


T0 = _start_time()
# As the pod was given them: Inductor writes its default back into os.environ once it runs.
CACHE_ENV = {v: os.environ.get(v, "") for v in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}

import torch  # noqa: E402

TORCH_IMPORTED_AT = time.time()

# Blocks of distinct widths: each is its own GEMM shapes and fused kernels, so Inductor
# generates (and, under max-autotune, benchmarks) code for each, as a real model's layers do.
BATCH = 64
WIDTHS = (256, 320, 384, 448, 512, 576, 640, 704)
MODES = ("eager", "compiled", "default", "aot")
AOT_FILE = "model.aot"
# The cache counters of torch 2.11 (torch._dynamo.utils.counters), always reported (0 when
# unset). Names are unique across the groups, so the result has them flat. Not the others
# (select_algorithm_autotune, benchmarking.*): an FX graph cache hit replays the counts its entry
# recorded when compiled (codecache.py, counter_deltas), so they tell a hit from a miss not at all.
COUNTERS = {
    "inductor": (
        "fxgraph_cache_hit",  # a graph's compiled code came from the FX graph cache
        "fxgraph_cache_miss",  # ... was compiled (and written to the cache)
        "fxgraph_cache_bypass",  # ... could not be cached at all
        "fxgraph_lookup_write_file",  # a hit (or an AOT load) wrote its code file back
        "async_compile_cache_hit",
        "async_compile_cache_miss",
        "generated_module_cache_hit",
        "generated_module_cache_miss",
    ),
    "aot_autograd": (
        "autograd_cache_hit",
        "autograd_cache_miss",
        "autograd_cache_bypass",
        "autograd_cache_saved",
        "autograd_cache_guard_miss",
    ),
    "dynamo_cache": ("dynamo_cache_hit", "dynamo_cache_miss", "dynamo_cache_error"),
}


class Block(torch.nn.Module):
    """LayerNorm, an MLP with GELU, a residual, and a projection to the next width."""

    def __init__(self, width: int, out: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)
        self.proj = torch.nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        out: torch.Tensor = self.proj(torch.softmax(h, dim=-1) * h)
        return out


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    outs = (*WIDTHS[1:], WIDTHS[0])
    return torch.nn.Sequential(*(Block(w, o) for w, o in zip(WIDTHS, outs, strict=True))).eval()


def request() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, WIDTHS[0], generator=gen)


def forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What aot compiles: the model is an argument, so its weights are not in the artifact."""
    out: torch.Tensor = model(x)
    return out


def isa_probe_seconds() -> float:
    """Inductor's CPU ISA probe (torch/_inductor/cpu_vec_isa.py, valid_vec_isa_list: a test
    program built and loaded in a new Python process per vector ISA), run first so that it is
    timed alone: every compiling process pays it, cache or not, and the process keeps its
    answer, so the compile does not run it again."""
    started = time.perf_counter()
    from torch._inductor import cpu_vec_isa

    cpu_vec_isa.valid_vec_isa_list()
    return round(time.perf_counter() - started, 4)


def sync() -> None:
    """Wait for queued device work (a no-op on CPU, where every call is synchronous)."""
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()


def counters() -> dict[str, int]:
    from torch._dynamo.utils import counters as found

    got: dict[str, int] = {}
    for group, names in COUNTERS.items():
        have: dict[str, int] = dict(found.get(group, {}))
        got.update({name: int(have.get(name, 0)) for name in names})
        # Any other cache counter this torch has (a newer one may add some).
        got.update({k: int(v) for k, v in have.items() if "cache" in k and k not in got})
    return got


def log(msg: str) -> None:
    print(f"serve.py: {msg}", file=sys.stderr, flush=True)


class Unsupported(Exception):
    """This torch cannot do what the mode asks (exit 2)."""


def aot_model(model: torch.nn.Module, x: torch.Tensor, info: dict[str, Any]) -> Callable[..., Any]:
    """Load the AOT-precompiled forward from $TUNEFLEET_AOT_DIR, or compile and save it."""
    load = getattr(torch.compiler, "load_compiled_function", None)
    dynamo_config = torch._dynamo.config
    if load is None or not hasattr(dynamo_config, "enable_aot_compile"):
        raise Unsupported(f"torch {torch.__version__} has no AOT precompile API")
    dynamo_config.enable_aot_compile = True
    path = Path(os.environ.get("TUNEFLEET_AOT_DIR") or "/tmp/tunefleet-aot") / AOT_FILE
    info["aot_path"] = str(path)
    if path.is_file():
        started = time.time()
        try:
            with path.open("rb") as f:
                fn: Callable[..., Any] = load(f)
        except Exception as e:  # an artifact of another torch, or a broken file: recompile
            log(f"aot: could not load {path} ({type(e).__name__}: {e}); compiling again")
            info["aot"] = f"load failed: {type(e).__name__}"
        else:
            info.update(aot="loaded", aot_load_s=round(time.time() - started, 4))
            return lambda x: fn(model, x)
    started = time.time()
    aot: Any = None
    for compile_mode in ("max-autotune", None):
        compiled: Any = torch.compile(forward, fullgraph=True, mode=compile_mode)
        if not hasattr(compiled, "aot_compile"):
            raise Unsupported(f"torch {torch.__version__}: torch.compile(...) has no aot_compile")
        try:
            aot = compiled.aot_compile(((model, x), {}))
            break
        except Exception as e:
            if compile_mode is None:
                raise
            log(f"aot: max-autotune failed ({type(e).__name__}: {e}); default mode instead")
            info["fallback"] = f"{type(e).__name__}: {e}"[:500]
            torch._dynamo.reset()
    info["compile_mode"] = compile_mode or "default"
    info["aot_compile_s"] = round(time.time() - started, 4)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    aot.save_compiled_function(str(tmp))
    tmp.replace(path)
    info.setdefault("aot", "compiled and saved")
    info["aot_bytes"] = path.stat().st_size
    return lambda x: aot(model, x)


def load_mega_cache(path: Path, info: dict[str, Any]) -> bool:
    """Hot-load torch.compiler's mega-cache from path; False when there is none yet."""
    if not path.is_file():
        return False
    started = time.time()
    got = torch.compiler.load_cache_artifacts(path.read_bytes())
    info["mega_cache"] = {
        "action": "loaded",
        "load_s": round(time.time() - started, 4),
        "artifacts": {k: len(v) for k, v in got.artifacts.items()} if got else {},
    }
    return True


def save_mega_cache(path: Path, info: dict[str, Any]) -> None:
    started = time.time()
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        info["mega_cache"] = {"action": "nothing to save"}
        return
    data, cache_info = saved
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    info["mega_cache"] = {
        "action": "saved",
        "save_s": round(time.time() - started, 4),
        "bytes": len(data),
        "artifacts": {k: len(v) for k, v in cache_info.artifacts.items()},
    }


def run(mode: str, iterations: int, mega_cache: Path | None, device: str = "cpu") -> dict[str, Any]:
    threads = max(1, min(4, os.cpu_count() or 1))
    torch.set_num_threads(threads)
    model = build_model().to(device)
    x = request().to(device)
    info: dict[str, Any] = {}
    mega_loaded = mega_cache is not None and load_mega_cache(mega_cache, info)
    with torch.no_grad():
        if mode != "eager" and device == "cpu":
            info["isa_probe_s"] = isa_probe_seconds()
        started = time.time()
        if mode == "eager":
            fn: Callable[..., Any] = model
            y = fn(x)
        elif mode == "aot":
            fn = aot_model(model, x, info)
            y = fn(x)
        else:
            compile_mode = "max-autotune" if mode == "compiled" else None
            fn = torch.compile(model, mode=compile_mode)
            try:
                y = fn(x)
            except Exception as e:
                if compile_mode is None:
                    raise
                log(f"max-autotune failed ({type(e).__name__}: {e}); default mode instead")
                info["fallback"] = f"{type(e).__name__}: {e}"[:500]
                torch._dynamo.reset()
                compile_mode = None
                fn = torch.compile(model)
                y = fn(x)
            info["compile_mode"] = compile_mode or "default"
        sync()
        answered = time.time()
        first = answered - started
        steady = []
        for _ in range(iterations):
            t = time.perf_counter()
            fn(x)
            sync()
            steady.append((time.perf_counter() - t) * 1000)
    if mega_cache is not None and not mega_loaded and mode != "eager":
        save_mega_cache(mega_cache, info)
    out = y.detach().to("cpu").clone().contiguous()  # a storage of exactly its elements
    data = bytes(out.untyped_storage())
    return {
        "mode": mode,
        **info,
        "torch": torch.__version__,
        "threads": threads,
        "torch_import_s": round(TORCH_IMPORTED_AT - IMPORTED_AT, 4),
        "first_call_s": round(first, 4),
        "process_to_first_s": round(answered - T0, 4),
        "answered_at": round(answered, 4),
        "steady_median_ms": round(statistics.median(steady), 4) if steady else None,
        "iterations": iterations,
        "counters": counters(),
        "caches": CACHE_ENV,
        "output_sha256": hashlib.sha256(data).hexdigest(),
        "output_head": [float(v) for v in out.flatten()[:4].tolist()],
        "output_sum": float(out.double().sum()),
    }


def serve_forever() -> None:
    def stop(signum: int, frame: FrameType | None) -> None:
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--mode", choices=MODES, default="compiled")
    p.add_argument("--iterations", type=int, default=20, help="steady calls after the first")
    p.add_argument("--serve", action="store_true", help="stay up after reporting (until TERM)")
    p.add_argument("--report", type=Path, help="also write the result JSON here")
    p.add_argument("--mega-cache", type=Path, help="load (or save) torch's mega-cache here")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu",
        help="cuda (ROCm too): Inductor generates Triton kernels, kept in TRITON_CACHE_DIR",
    )  # fmt: skip
    args = p.parse_args(argv)
    try:
        result = run(args.mode, max(0, args.iterations), args.mega_cache, args.device)
    except Unsupported as e:
        print(f"serve.py: mode {args.mode} is not supported: {e}", file=sys.stderr)
        return 2
    line = json.dumps(result, sort_keys=True)
    print(f"TUNEFLEET_RESULT {line}", flush=True)
    if args.report:
        args.report.write_text(line + "\n", encoding="utf-8")
    if args.serve:
        serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
