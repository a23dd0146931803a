"""The /metrics scrape at fleet size: 10,000 profiles in the operator's cache
(watched/cache.ProfileCache, filled as the reflectors fill it), scraped over HTTP from the
operator's own metrics server (metrics.serve) with its own collector
(handlers/startup.Operator.index_collector): per-profile series off (the default) and on.

Each profile is Ready with one artifact per GPU model, each with a measured gain (two figures)
and a promotion verdict, and a capture entry: the most per-profile series a profile makes.
Nothing here talks to a cluster: it measures the scrape (the collector and the exposition),
not filling the cache, which bench_scale measures with a live operator.

    python -m bench.bench_metrics [profiles]
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from bench.scrape import SCRAPES, scrape  # noqa: E402
from testbed.builders.objects import GROUP_VERSION, manifest  # noqa: E402
from tunefleet import metrics  # noqa: E402
from tunefleet.config import Config  # noqa: E402
from tunefleet.handlers.startup import Operator  # noqa: E402

MODELS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H200")
GOAL = "<= 100 ms and <= 2 MB a scrape at 10,000 profiles, no series per profile by default"
NOTE = (
    "in process, no cluster: the operator's collector (handlers/startup.Operator.index_collector) and "
    "metrics server (metrics.serve) over its cache of Ready profiles, scraped over HTTP; the "
    "first scrape of each arm is not counted"
)


def _figure(name: str, speedup: float) -> dict[str, Any]:
    return {"name": name, "baselineSeconds": 2.0, "tunedSeconds": 2.0 / speedup,
            "speedup": speedup, "low": speedup - 0.1, "high": speedup + 0.1,
            "repetitions": 5}  # fmt: skip


def _status(i: int) -> dict[str, Any]:
    """A Ready profile's status as the operator writes it (the fields the gauges read)."""
    arts = [
        {"gpuModel": m, "uri": f"s3://bkt/p/ns/p{i}/{m}/{i:064x}", "sha256": f"{i:064x}",
         "delivery": "ConfigMap", "promotion": {"verdict": "Passed", "message": "passed"},
         "gain": {"mode": "Eager", "figures": [_figure("gemms", 1.3), _figure("workload", 1.1)]}}
        for m in MODELS
    ]  # fmt: skip
    capture = [{"gpuModel": m, "seen": 20, "tuned": 18, "coverage": 90} for m in MODELS]
    jobs = [{"gpuModel": m, "name": f"tune-{i}", "state": "Succeeded"} for m in MODELS]
    return {"phase": "Ready", "artifacts": arts, "capture": capture, "jobs": jobs}


def _profile(i: int) -> dict[str, Any]:
    """Profile i, Ready, in one of 100 namespaces, as its watch event brings it."""
    doc = manifest(
        GROUP_VERSION, "TuningProfile", f"profile-{i:05d}", f"team-{i % 100:03d}",
        spec={"image": "registry.example.com/serve:1",
              "gpu": {"vendor": "nvidia", "models": list(MODELS)},
              "workload": {"shapes": [{"mnk": [8, 8, 8]}]},
              "storage": {"uri": "s3://bkt/p"}},
        status=_status(i),
    )  # fmt: skip
    doc["metadata"].update(uid=f"uid-{i}", generation=1, resourceVersion=str(i))
    return doc


def fill(operator: Operator, n: int) -> None:
    """n profiles in the operator's cache, over 100 namespaces, as their watch events bring
    them."""
    for i in range(n):
        operator.cache.put_profile(_profile(i))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(n: int = 10_000) -> dict[str, Any]:
    operator = Operator()  # its client never logs in: nothing here talks to a cluster
    start = time.perf_counter()
    fill(operator, n)
    fill_s = time.perf_counter() - start
    port = _free_port()
    metrics.serve(port, addr="127.0.0.1")
    url = f"http://127.0.0.1:{port}/metrics"
    out: dict[str, Any] = {"profiles": n, "gpu_models_per_profile": len(MODELS),
                           "scrapes": SCRAPES, "fill_s": round(fill_s, 1)}  # fmt: skip
    for arm, on in (("per_profile_off", False), ("per_profile_on", True)):
        collector = operator.index_collector(Config(profile_metrics=on), queue_depth=lambda: 0)
        metrics.REGISTRY.register(collector)
        try:
            scrape(url, 1)  # the first: imports and caches warmed
            out[arm] = scrape(url)
        finally:
            # The suite runs other routines in this process after this one.
            metrics.REGISTRY.unregister(collector)
    off = out["per_profile_off"]
    out["meets_goal"] = off["median_ms"] <= 100 and off["bytes"] <= 2_000_000
    out["goal"] = GOAL
    out["note"] = NOTE
    return out


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000), indent=1))
