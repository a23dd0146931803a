"""`make bench`: operator scale, webhook latency, artifact transfer; figures to bench/results.md.

Medians and ratios only: this machine (2 cores, shared) is noisy. Run on the local control
plane (started if needed) with the operator running as the chart's ServiceAccount.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.cluster import Cluster, S3Settings, ensure_cluster, ensure_s3  # noqa: E402
from tests.support.operator import Operator, carry_out_publish, install  # noqa: E402
from tests.support.poll import eventually  # noqa: E402

OUT = ROOT / "bench" / "results.md"


# Namespaces this run made; removed at the end so a bench leaves the cluster as it found it.
CREATED: list[str] = []


def profile(name: str, model: str = "NVIDIA-H200") -> dict[str, Any]:
    return {
        "apiVersion": "tunefleet.io/v1alpha1",
        "kind": "TuningProfile",
        "metadata": {"name": name},
        "spec": {
            "image": "registry.example.com/serve:1",
            "gpu": {"vendor": "nvidia", "models": [model]},
            "workload": {"shapes": [{"mnk": [64, 64, 64]}]},
            "storage": {"uri": "s3://tunefleet/bench"},
        },
    }


def count_jobs(cluster: Cluster, ns: str) -> int:
    out = cluster.kubectl("get", "jobs", "-n", ns, "-o", "name").stdout
    return len(out.split())


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def apply_to_jobs(cluster: Cluster, n: int, run: int) -> float:
    """Seconds from `kubectl apply` of n profiles to n Jobs existing."""
    ns = f"bench-{n}-{run}-{int(time.time())}"
    cluster.kubectl("create", "namespace", ns)
    CREATED.append(ns)
    docs = "\n---\n".join(yaml.safe_dump(profile(f"p{i}")) for i in range(n))
    start = time.perf_counter()
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=docs)
    eventually(
        lambda: count_jobs(cluster, ns), lambda c: c >= n, f"{n} Jobs", timeout=600, interval=0.2
    )
    took = time.perf_counter() - start
    print(f"{n} profiles: all Jobs {took:.2f}s after apply", flush=True)
    return took


def histogram(cluster: Cluster) -> dict[float, float]:
    metrics = cluster.kubectl("get", "--raw", "/metrics").stdout
    buckets: dict[float, float] = {}
    for line in metrics.splitlines():
        if (
            line.startswith("apiserver_admission_webhook_admission_duration_seconds_bucket")
            and 'name="pods.tunefleet.io"' in line
        ):
            le = re.search(r'le="([^"]+)"', line)
            if le:
                b = float("inf") if le.group(1) == "+Inf" else float(le.group(1))
                buckets[b] = buckets.get(b, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float:
    """histogram_quantile over the buckets' increase, as Prometheus computes it."""
    edges = sorted(after)
    counts = [after[e] - before.get(e, 0.0) for e in edges]
    total = counts[-1]
    rank = q * total
    prev_edge, prev_count = 0.0, 0.0
    for edge, count in zip(edges, counts, strict=True):
        if count >= rank:
            if edge == float("inf"):
                return prev_edge
            return prev_edge + (edge - prev_edge) * (rank - prev_count) / max(
                count - prev_count, 1e-9
            )
        prev_edge, prev_count = edge, count
    return float("nan")


def webhook_latency(
    cluster: Cluster, operator: Operator, env: dict[str, str], pods: int = 50
) -> dict[str, Any]:
    ns = f"bench-webhook-{int(time.time())}"
    cluster.kubectl("create", "namespace", ns)
    CREATED.append(ns)
    # H100, because the scale runs fill the H200 node's 8 GPUs with pending tuning pods.
    serve = profile("serve", "NVIDIA-H100-80GB-HBM3")
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(serve))
    pod = eventually(
        lambda: json.loads(
            cluster.kubectl(
                "get", "pods", "-n", ns, "-l", "tunefleet.io/tuning-profile=serve", "-o", "json"
            ).stdout
        )["items"],
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "tuning pod",
    )[0]
    carry_out_publish(cluster.kubectl, pod, env)
    eventually(
        lambda: json.loads(cluster.kubectl("get", "tp", "-n", ns, "serve", "-o", "json").stdout),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "Ready",
    )
    api = kubernetes.client.CoreV1Api(cluster.api_client())
    # Alone (one create at a time) the figures show the webhook's own cost; at `pods`
    # concurrent creates they show it under the API server's and this machine's queueing.
    return {
        "sequential": admit(cluster, operator, api, ns, "seq", count=20, concurrency=1),
        "concurrent": admit(cluster, operator, api, ns, "con", count=pods, concurrency=pods),
    }


def bucket(q: float, before: dict[float, float], after: dict[float, float]) -> str:
    """The histogram bucket the q-quantile falls in: the honest resolution of the metric."""
    edges = sorted(after)
    counts = [after[e] - before.get(e, 0.0) for e in edges]
    lower = 0.0
    for edge, count in zip(edges, counts, strict=True):
        if count >= q * counts[-1]:
            return f"({lower * 1000:g}, {edge * 1000:g}] ms"
        lower = edge
    return "?"


def admit(
    cluster: Cluster,
    operator: Operator,
    api: Any,
    ns: str,
    prefix: str,
    count: int,
    concurrency: int,
) -> dict[str, Any]:
    before, log_before = histogram(cluster), len(operator.logs().splitlines())

    def create(i: int) -> float:
        body = {
            "metadata": {"name": f"{prefix}{i}", "labels": {"tunefleet.io/profile": "serve"}},
            "spec": {"containers": [{"name": "s", "image": "registry.example.com/serve:1"}]},
        }
        t = time.perf_counter()
        api.create_namespaced_pod(ns, body)
        return (time.perf_counter() - t) * 1000

    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        client_ms = sorted(pool.map(create, range(count)))
    time.sleep(1)
    after = histogram(cluster)
    lines = operator.logs().splitlines()[log_before:]
    handler_ms = sorted(
        float(m.group(1))
        for line in lines
        if (m := re.search(rf"admission pod {ns}/{prefix}\d+: injected in ([0-9.]+) ms", line))
    )
    pods = json.loads(cluster.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
    injected = sum(
        1
        for p in pods
        if p["metadata"]["name"].startswith(prefix)
        and p["spec"].get("initContainers", [{}])[0].get("name") == "tunefleet-fetch"
    )

    def pct(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")

    return {
        "pods": count,
        "concurrency": concurrency,
        "injected": injected,
        "handler_p50_ms": pct(handler_ms, 0.5),
        "handler_p99_ms": pct(handler_ms, 0.99),
        "apiserver_p50_ms_estimate": round(quantile(0.5, before, after) * 1000, 1),
        "apiserver_p50_bucket": bucket(0.5, before, after),
        "apiserver_p99_ms_estimate": round(quantile(0.99, before, after) * 1000, 1),
        "apiserver_p99_bucket": bucket(0.99, before, after),
        "client_create_p50_ms": round(pct(client_ms, 0.5), 1),
        "client_create_p99_ms": round(pct(client_ms, 0.99), 1),
    }


def artifacts(s3: S3Settings) -> dict[str, Any]:
    from bench import bench_artifacts

    return dict(bench_artifacts.run(s3))


def main() -> None:
    cluster, s3 = ensure_cluster(), ensure_s3()
    env = s3.env()
    operator = install(cluster, s3.endpoint)
    assert operator.proc is not None
    results: dict[str, Any] = {}
    try:
        idle = rss_mib(operator.proc.pid)
        one = [apply_to_jobs(cluster, 1, r) for r in range(5)]
        many = [apply_to_jobs(cluster, 200, 0)]
        time.sleep(5)  # let status writes settle before reading memory
        rss_200 = rss_mib(operator.proc.pid)
        many.append(apply_to_jobs(cluster, 200, 1))
        results["scale"] = {
            "apply_to_jobs_1_profile_s_median": statistics.median(one),
            "runs_1": len(one),
            "apply_to_jobs_200_profiles_s_median": statistics.median(many),
            "runs_200": len(many),
            "operator_rss_idle_mib": idle,
            "operator_rss_mib_with_205_profiles": rss_200,
            "operator_rss_mib_with_405_profiles": rss_mib(operator.proc.pid),
        }
        results["webhook"] = webhook_latency(cluster, operator, env)
        results["artifacts"] = artifacts(s3)
    finally:
        operator.stop()
        for ns in CREATED:
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    write(results)


def write(results: dict[str, Any]) -> None:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    lines = [
        "# tunefleet benchmarks",
        "",
        f"Written by `make bench` on {time.strftime('%Y-%m-%d')}: {os.cpu_count()} cores ({cpu}), "
        f"Python {platform.python_version()}, local control plane (kube-apiserver v1.36.3, kwok, SeaweedFS) on loopback. "
        "Medians; this machine is shared and noisy, so read ratios, not absolutes.",
        "",
        "```json",
        json.dumps(results, indent=2),
        "```",
    ]
    OUT.write_text("\n".join(lines) + "\n")
    print(OUT.read_text())


if __name__ == "__main__":
    main()
