"""One Prometheus scrape, timed: what bench_metrics (the operator's cache at 10,000 profiles,
in process) and bench_scale (a live operator at each size) measure /metrics with."""

from __future__ import annotations

import statistics
import time
import urllib.request
from typing import Any

SCRAPES = 11


def scrape(url: str, times: int = SCRAPES) -> dict[str, Any]:
    """GET /metrics `times` times: the median time, the body's bytes, its samples."""
    took, body = [], b""
    for _ in range(times):
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as r:
            body = r.read()
        took.append(time.perf_counter() - start)
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {
        "median_ms": round(statistics.median(took) * 1000, 1),
        "max_ms": round(max(took) * 1000, 1),
        "bytes": len(body),
        "samples": samples,
        # Samples labelled with a profile: the per-profile gauges'.
        "per_profile_samples": sum(1 for line in body.splitlines() if b'profile="' in line),
    }
