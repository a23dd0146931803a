"""The real TunableOp path, end to end, on a machine with a ROCm or CUDA GPU and torch.

Nothing is downloaded and nothing is stubbed:

1. `python -m tuner_job run` records a transformer-shaped workload (a small Llama built from a
   config in code with random weights, or a pure-torch decoder when transformers is absent),
   tunes the recorded GEMMs on this GPU and writes results.csv + manifest.json;
2. `python -m tunefleet.artifacts.publish` stores them in a directory store (file://; no S3
   server or boto3 needed) and `python -m tunefleet.artifacts.fetch` fetches and verifies them;
3. the same workload then runs in fresh processes with TunableOp (a) off, (b) tuning online,
   (c) loading the fetched offline results, timing the first iteration and the steady state.

It prints what it ran and a table, and exits non-zero if any step or check failed.

    python3 scripts/gpu_check.py [--budget-seconds 120] [--iters 12] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()

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
    "rotatingBufferMB": 0,
    "numericalCheck": False,
}
TUNABLEOP_LIMIT_ENV = {  # the same limits for online tuning, so (b) and (c) compare like with like
    "PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS": str(TUNING["maxDurationMs"]),
    "PYTORCH_TUNABLEOP_MAX_TUNING_ITERATIONS": str(TUNING["maxIterations"]),
    "PYTORCH_TUNABLEOP_ROTATING_BUFFER_SIZE": "0",
}


def say(msg: str) -> None:
    print(f"gpu-check: {msg}", flush=True)


# --- the workload (runs in its own process) -------------------------------------------------


def build_model(torch: Any) -> tuple[Any, str]:
    torch.manual_seed(0)
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


# --- the check ------------------------------------------------------------------------------


class Failed(Exception):
    pass


def run(
    cmd: list[str], env: dict[str, str], timeout: float, what: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    say(f"{what}: {' '.join(cmd)}")
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failed(f"{what} did not finish within {timeout:.0f}s") from None
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise Failed(f"{what} exited {done.returncode}:\n{tail}")
    return done, seconds


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTORCH_TUNABLEOP_")}
    paths = [
        str(REPO),
        str(REPO / "operator"),
        *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)),
    ]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def label_value(name: str) -> str:
    """A GPU model label value as the node labellers write them (e.g. NVIDIA-H200)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:63]


def timing_run(mode: str, env: dict[str, str], work: Path, iters: int) -> dict[str, Any]:
    report = work / f"timing-{mode}.json"
    cmd = [
        sys.executable,
        str(THIS),
        "workload",
        "--mode",
        mode,
        "--iters",
        str(iters),
        "--report",
        str(report),
    ]
    run(cmd, env, 420, f"timing, TunableOp {mode}")
    return dict(json.loads(report.read_text()))


def check(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError as exc:
        print(f"gpu-check: torch is not importable ({exc}); this check needs torch and a GPU")
        return 2
    if not torch.cuda.is_available():
        print(f"gpu-check: torch {torch.__version__} sees no ROCm or CUDA GPU; nothing to check")
        return 2
    name = torch.cuda.get_device_name(0)
    backend = f"HIP {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
    gpus = torch.cuda.device_count()
    say(f"torch {torch.__version__}, {backend}, {gpus} GPU(s), device 0: {name}")
    model_label = label_value(name)
    work = Path(tempfile.mkdtemp(prefix="tunefleet-gpucheck-"))
    say(f"working in {work}")
    env = base_env()
    failures: list[str] = []
    rows: list[tuple[str, dict[str, Any]]] = []
    facts: dict[str, Any] = {}
    try:
        # 1. record + tune + identify, through the tuner CLI the tuning Job runs
        config = {
            "namespace": "gpu-check",
            "profile": "transformer",
            "gpuModel": model_label,
            "revision": "gpucheck",
            "gpus": 1,
            "workload": {
                "command": [
                    sys.executable,
                    str(THIS),
                    "workload",
                    "--mode",
                    "record",
                    "--iters",
                    "2",
                ]
            },
            "tuning": {**TUNING, "budgetSeconds": args.budget_seconds},
        }
        (work / "config.json").write_text(json.dumps(config))
        out = work / "out"
        cmd = [
            sys.executable, "-m", "tuner_job", "--termination-log", str(work / "termination-log"),
            "run", "--config", str(work / "config.json"), "--out", str(out),
            "--work", str(work / "tuner"),
        ]  # fmt: skip
        done, tuner_s = run(cmd, env, args.budget_seconds + 240, "record + tune (tuner_job run)")
        sys.stdout.write(done.stderr[-4000:])
        manifest = json.loads((out / "manifest.json").read_text())
        facts.update(
            recorded=manifest["recorded"],
            tuned=manifest["gemms"],
            tuning_s=manifest["tuningSeconds"],
            tuner_s=tuner_s,
            identity=manifest["identity"],
            validators=manifest["validators"],
        )
        say(f"manifest: {json.dumps(manifest, sort_keys=True)}")

        # 2. publish to a directory store, then fetch and verify, with the real CLIs
        store = work / "store"
        cmd = [
            sys.executable, "-m", "tunefleet.artifacts.publish", "--dir", str(out),
            "--uri", f"file://{store}",
            "--namespace", "gpu-check", "--profile", "transformer", "--gpu-model", model_label,
            "--termination-log", str(work / "publish-termination-log"),
        ]  # fmt: skip
        done, facts["publish_s"] = run(cmd, env, 120, "publish (file:// store)")
        message = json.loads(done.stdout)
        fetched = work / "fetched"
        cmd = [
            sys.executable, "-m", "tunefleet.artifacts.fetch", "--uri", message["uri"], "--sha256",
            message["sha256"], "--dest", str(fetched), "--devices", "1", "--gpu-model", model_label,
            "--fail-closed",
        ]  # fmt: skip
        done, facts["fetch_s"] = run(cmd, env, 120, "fetch + verify")
        say(done.stdout.strip())

        # 3. time the workload three ways, each in a fresh process
        off = {**env, "PYTORCH_TUNABLEOP_ENABLED": "0"}
        online = {
            **env,
            **TUNABLEOP_LIMIT_ENV,
            "PYTORCH_TUNABLEOP_ENABLED": "1",
            "PYTORCH_TUNABLEOP_TUNING": "1",
            "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
            "PYTORCH_TUNABLEOP_FILENAME": str(work / "online" / "online_results%d.csv"),
        }
        (work / "online").mkdir()
        offline = {
            **env,
            "PYTORCH_TUNABLEOP_ENABLED": "1",
            "PYTORCH_TUNABLEOP_TUNING": "0",
            "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
            "PYTORCH_TUNABLEOP_FILENAME": str(fetched / "tunableop_results%d.csv"),
        }
        for mode, mode_env in (("off", off), ("online", online), ("offline", offline)):
            rows.append((mode, timing_run(mode, mode_env, work, args.timed_iters)))
        report = dict(rows)

        # 4. checks: the fetched file is what TunableOp loads, under the same validators
        if report["offline"]["results_in_memory"] < facts["tuned"]:
            failures.append(
                f"offline run holds {report['offline']['results_in_memory']} TunableOp results, "
                f"expected the {facts['tuned']} fetched ones (validators rejected the file?)"
            )
        if report["offline"]["validators"] != facts["validators"]:
            failures.append(
                f"validators differ: manifest {facts['validators']} vs torch "
                f"{report['offline']['validators']}"
            )
        if report["off"]["tunableop_enabled"]:
            failures.append("TunableOp was enabled in the 'off' run")
        if facts["tuned"] < 1:
            failures.append("nothing was tuned")
    except Failed as exc:
        failures.append(str(exc))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"kept {work}")

    print()
    print(f"tunefleet gpu-check — {name}, torch {torch.__version__}, {backend}")
    if rows:
        print(f"workload: {rows[0][1]['model']}")
        print(
            f"  one iteration = forward of {PREFILL[0]}x{PREFILL[1]} tokens (prefill) "
            f"+ {DECODE[0]}x{DECODE[1]} (decode)"
        )
    if "recorded" in facts:
        ident = facts["identity"]
        print(
            f"GEMMs recorded: {facts['recorded']}, tuned: {facts['tuned']}; tuning wall time "
            f"{facts['tuning_s']:.1f} s (tuner_job run in all {facts['tuner_s']:.1f} s, limits "
            f"{TUNING['maxDurationMs']} ms / {TUNING['maxIterations']} iterations per solution)"
        )
        print(f"identity: {json.dumps(ident, sort_keys=True)}")
    if "fetch_s" in facts:
        print(
            f"publish to file:// store {facts['publish_s']:.2f} s, "
            f"fetch + verify {facts['fetch_s']:.2f} s (CLI processes)"
        )
    if rows:
        labels = {
            "off": "(a) TunableOp off",
            "online": "(b) online tuning",
            "offline": "(c) offline results",
        }
        print()
        print(f"{'mode':<22} | {'first iteration ms':>18} | {'steady-state ms (median)':>24}")
        print(f"{'-' * 22}-+-{'-' * 18}-+-{'-' * 24}")
        for mode, r in rows:
            print(f"{labels[mode]:<22} | {r['first_ms']:>18.1f} | {r['steady_ms']:>24.2f}")
        loaded = dict(rows).get("offline", {}).get("results_in_memory", "?")
        print(
            f"(steady state: median of iterations 3..{args.timed_iters}; "
            f"the offline run held {loaded} loaded results)"
        )
    print()
    if failures:
        for f in failures:
            print(f"FAIL: {f}")
        return 1
    print("OK: recorded, tuned, published, fetched and loaded by TunableOp on this GPU")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="cmd")
    w = sub.add_parser("workload", help="run the workload once (used by the check itself)")
    w.add_argument("--mode", required=True)
    w.add_argument("--iters", type=int, default=12)
    w.add_argument("--report")
    parser.add_argument("--budget-seconds", type=float, default=120.0, help="tuner budget")
    parser.add_argument(
        "--iters", dest="timed_iters", type=int, default=12, help="timed iterations per mode"
    )
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()
    if args.cmd == "workload":
        return workload(args)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
