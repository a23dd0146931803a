"""The real vLLM server, started, asked and stopped: the workload of a caches-only
TuningProfile whose bundle is vLLM's compile cache (kind `vllm`).

Why: vLLM compiles its model with torch.compile at every start (30 s of a 68 s start for a
32B model; about 30 s of the tiny model's 70 s on this machine's CPU) and keeps what it compiled
under $VLLM_CACHE_ROOT. The tuning Job runs this once, with that variable pointing at an empty
directory that tunefleet packs; model pods then start with a copy. It needs only the standard
library, so it runs in any vLLM image, mounted from a ConfigMap.

    python3 warmup.py [--port P] [--prompt TEXT] [--max-tokens N] [--requests N]
                      [--ready-timeout S] -- <the server's own arguments>

Everything after `--` goes to `python3 -m vllm.entrypoints.openai.api_server` (the model, the
compilation config, max-model-len, ...): the very arguments the model pods serve with, since
they are part of vLLM's cache key. It waits for /health, sends the completions (temperature
0), stops the server with SIGINT (vLLM's own shutdown: it saves what it compiled first), and
prints one line: ``TUNEFLEET_RESULT {json}`` with the seconds from start to ready and to the
first completion, vLLM's engine-init seconds, its KV cache in tokens, decode tokens per second
(64 tokens against 1, the same prompt), the compile-cache lines vLLM logged, and the token ids
of the first completion (the same prompt gives the same ids in every arm). While tunefleet
measures what the bundle buys, it also writes those figures to $TUNEFLEET_SERVING_REPORT
(tunefleet's tuner_job/serving.py): its gate rejects a bundle that costs KV cache or decode
speed, or whose compiled model loads empty.
Exits non-zero when the server never got ready or a request failed: the Job then says so.

A retune of missed cache keys (a pod that ran another max-model-len, say) names a file in
$TUNEFLEET_CACHE_VARIANTS: a JSON list of variants, each a list of "--flag=value" for vLLM's
key flags (tunefleet's tuner_job/caches.py). The server then starts once more per variant,
with those flags in place of the same flags among its own arguments, into the same
$VLLM_CACHE_ROOT: the bundle holds every key.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

RESULT = "TUNEFLEET_RESULT "
# vLLM's own words about its compile cache (vllm/compilation/decorators.py) and its engine's
# start (vllm/v1/engine/core.py), as 0.32.0 logs them.
INIT_RE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")
KV_RE = re.compile(r"KV cache size: ([0-9,]+) tokens")  # vllm/v1/core/kv_cache_utils.py
# A compiled model that loaded with nothing in it (vllm/compilation/caching.py): it runs eager.
EMPTY_RE = re.compile(
    r"reconstructed serializable fn from standalone compile artifacts\. "
    r"num_artifacts=0 num_submods=\d+|num_artifacts=\d+ num_submods=0"
)
# The serving report tunefleet asks for while it measures (tuner_job/serving.py owns it).
REPORT_ENV = "TUNEFLEET_SERVING_REPORT"
DECODE_TOKENS = 64  # tokens generated to time decoding, after the first
CACHE_LINES = (
    "Directly load AOT compilation",
    "Compiling model again due to a load failure",
    "saved AOT compiled function",
    "Source code has changed since the last compilation",
)


def _get(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except (urllib.error.URLError, OSError):
        return 0


def complete(port: int, model: str, prompt: str, max_tokens: int, **more: Any) -> dict[str, Any]:
    body = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
         "return_token_ids": True, **more}
    ).encode()  # fmt: skip
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def model_of(server_args: list[str]) -> str:
    if "--model" in server_args[:-1]:
        return server_args[server_args.index("--model") + 1]
    raise SystemExit("warmup.py: give the server --model (after --)")


def variants() -> list[list[str]]:
    """The retune's variants ($TUNEFLEET_CACHE_VARIANTS; none when unset or absent)."""
    path = os.environ.get("TUNEFLEET_CACHE_VARIANTS", "")
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, list) or not all(
        isinstance(v, list) and all(isinstance(a, str) and a.startswith("--") for a in v)
        for v in doc
    ):
        raise SystemExit(f"warmup.py: {path} is not a list of lists of --flag=value")
    return doc


def with_variant(server_args: list[str], variant: list[str]) -> list[str]:
    """The server's arguments with the variant's flags in place of its own."""
    flags = {a.split("=", 1)[0] for a in variant}
    out: list[str] = []
    skip = False
    for a in server_args:
        if skip:
            skip = False
            continue
        if a in flags:
            skip = True  # "--flag value": its value goes too
            continue
        if a.split("=", 1)[0] in flags:
            continue
        out.append(a)
    return out + variant


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    server_args = args[args.index("--") + 1 :] if "--" in args else []
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--prompt", default="Hello world, the cache is")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--requests", type=int, default=2)
    p.add_argument("--ready-timeout", type=float, default=600)
    opts = p.parse_args(args[: args.index("--")] if "--" in args else args)
    code = serve_once(server_args, opts)
    for variant in variants():
        print(f"warmup.py: the retune's variant {' '.join(variant)}", file=sys.stderr, flush=True)
        code = code or serve_once(with_variant(server_args, variant), opts)
    return code


def serve_once(server_args: list[str], opts: argparse.Namespace) -> int:
    """Start the server with these arguments, ask, stop it; print its result line."""
    model = model_of(server_args)
    started = time.monotonic()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--port",
           str(opts.port), *server_args]  # fmt: skip
    server = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: list[str] = []

    def pump() -> None:  # the server's log to ours, kept to read vLLM's own words from
        assert server.stdout is not None
        for line in server.stdout:
            sys.stderr.write(line)
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    result: dict[str, Any] = {"ok": False}
    try:
        ready = None
        while time.monotonic() - started < opts.ready_timeout and server.poll() is None:
            if _get(f"http://127.0.0.1:{opts.port}/health", 2) == 200:
                ready = time.monotonic()
                break
            time.sleep(0.5)
        if ready is None:
            result["error"] = f"the server never got ready (exit {server.poll()})"
            return 1
        first = complete(opts.port, model, opts.prompt, opts.max_tokens)
        answered = time.monotonic()
        for _ in range(opts.requests - 1):
            complete(opts.port, model, opts.prompt, opts.max_tokens)
        choice = first["choices"][0]
        result.update(
            ok=True,
            readySeconds=round(ready - started, 3),
            firstCompletionSeconds=round(answered - started, 3),
            tokenIds=choice.get("token_ids"),
            text=choice.get("text"),
            decodeTokensPerSecond=decode_speed(opts.port, model, opts.prompt),
        )
        return 0
    except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
        result["error"] = f"a completion failed: {exc}"
        return 1
    finally:
        _stop(server)
        reader.join(timeout=10)
        init = [float(m[1]) for m in map(INIT_RE.search, lines) if m]
        result["engineInitSeconds"] = init[0] if init else None
        kv = [int(m[1].replace(",", "")) for m in map(KV_RE.search, lines) if m]
        result["kvCacheTokens"] = kv[0] if kv else None
        result["emptyArtifact"] = next((ln for ln in lines if EMPTY_RE.search(ln)), "")[-300:]
        report(result)
        result["cacheLines"] = [ln for ln in lines if any(k in ln for k in CACHE_LINES)]
        result["vllmCacheRoot"] = os.environ.get("VLLM_CACHE_ROOT", "")
        result["serverArgs"] = server_args
        print(RESULT + json.dumps(result, sort_keys=True), flush=True)


def decode_speed(port: int, model: str, prompt: str) -> float | None:
    """Tokens per second after the first: DECODE_TOKENS + 1 tokens against 1, the same
    prompt (the difference is decoding alone); None when the server stopped early (EOS)."""
    body = {"ignore_eos": True}
    times, counts = [], []
    for n in (1, DECODE_TOKENS + 1):
        t = time.monotonic()
        doc = complete(port, model, prompt, n, **body)
        times.append(time.monotonic() - t)
        counts.append(int((doc.get("usage") or {}).get("completion_tokens") or 0))
    made, took = counts[1] - counts[0], times[1] - times[0]
    return round(made / took, 3) if made > 0 and took > 0 else None


_reported = False


def report(result: dict[str, Any]) -> None:
    """The first start's serving report, where tunefleet asked for one (only while it
    measures what the bundle buys: the format is tunefleet's tuner_job/serving.py)."""
    global _reported
    path = os.environ.get(REPORT_ENV, "")
    if not path or _reported or not result.get("ok"):
        return
    _reported = True
    doc = {
        "version": 1,
        "readySeconds": result.get("readySeconds"),
        "kvCacheTokens": result.get("kvCacheTokens"),
        "decodeTokensPerSecond": result.get("decodeTokensPerSecond"),
        "emptyArtifact": result.get("emptyArtifact") or "",
    }
    with open(path, "w") as f:
        json.dump(doc, f)


def _stop(server: subprocess.Popen[str]) -> None:
    """SIGINT, as vLLM expects (it stops its engine and workers); their whole group after."""
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)  # what it left behind in its group


if __name__ == "__main__":
    sys.exit(main())
