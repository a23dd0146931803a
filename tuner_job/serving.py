"""The serving report: what a workload that starts a model server says of one start, for the
gate to weigh what a compile cache costs besides the seconds it saves (stdlib only).

The contract between the tuner and the workload, owned here: while measuring (tuner_job/
measure.py), every run of the workload gets ``$TUNEFLEET_SERVING_REPORT``, a path; a workload
that serves a model (examples/vllm/warmup.py) writes one JSON object there before it exits:

    {"version": 1, "readySeconds": 31.2, "kvCacheTokens": 7280,
     "decodeTokensPerSecond": 18.4, "emptyArtifact": ""}

- readySeconds: from its start to the server's health check answering;
- kvCacheTokens: the KV cache's size in tokens, in the server's own words (vLLM's "KV cache
  size: N tokens" line); a cold compile can leave less memory for it (vllm#54383);
- decodeTokensPerSecond: tokens generated per second after the first, on a fixed prompt;
- emptyArtifact: the server's words when it loaded a compiled model that held no compiled
  code ("" when it did not): it then runs eager for its life (vllm#56879).

A workload that writes nothing (not a server) leaves the gate to its seconds alone; a report
that does not parse is ignored the same way, never read as a pass of its own.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

REPORT_ENV = "TUNEFLEET_SERVING_REPORT"
VERSION = 1
MAX_REPORT_BYTES = 64 * 1024


@dataclass(frozen=True)
class Report:
    ready_s: float | None = None
    kv_cache_tokens: int | None = None
    decode_tps: float | None = None
    empty_artifact: str = ""


def _number(v: Any, integral: bool = False) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        return None
    if integral and not float(v).is_integer():
        return None
    return float(v)


def parse(text: str) -> Report | None:
    """The report a workload wrote; None when it is not one of this version."""
    try:
        doc = json.loads(text[:MAX_REPORT_BYTES])
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        return None
    kv = _number(doc.get("kvCacheTokens"), integral=True)
    empty = doc.get("emptyArtifact")
    return Report(
        _number(doc.get("readySeconds")),
        int(kv) if kv is not None else None,
        _number(doc.get("decodeTokensPerSecond")),
        empty[:300] if isinstance(empty, str) else "",
    )
