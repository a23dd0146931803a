"""The real TunableOp path, end to end, on a machine with a ROCm or CUDA GPU and torch.

Nothing is downloaded and nothing is stubbed:

1. `python -m tuner_job run` records a transformer-shaped workload (a small Llama built from a
   config in code with random weights, or a pure-torch decoder when transformers is absent),
   tunes the recorded GEMMs on this GPU and writes results.csv + manifest.json;
2. `python -m tunefleet.artifacts.publish` stores them in a directory store (file://; no S3
   server or boto3 needed) and `python -m tunefleet.artifacts.fetch` fetches and verifies them;
3. the same workload then runs in fresh processes with TunableOp (a) off, (b) tuning online,
   (c) loading the fetched offline results, several times each, interleaved, timing the first
   iteration and the steady state;
4. one more offline run logs every TunableOp lookup (PYTORCH_TUNABLEOP_VERBOSE=3), to check that
   the loaded results were used, not just loaded;
5. the tests marked gpu (tests/gpu) run.

Everything runs under one deadline (--deadline-seconds; scripts/gpu-check.sh gives 435 s inside
its own 450 s): every step gets what is left, a step that overruns is stopped (its process group
interrupted, then killed), and the table of what was measured so far is printed at the end
whatever happened. Exits non-zero if any step or check failed.

    python3 scripts/gpu_check.py [--deadline-seconds 435] [--budget-seconds 120] [--iters 12]
                                 [--repeats 3] [--keep]

Figures: medians, with min..max (first iteration: one sample per process) or p25..p75 and
min..max (steady state: pooled over processes). The tuning loop is timed apart from the tuning
process's start-up (tuner_job logs both).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()
if str(REPO) not in sys.path:  # tuner_job's CSV parser, also when run without gpu-check.sh
    sys.path.insert(0, str(REPO))

# Small enough to record, tune and time in a few minutes; shaped like a decoder LLM.
MODEL = {
    "vocab_size": 32000,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
}
PREFILL = (2, 256)  # batch, tokens
DECODE = (8, 1)
TUNING = {
    "maxDurationMs": 5,
    "maxIterations": 10,
    "warmupDurationMs": 0,
    "warmupIterations": 0,
    "rotatingBufferMB": -1,  # the L2 cache size: torch's default, and tunefleet's
    "numericalCheck": False,
    "cublasltAlgoCount": 8,  # torch 2.14+ on CUDA (torch's default); ignored before
}
TUNABLEOP_LIMIT_ENV = {  # the same limits for online tuning, so (b) and (c) compare like with like
    "PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS": str(TUNING["maxDurationMs"]),
    "PYTORCH_TUNABLEOP_MAX_TUNING_ITERATIONS": str(TUNING["maxIterations"]),
    "PYTORCH_TUNABLEOP_ROTATING_BUFFER_SIZE": str(TUNING["rotatingBufferMB"]),
    "PYTORCH_TUNABLEOP_CUBLASLT_REQUESTED_ALGO_COUNT": str(TUNING["cublasltAlgoCount"]),
}
MODES = ("off", "online", "offline")
LABELS = {
    "off": "(a) TunableOp off",
    "online": "(b) online tuning",
    "offline": "(c) offline results",
}
SKIP_ITERATIONS = 2  # iterations 0 and 1 pay for lazy initialisation (and online tuning)


def say(msg: str) -> None:
    print(f"gpu-check: {msg}", flush=True)


# --- the workload (runs in its own process) -------------------------------------------------


class MatmulWorkload:
    """GPU_CHECK_WORKLOAD=matmul: the GEMMs of one decoder layer by torch.nn.functional.linear
    and torch.bmm only, so that this script can be dry-run on a machine without a GPU, with the
    stand-in torch of the unit tests (which says what it is in every figure it leads to)."""

    def __init__(self, torch: Any) -> None:
        h, f = MODEL["hidden_size"], MODEL["intermediate_size"]
        mk = {"device": "cuda", "dtype": torch.bfloat16}
        self.torch = torch
        self.qkv, self.o = torch.rand(3 * h, h, **mk), torch.rand(h, h, **mk)
        self.up, self.down, self.bias = torch.rand(f, h, **mk), torch.rand(h, f, **mk), None
        self.bias = torch.rand(f, **mk)

    def __call__(self, ids: Any, use_cache: bool = False) -> Any:
        t, linear = self.torch, self.torch.nn.functional.linear
        batch, tokens = ids.shape
        h, heads = MODEL["hidden_size"], MODEL["num_attention_heads"]
        x = t.rand(batch * tokens, h, device="cuda", dtype=t.bfloat16)
        linear(x, self.qkv)
        q = t.rand(batch * heads, tokens, h // heads, device="cuda", dtype=t.bfloat16)
        t.bmm(q, q.transpose(1, 2))
        linear(x, self.o)
        linear(linear(x, self.up, self.bias), self.down)
        return x


def build_model(torch: Any) -> tuple[Any, str]:
    torch.manual_seed(0)
    if os.environ.get("GPU_CHECK_WORKLOAD") == "matmul":
        return MatmulWorkload(torch), (
            f"matmul-only workload (GPU_CHECK_WORKLOAD=matmul) under torch {torch.__version__}"
        )
    why = "transformers not installed"
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(**MODEL, max_position_embeddings=1024)
        # Eager attention computes QK^T and PV with bmm, so strided-batched GEMMs go through
        # TunableOp as well as the projections' plain GEMMs.
        with contextlib.suppress(Exception):
            cfg._attn_implementation = "eager"
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
        model = model.to(torch.bfloat16).eval()
        attn = getattr(model.config, "_attn_implementation", "default")
        kind = (
            f"transformers {transformers.__version__} LlamaForCausalLM from a config in code "
            f"({MODEL['num_hidden_layers']} layers, hidden {MODEL['hidden_size']}, "
            f"{attn} attention, random weights, nothing downloaded)"
        )
        return model, kind
    except ImportError:
        pass
    except Exception as exc:  # an API change in transformers: say so, use the torch model
        why = f"transformers failed: {type(exc).__name__}: {exc}"
        print(f"gpu-check: {why}; using the pure-torch decoder", file=sys.stderr)
    nn = torch.nn
    layer = nn.TransformerEncoderLayer(
        MODEL["hidden_size"],
        MODEL["num_attention_heads"],
        MODEL["intermediate_size"],
        batch_first=True,
        device="cuda",
        dtype=torch.bfloat16,
    )

    class Decoder(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(
                MODEL["vocab_size"], MODEL["hidden_size"], device="cuda", dtype=torch.bfloat16
            )
            self.body = nn.TransformerEncoder(
                layer, MODEL["num_hidden_layers"], enable_nested_tensor=False
            )
            self.head = nn.Linear(
                MODEL["hidden_size"],
                MODEL["vocab_size"],
                bias=False,
                device="cuda",
                dtype=torch.bfloat16,
            )

        def forward(self, input_ids: Any, use_cache: bool = False) -> Any:
            return self.head(self.body(self.embed(input_ids)))

    kind = (
        f"pure-torch decoder ({MODEL['num_hidden_layers']} layers, hidden "
        f"{MODEL['hidden_size']}, random weights; {why})"
    )
    return Decoder().eval(), kind


def workload(args: argparse.Namespace) -> int:
    import torch

    model, kind = build_model(torch)
    gen = torch.Generator(device="cuda").manual_seed(1)
    prefill = torch.randint(0, MODEL["vocab_size"], PREFILL, device="cuda", generator=gen)
    decode = torch.randint(0, MODEL["vocab_size"], DECODE, device="cuda", generator=gen)
    torch.cuda.synchronize()
    times = []
    with torch.inference_mode():
        for _ in range(args.iters):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(prefill, use_cache=False)
            model(decode, use_cache=False)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1000)
    tunable = torch.cuda.tunable
    report = {
        "mode": args.mode,
        "model": kind,
        "iterations_ms": times,
        "first_ms": times[0],
        # Iterations 0 and 1 pay for lazy initialisation (and online tuning); skip both.
        "steady_ms": statistics.median(times[2:]) if len(times) > 2 else times[-1],
        "tunableop_enabled": bool(tunable.is_enabled()),
        "tuning_enabled": bool(tunable.tuning_is_enabled()),
        "results_in_memory": len(tunable.get_results()) if tunable.is_enabled() else 0,
        "validators": {str(k): str(v) for k, v in tunable.get_validators()},
        "filename": tunable.get_filename() if tunable.is_enabled() else "",
    }
    if args.report:
        Path(args.report).write_text(json.dumps(report))
    return 0


# --- pure helpers (unit-tested in tests/unit/test_tuner_gpu_check.py) ----------------------


class Clock:
    """One deadline for the whole check; each step gets at most what is left."""

    def __init__(self, seconds: float, now: float | None = None) -> None:
        self.start = time.monotonic() if now is None else now
        self.end = self.start + seconds

    def left(self, now: float | None = None) -> float:
        return self.end - (time.monotonic() if now is None else now)

    def cap(self, want: float, reserve: float = 0.0, now: float | None = None) -> float:
        """Seconds a step may take: what it wants, within what is left after ``reserve``."""
        return max(0.0, min(want, self.left(now) - reserve))


@dataclass(frozen=True)
class Spread:
    n: int
    median: float
    low: float  # min, or p25 with quartiles=True
    high: float  # max, or p75
    lo: float  # min
    hi: float  # max

    def text(self, digits: int, quartiles: bool) -> str:
        f = f"{{:.{digits}f}}"
        if self.n == 1:
            return f"{f.format(self.median)} (one sample)"
        inner = f"[{f.format(self.low)}..{f.format(self.high)}]"
        if quartiles:
            return f"{f.format(self.median)} {inner} ({f.format(self.lo)}..{f.format(self.hi)})"
        return f"{f.format(self.median)} {inner}"


def spread(values: Sequence[float], quartiles: bool = False) -> Spread | None:
    """Median with min..max, or with the interquartile range (p25..p75) and min..max."""
    if not values:
        return None
    vals = sorted(values)
    lo, hi = vals[0], vals[-1]
    if quartiles and len(vals) >= 2:
        q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
        return Spread(len(vals), statistics.median(vals), q1, q3, lo, hi)
    return Spread(len(vals), statistics.median(vals), lo, hi, lo, hi)


# Tunable.cpp, TuningResultsManager::Lookup, logged at PYTORCH_TUNABLEOP_VERBOSE >= 3:
#   "ResultEntry found for <op>,<params>"
#   "missing op_signature, returning null ResultEntry for <op>,<params>"
#   "missing params_signature, returning null ResultEntry for <op>,<params>"
_FOUND_RE = re.compile(r"ResultEntry found for (\S+?),(\S+)\s*$")
_MISS_RE = re.compile(
    r"missing (?:op|params)_signature, returning null ResultEntry for (\S+?),(\S+)\s*$"
)


def parse_lookups(
    text: str,
) -> tuple[collections.Counter[tuple[str, str]], collections.Counter[tuple[str, str]]]:
    """(hits, misses) per (op, params) from TunableOp's verbose log."""
    hits: collections.Counter[tuple[str, str]] = collections.Counter()
    misses: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in text.splitlines():
        m = _FOUND_RE.search(line)
        if m:
            hits[(m.group(1), m.group(2))] += 1
            continue
        m = _MISS_RE.search(line)
        if m:
            misses[(m.group(1), m.group(2))] += 1
    return hits, misses


_RECORDED_RE = re.compile(r"recorded (\d+) unique GEMM\(s\) in \d+ file\(s\) in ([\d.]+)s")
_LOOP_RE = re.compile(r"tuning loop: ([\d.]+)s of the tuning process's ([\d.]+)s")


def parse_tuner_log(stderr: str) -> dict[str, float]:
    """What tuner_job run says about its own timing (stderr)."""
    out: dict[str, float] = {}
    m = _RECORDED_RE.search(stderr)
    if m:
        out["record_s"] = float(m.group(2))
    m = _LOOP_RE.search(stderr)
    if m:
        out["loop_s"], out["tuning_process_s"] = float(m.group(1)), float(m.group(2))
    return out


def torch_release(version: str) -> tuple[int, int]:
    m = re.match(r"^(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def outcome_lines(
    outcomes: dict[str, int] | None, probe: dict[str, Any] | None = None
) -> list[str]:
    """How the tuned rows came out, and what that means for the comparison."""
    if not outcomes:
        return ["tuned rows: outcome unknown (the manifest has no outcomes)"]
    tuned, default = int(outcomes.get("tuned", 0)), int(outcomes.get("default", 0))
    lines = [f"tuned rows: {default} Default, {tuned} other (a solution other than Default won)"]
    probe = probe or {}
    cuda_with_lt = not probe.get("hip") and torch_release(str(probe.get("torch", ""))) >= (2, 14)
    if tuned == 0:
        why = (
            "no cuBLASLt algorithm beat Default within the limits"
            if cuda_with_lt
            else "CUDA builds of torch before 2.14 have no other candidate"
        )
        lines += [
            f"  => no GEMM got a solution other than Default ({why}):",
            "     the offline-vs-off difference measures TunableOp's own overhead (its per-GEMM",
            "     lookup) only, not a gain from tuning",
        ]
    return lines


def lookup_checks(
    hits: collections.Counter[tuple[str, str]],
    misses: collections.Counter[tuple[str, str]],
    tuned: set[tuple[str, str]],
    recorded: set[tuple[str, str]],
) -> tuple[list[str], list[str]]:
    """(failures, notes) about whether the loaded results were used."""
    failures: list[str] = []
    notes: list[str] = []
    missed_tuned = sorted(k for k in misses if k in tuned)
    if missed_tuned:
        failures.append(
            f"{len(missed_tuned)} tuned GEMM(s) were looked up and missed: loaded, not used "
            f"(first: {','.join(missed_tuned[0])})"
        )
    if tuned and not hits:
        failures.append("no TunableOp lookup hit the loaded results")
    unhit = sorted(tuned - set(hits))
    if unhit:
        notes.append(f"{len(unhit)} tuned GEMM(s) were never looked up by the workload")
    skipped = sorted(k for k in misses if k in recorded and k not in tuned)
    if skipped:
        notes.append(
            f"{len(skipped)} recorded GEMM(s) were not tuned (torch's offline tuner skips some, "
            "e.g. size-1 dimensions) and ran untuned"
        )
    unknown = sorted(k for k in misses if k not in recorded)
    if unknown:
        notes.append(
            f"{len(unknown)} GEMM(s) missed that recording never saw "
            f"(first: {','.join(unknown[0])})"
        )
    return failures, notes


# --- running steps under the deadline ---------------------------------------------------------


class Failed(Exception):
    pass


class Skipped(Exception):
    pass


def run(
    cmd: list[str], env: dict[str, str], timeout: float, what: str, min_s: float = 5.0
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run a step in its own process group; past ``timeout``, interrupt the group, then kill it
    (the tuner stops its own tuning process on an interrupt)."""
    if timeout < min_s:
        raise Skipped(f"{what}: skipped, the deadline leaves {timeout:.0f}s")
    say(f"{what} (at most {timeout:.0f}s): {' '.join(cmd)}")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGINT, 10.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        raise Failed(f"{what} did not finish within {timeout:.0f}s (stopped)") from None
    seconds = time.perf_counter() - t0
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if done.returncode != 0:
        tail = "\n".join((out + err).strip().splitlines()[-25:])
        raise Failed(f"{what} exited {done.returncode}:\n{tail}")
    return done, seconds


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTORCH_TUNABLEOP_")}
    ours = [str(REPO), str(REPO / "operator")]
    theirs = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ours]
    env["PYTHONPATH"] = os.pathsep.join([*ours, *theirs])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def label_value(name: str) -> str:
    """A GPU model label value as the node labellers write them (e.g. NVIDIA-H200)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:63]


PROBE = """
import json, torch
ok = torch.cuda.is_available()
print(json.dumps({
    "torch": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
    "gpu": ok, "count": torch.cuda.device_count() if ok else 0,
    "name": torch.cuda.get_device_name(0) if ok else "",
}))
"""


@dataclass
class Report:
    """Everything measured so far; printed at the end whatever happened."""

    probe: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    runs: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {mode: [] for mode in MODES}
    )
    lookups: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # steps the deadline left no time for


def keys_in(paths: Sequence[Path]) -> set[tuple[str, str]]:
    from tuner_job.results import read_untuned

    return {r.key for p in paths for r in read_untuned(p).rows}


def check(args: argparse.Namespace) -> int:
    clock = Clock(args.deadline_seconds)
    rep = Report()
    env = base_env()
    work = Path(tempfile.mkdtemp(prefix="tunefleet-gpucheck-"))
    say(f"working in {work}; deadline {args.deadline_seconds:.0f}s")
    try:
        _steps(args, clock, rep, env, work)
    except Failed as exc:
        rep.failures.append(str(exc))
    except Skipped as exc:
        rep.skipped.append(str(exc))
    except Exception as exc:  # a bug here must not lose the table either
        rep.failures.append(f"gpu-check itself failed: {type(exc).__name__}: {exc}")
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print_table(args, clock, rep)
    return 1 if rep.failures or rep.skipped or not rep.probe.get("gpu") else 0


def _steps(
    args: argparse.Namespace, clock: Clock, rep: Report, env: dict[str, str], work: Path
) -> None:
    # 0. torch and the GPU, in a child: a hang there must not take this process with it
    done, _ = run([sys.executable, "-c", PROBE], env, clock.cap(120, 20), "probe torch and GPU")
    rep.probe = json.loads(done.stdout.strip().splitlines()[-1])
    if not rep.probe["gpu"]:
        raise Failed(f"torch {rep.probe['torch']} sees no ROCm or CUDA GPU; nothing to check")
    model_label = label_value(rep.probe["name"])

    # 1. record + tune + identify, through the tuner CLI the tuning Job runs. Its budget leaves
    # room for the timing runs and the GPU tests after it.
    budget = min(args.budget_seconds, max(30.0, 0.35 * clock.left()))
    config = {
        "namespace": "gpu-check",
        "profile": "transformer",
        "gpuModel": model_label,
        "revision": "gpucheck",
        "gpus": 1,
        "workload": {
            "command": [sys.executable, str(THIS), "workload", "--mode", "record", "--iters", "2"]
        },
        "tuning": {**TUNING, "budgetSeconds": budget},
        # What the artifact buys, measured as the tuning Job measures it (tuner_job/measure.py).
        "promotion": {"measure": True, "servingMode": "Eager", "budgetSeconds": 120},
    }
    (work / "config.json").write_text(json.dumps(config))
    out = work / "out"
    cmd = [
        sys.executable, "-m", "tuner_job", "--termination-log", str(work / "termination-log"),
        "run", "--config", str(work / "config.json"), "--out", str(out),
        "--work", str(work / "tuner"),
    ]  # fmt: skip
    done, rep.facts["tuner_s"] = run(
        cmd, env, clock.cap(budget + 120, 60), "record + tune (tuner_job run)"
    )
    sys.stdout.write(done.stderr[-4000:])
    rep.facts.update(parse_tuner_log(done.stderr))
    manifest = json.loads((out / "manifest.json").read_text())
    say(f"manifest: {json.dumps(manifest, sort_keys=True)}")
    rep.facts.update(
        recorded=manifest["recorded"],
        tuned=manifest["gemms"],
        outcomes=manifest.get("outcomes"),
        tuning_s=manifest["tuningSeconds"],
        identity=manifest["identity"],
        validators=manifest["validators"],
        gain=manifest.get("gain"),
    )
    from tuner_job.results import read_results

    tuned_keys = read_results(out / "results.csv").keys()
    recorded_keys = keys_in(sorted((work / "tuner").glob("record-*/*_untuned*.csv")))
    rep.facts["tuned_keys"], rep.facts["recorded_keys"] = tuned_keys, recorded_keys
    if not tuned_keys <= recorded_keys:
        extra = sorted(tuned_keys - recorded_keys)
        rep.failures.append(
            f"{len(extra)} tuned GEMM(s) were never recorded (first: {','.join(extra[0])}): "
            "the results would not match the workload"
        )
    if not tuned_keys:
        rep.failures.append("nothing was tuned")

    # 2. publish to a directory store, then fetch and verify, with the real CLIs
    store = work / "store"
    cmd = [
        sys.executable, "-m", "tunefleet.artifacts.publish", "--dir", str(out),
        "--uri", f"file://{store}",
        "--namespace", "gpu-check", "--profile", "transformer", "--gpu-model", model_label,
        "--termination-log", str(work / "publish-termination-log"),
    ]  # fmt: skip
    done, rep.facts["publish_s"] = run(cmd, env, clock.cap(90, 40), "publish (file:// store)")
    message = json.loads(done.stdout)
    fetched = work / "fetched"
    cmd = [
        sys.executable, "-m", "tunefleet.artifacts.fetch", "--uri", message["uri"], "--sha256",
        message["sha256"], "--dest", str(fetched), "--devices", "1", "--gpu-model", model_label,
        "--fail-closed",
    ]  # fmt: skip
    done, rep.facts["fetch_s"] = run(cmd, env, clock.cap(90, 40), "fetch + verify")
    say(done.stdout.strip())

    # 3. time the workload three ways, each in fresh processes, interleaved so drift is shared
    (work / "online").mkdir()
    mode_env = {
        "off": {**env, "PYTORCH_TUNABLEOP_ENABLED": "0"},
        "online": {
            **env,
            **TUNABLEOP_LIMIT_ENV,
            "PYTORCH_TUNABLEOP_ENABLED": "1",
            "PYTORCH_TUNABLEOP_TUNING": "1",
            "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
        },
        "offline": {
            **env,
            "PYTORCH_TUNABLEOP_ENABLED": "1",
            "PYTORCH_TUNABLEOP_TUNING": "0",
            "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
            "PYTORCH_TUNABLEOP_FILENAME": str(fetched / "tunableop_results%d.csv"),
        },
    }
    for i in range(args.repeats):
        for mode in MODES:
            run_env = dict(mode_env[mode])
            if mode == "online":  # a fresh results file each time: torch appends
                run_env["PYTORCH_TUNABLEOP_FILENAME"] = str(work / "online" / f"r{i}_%d.csv")
            try:
                rep.runs[mode].append(
                    timing_run(
                        mode, run_env, work, args.timed_iters, clock.cap(180, 110), f"#{i + 1}"
                    )
                )
            except Skipped as exc:
                rep.skipped.append(str(exc))
                break
        else:
            continue
        break
    offline = rep.runs["offline"]
    if offline:
        if offline[0]["results_in_memory"] < len(tuned_keys):
            rep.failures.append(
                f"the offline run holds {offline[0]['results_in_memory']} TunableOp results, "
                f"expected the {len(tuned_keys)} fetched ones (validators rejected the file?)"
            )
        if offline[0]["validators"] != rep.facts["validators"]:
            rep.failures.append(
                f"validators differ: manifest {rep.facts['validators']} vs torch "
                f"{offline[0]['validators']}"
            )
    if any(r["tunableop_enabled"] for r in rep.runs["off"]):
        rep.failures.append("TunableOp was enabled in the 'off' run")

    # 4. were the loaded results used? One more offline run logs every lookup (not timed: the
    # logging itself costs time).
    log = work / "tunableop-verbose.log"
    verbose_env = {
        **mode_env["offline"],
        "PYTORCH_TUNABLEOP_VERBOSE": "3",
        "PYTORCH_TUNABLEOP_VERBOSE_FILENAME": str(log),
    }
    try:
        timing_run("offline", verbose_env, work, 3, clock.cap(150, 90), "(lookups logged)")
        hits, misses = parse_lookups(log.read_text(errors="replace") if log.exists() else "")
        rep.lookups = {"hits": sum(hits.values()), "misses": sum(misses.values())}
        failures, notes = lookup_checks(hits, misses, tuned_keys, recorded_keys)
        rep.failures += failures
        rep.notes += notes
    except Skipped as exc:
        rep.skipped.append(str(exc))

    # 4b. production-miss capture, as serving pods would record: results loaded from the file
    # by environment variables, tuning off, record-untuned on. On torch 2.11 and 2.15 the
    # results manager's lazy start reads no results file while recording (a fact of the
    # conformance suite, without a GPU): every GEMM is then recorded, not only the misses.
    capture = work / "capture"
    capture.mkdir()
    capture_env = {
        **mode_env["offline"],
        "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "1",
        "PYTORCH_TUNABLEOP_UNTUNED_FILENAME": str(capture / "untuned.csv"),
    }
    try:
        timing_run("offline", capture_env, work, 2, clock.cap(120, 80), "(record-untuned on)")
        seen = keys_in(sorted(capture.glob("untuned*.csv")))
        also_tuned = len(seen & tuned_keys)
        rep.facts["capture"] = (
            f"{len(seen)} GEMM(s) recorded with results loaded by env, {also_tuned} of them "
            f"tuned ones ({'every GEMM, misses or not' if also_tuned else 'misses only'})"
        )
    except (Skipped, Failed) as exc:
        rep.notes.append(f"record-untuned capture not measured: {exc}")

    # 4c. CAPTURE WITH TUNEFLEET'S HOOK (docs/capture.md; the conformance suite checks the rest
    # without a GPU): the same run with the capture hook first on PYTHONPATH, as the webhook
    # sets up model pods. The hook loads the results at CUDA's initialisation, so the GEMMs the
    # results have are hits, never recorded, and the process holds every fetched result.
    from tunefleet.capture.sidecar import install_hook

    hooked = work / "capture-hook"
    hooked.mkdir()
    hook_dir = work / "hook"
    install_hook(hook_dir)
    hook_env = {
        **capture_env,
        "PYTORCH_TUNABLEOP_UNTUNED_FILENAME": str(hooked / "untuned.csv"),
        "PYTHONPATH": os.pathsep.join([str(hook_dir), env.get("PYTHONPATH", "")]).rstrip(":"),
    }
    try:
        doc = timing_run("offline", hook_env, work, 2, clock.cap(120, 80), "(capture hook)")
        seen = keys_in(sorted(hooked.glob("untuned*.csv")))
        also_tuned = seen & tuned_keys
        rep.facts["capture_hook"] = (
            f"{len(seen)} GEMM(s) recorded with the hook, {len(also_tuned)} of them tuned ones; "
            f"{doc['results_in_memory']} result(s) loaded"
        )
        if also_tuned:
            rep.failures.append(
                f"capture hook: {len(also_tuned)} tuned GEMM(s) were recorded as misses: the "
                "hook did not load the results before the first GEMM"
            )
        if doc["results_in_memory"] < len(tuned_keys):
            rep.failures.append(
                f"capture hook: the process holds {doc['results_in_memory']} results, "
                f"expected the {len(tuned_keys)} fetched ones"
            )
    except (Skipped, Failed) as exc:
        rep.notes.append(f"capture hook not measured: {exc}")

    # 4b. a torchCompile bundle on this GPU (Triton kernels, max-autotune): cold, then with
    # the bundle the tuner packs (tuner_job/caches.py), unpacked at another path as fetch does
    try:
        rep.facts["compile"] = compile_bundle(env, work, clock)
    except (Skipped, Failed) as exc:
        rep.notes.append(f"torch.compile bundle not measured: {exc}")

    # 5. the tests marked gpu, with what is left
    pytest_ok = (
        subprocess.run(
            [sys.executable, "-c", "import pytest"], env=env, capture_output=True
        ).returncode
        == 0
    )
    if pytest_ok:
        # --noconftest: the suite's conftest starts a cluster and needs boto3; these do not.
        cmd = [sys.executable, "-m", "pytest", "--noconftest", "-p", "no:cacheprovider",
               "-m", "gpu", str(REPO / "tests" / "gpu"), "-q", "-rA"]  # fmt: skip
    else:
        cmd = [sys.executable, str(REPO / "tests" / "gpu" / "test_tunableop.py")]
    try:
        done, seconds = run(cmd, env, clock.cap(400, 15), "tests marked gpu (tests/gpu)", 30)
        rep.facts["gpu_tests"] = f"passed in {seconds:.0f}s: " + _last_line(done.stdout)
    except Failed as exc:
        rep.facts["gpu_tests"] = "FAILED"
        rep.failures.append(str(exc))
    except Skipped as exc:
        rep.facts["gpu_tests"] = "skipped (deadline)"
        rep.skipped.append(str(exc))


SERVE = REPO / "examples" / "torch-compile" / "serve.py"


def _serve(env: dict[str, str], clock: Clock, tag: str) -> dict[str, Any]:
    cmd = [sys.executable, str(SERVE), "--mode", "compiled", "--device", "cuda",
           "--iterations", "10"]  # fmt: skip
    done, _ = run(cmd, env, clock.cap(300, 60), f"torch.compile {tag}", 30)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("TUNEFLEET_RESULT "))
    doc: dict[str, Any] = json.loads(line.split(" ", 1)[1])
    return doc


def compile_bundle(env: dict[str, str], work: Path, clock: Clock) -> str:
    """First inference under torch.compile cold and with a bundle, on this GPU."""
    from tuner_job import caches as cc

    spec = cc.spec("torchCompile")
    cold = _serve({**env, **cc.prepare([spec], work / "tuned-caches")}, clock, "cold")
    got = cc.pack(spec, work / "tuned-caches", work / "bundle")
    if isinstance(got, cc.Skipped):
        raise Failed(f"the bundle came out empty: {got.reason}")
    cc.unpack((work / "bundle" / got.payload).read_bytes(), work / "pod-caches" / spec.name)
    warm = _serve({**env, **cc.environment([spec], work / "pod-caches")}, clock, "with the bundle")
    hits = warm["counters"].get("fxgraph_cache_hit", 0)
    same = warm["output_sha256"] == cold["output_sha256"]
    return (
        f"first inference {cold['first_call_s']:.2f}s cold, {warm['first_call_s']:.2f}s with "
        f"the bundle ({got.files} files, {got.size / 2**20:.1f} MiB packed; FX graph cache "
        f"hits {hits}, misses {warm['counters'].get('fxgraph_cache_miss', 0)}); steady "
        f"{cold['steady_median_ms']:.3f} vs {warm['steady_median_ms']:.3f} ms; outputs "
        f"{'identical' if same else 'DIFFER'}"
    )


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def timing_run(
    mode: str, env: dict[str, str], work: Path, iters: int, timeout: float, tag: str
) -> dict[str, Any]:
    report = work / f"timing-{mode}-{time.monotonic_ns()}.json"
    cmd = [
        sys.executable, str(THIS), "workload", "--mode", mode, "--iters", str(iters),
        "--report", str(report),
    ]  # fmt: skip
    _, seconds = run(cmd, env, timeout, f"timing, TunableOp {mode} {tag}", 20)
    doc = dict(json.loads(report.read_text()))
    doc["process_s"] = seconds
    return doc


def gain_lines(f: dict[str, Any]) -> None:
    """The figures the tuner measured (the manifest's gain) and the gate's verdict on them."""
    from tuner_job.gain import Gain, judge

    if "gain" not in f:
        return
    gain = Gain.from_dict(f.get("gain"))
    if gain is None:
        print("gain: not measured")
        return
    for fig in gain.figures:
        print(f"gain: {fig.describe()}; saves {fig.saved_s:.4g}s a run")
    if gain.note:
        print(f"gain: {gain.note}")
    verdict = judge(gain)
    print(f"promotion gate (minGain 0): {'PASS' if verdict.passed else 'FAIL'}: {verdict.message}")


def print_table(args: argparse.Namespace, clock: Clock, rep: Report) -> None:
    p, f = rep.probe, rep.facts
    backend = f"HIP {p.get('hip')}" if p.get("hip") else f"CUDA {p.get('cuda')}"
    elapsed = args.deadline_seconds - clock.left()
    print()
    print(
        f"tunefleet gpu-check: {p.get('name') or 'no GPU'}, torch {p.get('torch', '?')}, "
        f"{backend}; {elapsed:.0f}s of a {args.deadline_seconds:.0f}s deadline"
    )
    first = next((r[0] for r in rep.runs.values() if r), None)
    if first:
        print(f"workload: {first['model']}")
        print(
            f"  one iteration = forward of {PREFILL[0]}x{PREFILL[1]} tokens (prefill) "
            f"+ {DECODE[0]}x{DECODE[1]} (decode)"
        )
    if "tuned" in f:
        lookups = rep.lookups
        used = (
            f"; lookups in an offline run: {lookups['hits']} hit, {lookups['misses']} missed"
            if lookups
            else ""
        )
        print(f"GEMMs recorded: {f['recorded']}, tuned: {f['tuned']}{used}")
        for line in outcome_lines(f.get("outcomes"), p):
            print(line)
        tuning = f.get("tuning_process_s", f.get("tuning_s", 0.0))
        record = f"recording {f['record_s']:.1f}s, " if "record_s" in f else ""
        loop = f", of which the tuning loop {f['loop_s']:.1f}s" if "loop_s" in f else ""
        print(f"tuner_job run {f['tuner_s']:.1f}s: {record}tuning process {tuning:.1f}s{loop}")
        print(
            "  (the rest of the tuning process is its start-up: python, torch import, GPU init; "
            f"limits {TUNING['maxDurationMs']} ms / {TUNING['maxIterations']} iterations per "
            "solution)"
        )
    gain_lines(f)
    if "fetch_s" in f:
        print(
            f"publish to a file:// store {f['publish_s']:.2f}s, fetch + verify "
            f"{f['fetch_s']:.2f}s (CLI processes)"
        )
    if any(rep.runs.values()):
        print()
        w1, w2, w3 = 20, 24, 34
        print(f"{'mode':<{w1}} | {'first iteration ms':<{w2}} | {'steady-state ms':<{w3}} | n")
        print(
            f"{'':<{w1}} | {'median [min..max]':<{w2}} | {'median [p25..p75] (min..max)':<{w3}} |"
        )
        print(f"{'-' * w1}-+-{'-' * w2}-+-{'-' * w3}-+-{'-' * 16}")
        for mode in MODES:
            runs = rep.runs[mode]
            if not runs:
                print(f"{LABELS[mode]:<{w1}} | {'not measured':<{w2}} | {'':<{w3}} |")
                continue
            first_s = spread([r["first_ms"] for r in runs])
            steady = [t for r in runs for t in r["iterations_ms"][SKIP_ITERATIONS:]]
            steady_s = spread(steady, quartiles=True)
            c1 = first_s.text(1, False) if first_s else "-"
            c2 = steady_s.text(2, True) if steady_s else "-"
            print(
                f"{LABELS[mode]:<{w1}} | {c1:<{w2}} | {c2:<{w3}} | "
                f"{len(runs)} proc, {len(steady)} it"
            )
        print(
            f"(first iteration: one per process; steady state: iterations "
            f"{SKIP_ITERATIONS + 1}..{args.timed_iters} of every process, pooled)"
        )
    if "capture" in f:
        print(f"record-untuned with results loaded: {f['capture']}")
    if "compile" in f:
        print(f"torch.compile bundle (examples/torch-compile): {f['compile']}")
    if "gpu_tests" in f:
        print(f"tests/gpu: {f['gpu_tests']}")
    for note in rep.notes:
        print(f"note: {note}")
    print()
    for step in rep.skipped:
        print(f"INCOMPLETE: {step}")
    if rep.failures:
        for failure in rep.failures:
            print(f"FAIL: {failure}")
    elif rep.probe.get("gpu") and not rep.skipped:
        print("OK: recorded, tuned, published, fetched, loaded and used by TunableOp on this GPU")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="cmd")
    w = sub.add_parser("workload", help="run the workload once (used by the check itself)")
    w.add_argument("--mode", required=True)
    w.add_argument("--iters", type=int, default=12)
    w.add_argument("--report")
    parser.add_argument(
        "--deadline-seconds", type=float, default=435.0, help="for everything, table included"
    )
    parser.add_argument("--budget-seconds", type=float, default=120.0, help="tuner budget (max)")
    parser.add_argument(
        "--iters", dest="timed_iters", type=int, default=12, help="timed iterations per process"
    )
    parser.add_argument("--repeats", type=int, default=3, help="processes per mode")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()
    if args.cmd == "workload":
        return workload(args)
    args.timed_iters = max(args.timed_iters, SKIP_ITERATIONS + 1)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
