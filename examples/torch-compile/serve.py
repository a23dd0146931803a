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
                     [--report PATH] [--mega-cache PATH] [--precompile]

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

--precompile (modes compiled and default, when TORCHINDUCTOR_CACHE_DIR is given, as tunefleet
gives it): the compiled forward is also kept, AOT-precompiled, in that directory (so tunefleet packs
it with Inductor's cache): $TORCHINDUCTOR_CACHE_DIR/tunefleet-precompiled/<mode>-<device>.bin.
Where the file is there (a pod with the bundle), the first call loads it
(torch.compiler.load_compiled_function) instead of tracing with Dynamo and looking the graph up
in Inductor's caches, with Inductor's header precompiling off for the load
(config.cpp_cache_precompile_headers: every kernel it calls is already built in the bundle; the
precompiled header, which lives in $TMPDIR, not in the cache, would only cost seconds to build)
where that leaves the kernels' cache keys alone (torch 2.11 on CPU; not torch 2.15, whose
kernels' build command names it: there it stays on).
A load that fails (another torch, a guard that does not hold, a broken file) says so and
compiles as without the file. Where it is not (the tuning run), the run compiles as always,
answers, and only then, where the first call compiled (no FX graph cache hit: a tuning run),
precompiles the same forward (Inductor's caches are warm: seconds) and saves it if its output is
bit for bit the first answer's. "precompiled" in the result says what happened. The file holds
Dynamo's guards and the graph's code, not the weights nor the C++ kernels (those are in the
cache dir beside it, found by content, wherever the dir is); its guards name the model's classes
by module (__main__ here), so it loads in a process running this script, with the same torch.

One line on stdout, after the first request and N steady ones: ``TUNEFLEET_RESULT {json}``
with the mode, torch's version, the seconds from process start (or $TUNEFLEET_T0, an epoch
time) to the first answer, and the same seconds by phase ("breakdown": torch's import, the
model's build, the compiler's import, the ISA probe's builds and loads, Dynamo's tracing and
guards, Inductor's cache lookup and load or compile, C++ builds, the precompiled load, the first
run itself; "other" the rest, so that they add up to process_to_first_s; the compile phases are
read from torch's own timers, torch._dynamo.utils.compilation_time_metrics), the first call
alone, the steady median, Inductor's cache counters
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
PRECOMPILED_DIR = "tunefleet-precompiled"  # under TORCHINDUCTOR_CACHE_DIR: packed with it
# torch's own timers (torch._dynamo.utils.compilation_time_metrics, seconds per dynamo_timed key;
# torch 2.11's names), read to name the first call's seconds. A key this torch lacks reads 0
# and its seconds land in the phase around it (or "other"), never nowhere.
COMPILE_FILE = "compile_file"  # one C++ build in this process (cpp_builder.run_compile_cmd)
DYNAMO_FRAME = "_compile.compile_inner"  # Dynamo's compile of a frame, backend and guards in
BACKEND = "OutputGraph.call_user_compiler"  # AOTAutograd and Inductor, or their caches
GUARDS = "build_guards"
CACHE_LOAD = "AOTAutogradCache.inductor_load"  # a cached compiled graph's code, loaded
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


class Phases:
    """Named seconds of the way to the first answer, in the order they ran."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + max(0.0, seconds)

    def breakdown(self, total: float) -> dict[str, float]:
        """Rounded, with "other" what no phase named, so that they add up to total."""
        out = {k: round(v, 4) for k, v in self.seconds.items()}
        out["other"] = round(total - sum(out.values()), 4)
        return out


def compile_metrics() -> dict[str, float]:
    """Seconds each of torch's dynamo_timed keys has recorded in this process so far."""
    from torch._dynamo.utils import compilation_time_metrics

    return {k: float(sum(v)) for k, v in compilation_time_metrics.items()}


def since(before: dict[str, float]) -> dict[str, float]:
    after = compile_metrics()
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def import_compiler() -> None:
    """What compiling (or loading a compiled forward) imports: Dynamo and Inductor."""
    import torch._dynamo
    import torch._inductor.compile_fx
    import torch._inductor.cpu_vec_isa  # noqa: F401


def isa_probe(phases: Phases) -> float:
    """Inductor's CPU ISA probe (torch/_inductor/cpu_vec_isa.py, valid_vec_isa_list: a test
    program per vector ISA, built (into Inductor's cache dir, where a bundle carries it: then
    nothing is built) and loaded in a new Python process that imports torch), run first so that
    it is timed alone: every process that compiles or loads Inductor's C++ kernels pays it,
    cache or not (each kernel's load asks for the ISA), and the process keeps its answer."""
    from torch._inductor import cpu_vec_isa

    before = compile_metrics()
    started = time.perf_counter()
    cpu_vec_isa.valid_vec_isa_list()
    took = time.perf_counter() - started
    built = since(before).get(COMPILE_FILE, 0.0)
    phases.add("isa_probe_build", built)
    phases.add("isa_probe_load", took - built)  # the new processes' loads (and the checks)
    return round(took, 4)


def name_compile(phases: Phases, took: float, d: dict[str, float]) -> None:
    """A first call that compiled (or found its graph in Inductor's caches): its seconds by
    torch's timers, d (their deltas over the call)."""
    frame, backend, guards = d.get(DYNAMO_FRAME, 0.0), d.get(BACKEND, 0.0), d.get(GUARDS, 0.0)
    built, loaded = d.get(COMPILE_FILE, 0.0), d.get(CACHE_LOAD, 0.0)
    phases.add("dynamo_trace", frame - backend - guards)
    phases.add("dynamo_guards", guards)
    if loaded:  # a cache hit: the key and lookup, then the graph's code loaded, builds in it
        built = min(built, loaded)  # one after the other here (a header), in this thread
        phases.add("inductor_cache_lookup", backend - loaded)
        phases.add("inductor_cache_load", loaded - built)
        phases.add("cpp_build", built)
    else:  # AOTAutograd and Inductor compiling: lowering, autotuning, code generation and the
        # C++ builds, some in parallel (their sum, cpp_build_s, is not wall time)
        phases.add("inductor_compile", backend)
    phases.add("first_run", took - frame)  # the compiled code's run, and the call around it


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


def precompile_fn(model: torch.nn.Module, x: torch.Tensor, compile_mode: str | None) -> Any:
    """forward, AOT-precompiled for (model, x): Dynamo's fullgraph capture and the backend's
    compile now, guards and all, in an object save_compiled_function() writes."""
    with torch._dynamo.config.patch(enable_aot_compile=True):
        compiled: Any = torch.compile(forward, fullgraph=True, mode=compile_mode)
        if not hasattr(compiled, "aot_compile"):
            raise Unsupported(f"torch {torch.__version__}: torch.compile(...) has no aot_compile")
        return compiled.aot_compile(((model, x), {}))


def save_precompiled(aot: Any, path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    aot.save_compiled_function(str(tmp))
    tmp.replace(path)
    return path.stat().st_size


def headers_off_keeps_kernels() -> bool:
    """Whether turning Inductor's header precompiling off leaves its C++ kernels' build
    command, hence their cache keys, as they are (torch 2.11: the header joins the command only
    after the key is made; torch 2.15 adds a macro for it, where off would rebuild every
    kernel). Read from Inductor's own command line, built both ways; False where that fails."""
    try:
        from torch._inductor import config
        from torch._inductor.codecache import CppPythonBindingsCodeCache
        from torch._inductor.cpp_builder import CppBuilder, CppTorchDeviceOptions
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        def line(on: bool) -> str:
            with config.patch(cpp_cache_precompile_headers=on):
                options = CppTorchDeviceOptions(
                    **CppPythonBindingsCodeCache.cpp_compile_command_flags,
                    device_type="cpu", extra_flags=(), use_relative_path=False,
                    vec_isa=pick_vec_isa(),
                )  # fmt: skip
                return str(
                    CppBuilder(name="o", sources="i", BuildOption=options).get_command_line()
                )

        return line(True) == line(False)
    except Exception as e:
        log(f"precompiled: header precompiling stays on ({type(e).__name__}: {e})")
        return False


def load_precompiled(
    path: Path,
    model: torch.nn.Module,
    x: torch.Tensor,
    info: dict[str, Any],
    phases: Phases,
    device: str = "cpu",
) -> tuple[Callable[..., Any], torch.Tensor] | None:
    """The forward precompiled at path, loaded (torch.compiler.load_compiled_function), and its
    first answer; None, said on stderr and in info, when it cannot be used (the caller then
    compiles as without it)."""
    if getattr(torch.compiler, "load_compiled_function", None) is None:
        info["precompiled"] = f"not loaded: torch {torch.__version__} has no load_compiled_function"
        return None
    # Every C++ kernel the loaded code asks for is built already, in Inductor's cache dir (the
    # bundle): Inductor would still precompile their header first (into $TMPDIR, seconds per
    # process) for builds that do not happen. Off, where that leaves the kernels' keys alone;
    # a kernel missing from the cache is then built all the same, without the header.
    t = time.perf_counter()
    headers_off = device == "cpu" and headers_off_keeps_kernels()
    info["precompiled_headers"] = "off for the load" if headers_off else "on"
    phases.add("precompiled_header_check", time.perf_counter() - t)
    switch = {"cpp_cache_precompile_headers": False} if headers_off else {}
    started = time.perf_counter()
    before = compile_metrics()
    try:
        with torch._inductor.config.patch(switch):
            with path.open("rb") as f:
                fn: Callable[..., Any] = torch.compiler.load_compiled_function(f)
            loaded = time.perf_counter()
            mid = compile_metrics()
            y: torch.Tensor = fn(model, x)  # guards checked: a RuntimeError where one fails
            sync()
    except Exception as e:  # another torch's artifact, a guard that fails, a broken file
        log(f"precompiled: could not use {path} ({type(e).__name__}: {e}); compiling instead")
        info["precompiled"] = "load failed"
        info["precompiled_load_error"] = f"{type(e).__name__}: {e}"[:500]
        phases.add("precompiled_load_failed", time.perf_counter() - started)
        return None
    answered = time.perf_counter()
    d_load, d_call = (
        {k: mid.get(k, 0.0) - before.get(k, 0.0) for k in mid},
        since(mid),
    )
    # C++ builds (none, with every kernel in the bundle), at most the wall time they were in
    built_load = min(d_load.get(COMPILE_FILE, 0.0), loaded - started)
    built_call = min(d_call.get(COMPILE_FILE, 0.0), answered - loaded)
    phases.add("precompiled_load", loaded - started - built_load)
    phases.add("cpp_build", built_load + built_call)
    phases.add("first_run", answered - loaded - built_call)
    info.update(precompiled="loaded", precompiled_load_s=round(loaded - started, 4))
    return lambda x: fn(model, x), y


def aot_model(
    model: torch.nn.Module, x: torch.Tensor, info: dict[str, Any], phases: Phases, device: str
) -> tuple[Callable[..., Any], torch.Tensor]:
    """Load the AOT-precompiled forward from $TUNEFLEET_AOT_DIR, or compile and save it; with
    its first answer."""
    load = getattr(torch.compiler, "load_compiled_function", None)
    if load is None or not hasattr(torch._dynamo.config, "enable_aot_compile"):
        raise Unsupported(f"torch {torch.__version__} has no AOT precompile API")
    path = Path(os.environ.get("TUNEFLEET_AOT_DIR") or "/tmp/tunefleet-aot") / AOT_FILE
    info["aot_path"] = str(path)
    if path.is_file():
        got = load_precompiled(path, model, x, info, phases, device)
        if got is not None:
            info.update(aot="loaded", aot_load_s=info["precompiled_load_s"])
            return got
        info["aot"] = f"load failed: {info['precompiled_load_error'].split(':', 1)[0]}"
    started = time.perf_counter()
    aot: Any = None
    for compile_mode in ("max-autotune", None):
        try:
            aot = precompile_fn(model, x, compile_mode)
            break
        except Unsupported:
            raise
        except Exception as e:
            if compile_mode is None:
                raise
            log(f"aot: max-autotune failed ({type(e).__name__}: {e}); default mode instead")
            info["fallback"] = f"{type(e).__name__}: {e}"[:500]
            torch._dynamo.reset()
    info["compile_mode"] = compile_mode or "default"
    compiled = time.perf_counter()
    info["aot_compile_s"] = round(compiled - started, 4)
    info["aot_bytes"] = save_precompiled(aot, path)
    saved = time.perf_counter()
    info.setdefault("aot", "compiled and saved")
    y: torch.Tensor = aot(model, x)
    sync()
    phases.add("aot_compile", compiled - started)  # Dynamo, AOTAutograd, Inductor, C++ builds
    phases.add("aot_save", saved - compiled)
    phases.add("first_run", time.perf_counter() - saved)
    return lambda x: aot(model, x), y


def precompiled_path(mode: str, device: str) -> Path | None:
    """Where --precompile keeps the compiled forward: in Inductor's cache dir as the pod was
    given it (tunefleet packs it, and unpacks it into a pod with the bundle); None without."""
    root = CACHE_ENV["TORCHINDUCTOR_CACHE_DIR"]
    return Path(root) / PRECOMPILED_DIR / f"{mode}-{device}.bin" if root else None


def precompile_after(
    path: Path,
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    compile_mode: str | None,
    info: dict[str, Any],
) -> None:
    """After the answer (no figure includes it): precompile the forward the run compiled (its
    graph's code comes from the caches the compile just filled) and save it at path, where
    its output is bit for bit the first answer's; else say why not."""
    started = time.perf_counter()
    try:
        aot = precompile_fn(model, x, compile_mode)
        got = aot(model, x)
        if digest(got) != digest(y):
            log(f"precompiled: not saved, its output differs from the first answer ({path})")
            info["precompiled"] = "not saved: its output differs from the first answer"
            return
        size = save_precompiled(aot, path)
    except Exception as e:  # never fatal: the run answered; the next one compiles, as before
        log(f"precompiled: not saved ({type(e).__name__}: {e})")
        info["precompiled"] = f"not saved: {type(e).__name__}: {e}"[:500]
        return
    info.update(
        precompiled="saved",
        precompiled_save_s=round(time.perf_counter() - started, 4),
        precompiled_bytes=size,
    )


def digest(t: torch.Tensor) -> str:
    out = t.detach().to("cpu").clone().contiguous()  # a storage of exactly its elements
    return hashlib.sha256(bytes(out.untyped_storage())).hexdigest()


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


def run(
    mode: str,
    iterations: int,
    mega_cache: Path | None,
    device: str = "cpu",
    precompile: bool = False,
) -> dict[str, Any]:
    phases = Phases()
    phases.add("start", IMPORTED_AT - T0)  # before this script ran (0 without $TUNEFLEET_T0)
    phases.add("torch_import", TORCH_IMPORTED_AT - IMPORTED_AT)
    t = time.perf_counter()
    threads = max(1, min(4, os.cpu_count() or 1))
    torch.set_num_threads(threads)
    model = build_model().to(device)
    x = request().to(device)
    phases.add("model_build", time.perf_counter() - t)
    info: dict[str, Any] = {}
    if mode != "eager":
        t = time.perf_counter()
        import_compiler()
        phases.add("compiler_import", time.perf_counter() - t)
    mega_loaded = False
    if mega_cache is not None:
        t = time.perf_counter()
        mega_loaded = load_mega_cache(mega_cache, info)
        phases.add("mega_cache_load", time.perf_counter() - t)
    wants = precompile and mode in ("compiled", "default")
    path = precompiled_path(mode, device) if wants else None
    if path is not None:
        info["precompiled_path"] = str(path)
    compile_mode = "max-autotune" if mode == "compiled" else None
    with torch.no_grad():
        if mode != "eager" and device == "cpu":
            info["isa_probe_s"] = isa_probe(phases)
        started = time.time()
        got = None
        if mode == "eager":
            fn: Callable[..., Any] = model
            y = fn(x)
            phases.add("first_run", time.time() - started)
        elif mode == "aot":
            fn, y = aot_model(model, x, info, phases, device)
        else:
            if path is not None and path.is_file():
                got = load_precompiled(path, model, x, info, phases, device)
            if got is not None:
                fn, y = got
                info["compile_mode"] = "precompiled"
            else:
                fn, y, compile_mode = compile_first(model, x, compile_mode, info, phases)
        sync()
        answered = time.time()
        first = answered - started
        steady = []
        for _ in range(iterations):
            t = time.perf_counter()
            fn(x)
            sync()
            steady.append((time.perf_counter() - t) * 1000)
        found = counters()  # the first answer's and the steady calls', not what follows
        if mode != "eager":  # every C++ build so far, summed over threads (not wall time)
            info["cpp_build_s"] = round(compile_metrics().get(COMPILE_FILE, 0.0), 4)
        if path is not None and got is None:
            if found.get("fxgraph_cache_hit", 0) == 0:  # it compiled: a tuning run
                precompile_after(path, model, x, y, compile_mode, info)
            else:  # its graph came from the bundle's FX graph cache: nothing new to keep
                info.setdefault("precompiled", "not saved: the graph came from Inductor's cache")
    if mega_cache is not None and not mega_loaded and mode != "eager":
        save_mega_cache(mega_cache, info)
    out = y.detach().to("cpu").clone().contiguous()  # a storage of exactly its elements
    total = answered - T0
    return {
        "mode": mode,
        **info,
        "torch": torch.__version__,
        "threads": threads,
        "torch_import_s": round(TORCH_IMPORTED_AT - IMPORTED_AT, 4),
        "first_call_s": round(first, 4),
        "process_to_first_s": round(total, 4),
        "breakdown": phases.breakdown(total),
        "answered_at": round(answered, 4),
        "steady_median_ms": round(statistics.median(steady), 4) if steady else None,
        "iterations": iterations,
        "counters": found,
        "caches": CACHE_ENV,
        "output_sha256": digest(out),
        "output_head": [float(v) for v in out.flatten()[:4].tolist()],
        "output_sum": float(out.double().sum()),
    }


def compile_first(
    model: torch.nn.Module,
    x: torch.Tensor,
    compile_mode: str | None,
    info: dict[str, Any],
    phases: Phases,
) -> tuple[Callable[..., Any], torch.Tensor, str | None]:
    """torch.compile the model and answer the first request (Dynamo traces; Inductor compiles,
    or loads the graph's code from its caches): the function, the answer, the mode it took."""
    started = time.perf_counter()
    before = compile_metrics()
    fn: Callable[..., Any] = torch.compile(model, mode=compile_mode)
    try:
        y = fn(x)
    except Exception as e:
        if compile_mode is None:
            raise
        log(f"max-autotune failed ({type(e).__name__}: {e}); default mode instead")
        info["fallback"] = f"{type(e).__name__}: {e}"[:500]
        phases.add("max_autotune_failed", time.perf_counter() - started)
        torch._dynamo.reset()
        started = time.perf_counter()
        before = compile_metrics()
        compile_mode = None
        fn = torch.compile(model)
        y = fn(x)
    sync()
    name_compile(phases, time.perf_counter() - started, since(before))
    info["compile_mode"] = compile_mode or "default"
    return fn, y, compile_mode


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
        "--precompile", action="store_true",
        help="compiled/default: load the forward precompiled in $TORCHINDUCTOR_CACHE_DIR, or "
        "precompile it there after answering",
    )  # fmt: skip
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu",
        help="cuda (ROCm too): Inductor generates Triton kernels, kept in TRITON_CACHE_DIR",
    )  # fmt: skip
    args = p.parse_args(argv)
    try:
        result = run(
            args.mode, max(0, args.iterations), args.mega_cache, args.device, args.precompile
        )
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
