"""Every second of a vLLM server pod's start, named: from the pod's creation to its first
completion, cut at the moments vLLM's own log records and the pod's status mark (pure: the
bench reads the log with ``kubectl logs --timestamps``, where the kubelet stamps every line to
the nanosecond, and the pod's status).

The phases follow each other, so they add up to the total by construction; a marker vLLM did
not log (an eager server compiles nothing) gives its phase 0 s and its time to the next one.

| phase            | from                                  | to                                   |
|------------------|---------------------------------------|--------------------------------------|
| delivery         | pod created                           | server container started (init      |
|                  |                                       | containers: tunefleet's fetch)       |
| imports          | container started                     | vLLM's first log line                |
| inspection       | first line                            | "Resolved architecture" (model info: |
|                  |                                       | a subprocess unless cached)          |
| engine_start     | inspection done                       | weight loading starts (engine core   |
|                  |                                       | and worker processes, their imports) |
| weights          | "Loading weights took N seconds": N   |                                      |
| compile          | weights loaded                        | compiled model saved or loaded       |
|                  |                                       | (Dynamo, Inductor, its C++ builds)   |
| warmup           | compiled                              | "KV cache size: N tokens"            |
| kv_cache         | KV cache sized                        | "init engine ... took"               |
| api_start        | engine up                             | the pod Ready                        |
| first_completion | Ready                                 | the first completion answered        |
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from bench.realnode import epoch

PHASES = (
    "delivery", "imports", "inspection", "engine_start", "weights", "compile", "warmup",
    "kv_cache", "api_start", "first_completion",
)  # fmt: skip
# vLLM 0.32.0's words (vllm/config/model.py, model_loader, compilation/decorators.py,
# compilation/monitor.py, v1/core/kv_cache_utils.py, v1/engine/core.py).
_INSPECTED = re.compile(r"Resolved architecture: ")
_WEIGHTS = re.compile(r"Loading weights took ([0-9.]+) seconds")
_COMPILED = re.compile(
    r"saved AOT compiled function to |Directly load AOT compilation from path |"
    r"torch\.compile took [0-9.]+ s in total|Compiling model again due to a load failure|"
    # With AOT off on its CPU platform vLLM says nothing of the compile: it ends with the
    # warm-up it runs in (cpu_model_runner.py), which then counts in this phase.
    r"Warming up done\."
)
_SAVED_OR_DONE = re.compile(r"saved AOT compiled function to |Directly load AOT compilation ")
_KV = re.compile(r"KV cache size: ([0-9,]+) tokens")
_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")
_VLLM_LINE = re.compile(r"(?:^|\) )(?:INFO|WARNING|DEBUG|ERROR) \d\d-\d\d ")


def stamped(log: str) -> list[tuple[float, str]]:
    """`kubectl logs --timestamps` output as (epoch, line); lines without a stamp dropped."""
    out = []
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        try:
            out.append((epoch(stamp), text))
        except ValueError:
            continue
    return out


def _first(lines: Iterable[tuple[float, str]], pattern: re.Pattern[str]) -> tuple[float, str]:
    for t, text in lines:
        if pattern.search(text):
            return t, text
    return 0.0, ""


def phases(
    created: float, started: float, log: str, ready: float, answered: float
) -> dict[str, Any]:
    """The phases of one start (seconds, rounded to ms), the total, and vLLM's own figures
    on the way: KV cache tokens, engine init seconds, weight-load seconds."""
    lines = stamped(log)
    first = next((t for t, text in lines if _VLLM_LINE.search(text)), 0.0)
    inspected, _ = _first(lines, _INSPECTED)
    weights_at, weights_line = _first(lines, _WEIGHTS)
    weight_s = float(_WEIGHTS.search(weights_line).group(1)) if weights_line else 0.0  # type: ignore[union-attr]
    compiled = max((t for t, text in lines if _SAVED_OR_DONE.search(text)), default=0.0)
    compiled = compiled or _first(lines, _COMPILED)[0]
    kv_at, kv_line = _first(lines, _KV)
    engine_at, engine_line = _first(lines, _ENGINE)
    marks = [
        ("delivery", started), ("imports", first), ("inspection", inspected),
        ("engine_start", weights_at - weight_s if weights_at else 0.0),
        ("weights", weights_at), ("compile", compiled), ("warmup", kv_at),
        ("kv_cache", engine_at), ("api_start", ready), ("first_completion", answered),
    ]  # fmt: skip
    out: dict[str, Any] = {}
    at = created
    for name, mark in marks:
        end = max(mark, at) if mark else at
        out[name] = round(end - at, 3)
        at = end
    kv = _KV.search(kv_line)
    engine = _ENGINE.search(engine_line)
    return {
        "phases_s": out,
        "total_s": round(at - created, 3),
        "kv_cache_tokens": int(kv.group(1).replace(",", "")) if kv else None,
        "engine_init_s": float(engine.group(1)) if engine else None,
        "weights_s": weight_s or None,
    }
