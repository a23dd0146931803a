"""The routines of `make bench` (`python -m bench`, bench/__main__.py): operator scale and
restarts, webhook cost, reuse/sharding/resume, real-node pod start-up, artifact transfer.

Medians and ratios: this machine (2 cores, shared) is noisy. Run on the local control plane
(started if needed). The operator runs as the chart's ServiceAccount, as a process here for
scale, kill storms and the webhook (kwok fleet), and as the chart's Deployment on the real node
for the pod start-up figures. Each routine's figures are stamped with the commit and date of
the run (bench/results.py) and merged into bench/results.json; results.md is generated.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import load, progress, stamped, write  # noqa: E402
from bench.routines import ROUTINES  # noqa: E402
from testbed.builders.objects import bench_profile  # noqa: E402
from testbed.cluster import Cluster, S3Settings, ensure_cluster, ensure_s3  # noqa: E402
from testbed.operator import Operator, carry_out_publish, install  # noqa: E402
from testbed.poll import eventually  # noqa: E402

# Namespaces this run made; removed at the end so a bench leaves the cluster as it found it.
CREATED: list[str] = []


def count_jobs(cluster: Cluster, ns: str) -> int:
    out = cluster.kubectl("get", "jobs", "-n", ns, "-o", "name").stdout
    return len(out.split())


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


def ready_profile(cluster: Cluster, env: dict[str, str], prefix: str) -> str:
    """A new namespace holding a Ready profile named "serve" (its publish step played here, as
    the kwok node runs nothing); returns the namespace."""
    ns = f"{prefix}-{int(time.time())}"
    cluster.kubectl("create", "namespace", ns)
    CREATED.append(ns)
    # H100, because the scale runs fill the H200 node's 8 GPUs with pending tuning pods.
    serve = bench_profile("serve", "NVIDIA-H100-80GB-HBM3")
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
    return ns


def webhook_latency(
    cluster: Cluster, operator: Operator, env: dict[str, str], pods: int = 50
) -> dict[str, Any]:
    ns = ready_profile(cluster, env, "bench-webhook")
    api = kubernetes.client.CoreV1Api(cluster.api_client())
    at = Admission(cluster, operator, api, ns)
    # Alone (one create at a time) the figures show the webhook's own cost; at `pods`
    # concurrent creates they show it under the API server's and this machine's queueing.
    return {
        "sequential": admit(at, "seq", count=20, concurrency=1),
        "concurrent": admit(at, "con", count=pods, concurrency=pods),
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


@dataclass(frozen=True)
class Admission:
    """Where admit creates its pods: the cluster (its API server's admission histogram), the
    operator (its log's handler times), a CoreV1Api, the namespace of the Ready profile."""

    cluster: Cluster
    operator: Operator
    api: Any
    ns: str


def admit(at: Admission, prefix: str, count: int, concurrency: int) -> dict[str, Any]:
    """`count` pods labelled for the profile, `concurrency` at a time, named prefix0, ...: the
    webhook's time as its handler logs it, the API server's and the client's."""
    cluster, operator, api, ns = at.cluster, at.operator, at.api, at.ns
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


def artifacts(s3: S3Settings, runs: int = 7) -> dict[str, Any]:
    from bench import bench_artifacts

    return dict(bench_artifacts.run(s3, runs=runs))


def churn(cluster: Cluster, operator: Operator, n: int = 1000, cycles: int = 5) -> dict[str, Any]:
    """Issue 16's lifecycle goal: create and delete `n` profiles `cycles` times; the operator's
    memory after the last cycle within 10% of after the first (every map pruned with what it
    describes)."""
    docs = "\n---\n".join(yaml.safe_dump(bench_profile(f"c{i:04d}")) for i in range(n))
    after: list[float] = []
    for cycle in range(cycles):
        ns = f"bench-churn-{int(time.time())}-{cycle}"
        cluster.kubectl("create", "namespace", ns)
        CREATED.append(ns)
        cluster.kubectl("create", "-n", ns, "-f", "-", input=docs, timeout=600)
        eventually(
            lambda ns=ns: count_jobs(cluster, ns),
            lambda c: c >= n,
            f"{n} Jobs",
            timeout=900,
            interval=1,
        )
        cluster.kubectl("delete", "tp", "--all", "-n", ns, "--wait=false", timeout=600)
        eventually(
            lambda ns=ns: count_jobs(cluster, ns),
            lambda c: c == 0,
            "all Jobs gone",
            timeout=900,
            interval=1,
        )
        time.sleep(40)  # housekeeping (every 30 s) hands freed memory back
        after.append(round(operator.rss_mib(), 1))
        progress("churn", f"cycle {cycle + 1}/{cycles}: {after[-1]} MiB after deleting")
    out = {
        "profiles_per_cycle": n,
        "cycles": cycles,
        "rss_after_each_cycle_mib": after,
        "last_over_first": round(after[-1] / after[0], 3),
        "goal": "last_over_first <= 1.10",
    }
    print(f"churn: {json.dumps(out)}", flush=True)
    return out


def _storm_picture(cluster: Cluster, ns: str) -> tuple[int, int, int]:
    """The storm's namespace as kill_storm waits for it: (Jobs, distinct (profile, model)
    pairs among them, Jobs listed in the profiles' statuses)."""
    jobs = json.loads(cluster.kubectl("get", "jobs", "-n", ns, "-o", "json").stdout)["items"]
    pairs = {
        (
            j["metadata"]["labels"]["tunefleet.io/tuning-profile"],
            j["metadata"]["labels"]["tunefleet.io/gpu-model"],
        )
        for j in jobs
    }
    listed = sum(
        len((p.get("status") or {}).get("jobs") or [])
        for p in json.loads(cluster.kubectl("get", "tp", "-n", ns, "-o", "json").stdout)["items"]
    )
    return len(jobs), len(pairs), listed


def kill_storm(cluster: Cluster, operator: Operator, kills: int = 100) -> dict[str, Any]:
    """20 two-model profiles created while the operator is SIGKILLed `kills` times."""
    import random
    import threading as th

    ns = f"bench-storm-{int(time.time())}"
    cluster.kubectl("create", "namespace", ns)
    CREATED.append(ns)
    models = ["AMD_Instinct_MI300X_OAM", "AMD_Instinct_MI325X_OAM"]
    rng = random.Random(12)

    def create() -> None:
        for i in range(20):
            doc = bench_profile(f"storm-{i:02d}")
            doc["spec"]["gpu"] = {"vendor": "amd", "models": models}
            cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
            time.sleep(rng.uniform(0.05, 0.4))

    creator = th.Thread(target=create)
    creator.start()
    for i in range(kills):
        operator.kill()
        operator.start(wait=False)
        time.sleep(rng.uniform(0.0, 2.0) if i % 10 else rng.uniform(2.0, 4.0))
    creator.join()
    operator.kill()
    operator.start()
    start = time.perf_counter()
    final = eventually(
        lambda: _storm_picture(cluster, ns),
        lambda t: t == (40, 40, 40),
        "40 Jobs, one per pair, all listed",
        timeout=120,
        interval=0.5,
    )
    out = {
        "kills": kills,
        "profiles": 20,
        "models_each": 2,
        "settled_after_last_restart_s": round(time.perf_counter() - start, 1),
        "jobs": final[0],
        "goal": "every (profile, model) exactly one Job, statuses matching, within 30 s",
    }
    print(f"kill storm: {json.dumps(out)}", flush=True)
    return out


def webhook_ratio(
    cluster: Cluster, operator: Operator, env: dict[str, str], n: int = 50
) -> dict[str, Any]:
    """50 labelled and 50 unlabelled pods created at the same moment: the webhook's cost as
    the client sees it, as a ratio of p50 and p99 create latency."""
    ns = ready_profile(cluster, env, "bench-ratio")
    api = kubernetes.client.CoreV1Api(cluster.api_client())
    runs = []
    for run in range(3):
        barrier = threading.Barrier(2 * n)

        def create(
            i: int, run: int = run, barrier: threading.Barrier = barrier
        ) -> tuple[bool, float]:
            labelled = i % 2 == 0
            labels = {"tunefleet.io/profile": "serve"} if labelled else {"app": "plain"}
            body = {
                "metadata": {"name": f"r{run}-{i:03d}", "labels": labels},
                "spec": {"containers": [{"name": "s", "image": "registry.example.com/serve:1"}]},
            }
            barrier.wait()
            t = time.perf_counter()
            api.create_namespaced_pod(ns, body)
            return labelled, (time.perf_counter() - t) * 1000

        with concurrent.futures.ThreadPoolExecutor(max_workers=2 * n) as pool:
            got = list(pool.map(create, range(2 * n)))
        with_hook = sorted(ms for labelled, ms in got if labelled)
        without = sorted(ms for labelled, ms in got if not labelled)

        def pct(xs: list[float], q: float) -> float:
            return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]

        runs.append(
            {
                "labelled_p50_ms": round(pct(with_hook, 0.5), 1),
                "labelled_p99_ms": round(pct(with_hook, 0.99), 1),
                "unlabelled_p50_ms": round(pct(without, 0.5), 1),
                "unlabelled_p99_ms": round(pct(without, 0.99), 1),
            }
        )
        time.sleep(2)
    for r in runs:
        r["p50_ratio"] = round(r["labelled_p50_ms"] / r["unlabelled_p50_ms"], 2)
        r["p99_ratio"] = round(r["labelled_p99_ms"] / r["unlabelled_p99_ms"], 2)
    out = {
        "pods_per_run": f"{n} labelled + {n} unlabelled, created at the same moment",
        "runs": runs,
        "p50_ratio_median": statistics.median(r["p50_ratio"] for r in runs),
        "p99_ratio_median": statistics.median(r["p99_ratio"] for r in runs),
        "goal": "p99 ratio <= 1.3",
    }
    print(f"webhook ratio: {json.dumps(out)}", flush=True)
    return out


class S3FromPods:
    """nftables on this machine (the real node): counts new TCP connections from pods to the
    S3 server, and can drop them (the store unreachable from pods: the in-cluster operator's
    too, so its deliveries are made before; counted, they are part of the figure)."""

    TABLE = "tunefleet_bench_s3"

    def __init__(self, pod_cidr: str, s3_host: str, s3_port: int) -> None:
        import subprocess

        self._nft = lambda *a: subprocess.run(["nft", *a], check=True, capture_output=True)
        self.match = ["ip", "saddr", pod_cidr, "ip", "daddr", s3_host, "tcp", "dport", str(s3_port)]
        self._nft("add", "table", "inet", self.TABLE)
        hook = "{ type filter hook input priority -10 ; }"
        self._nft("add", "chain", "inet", self.TABLE, "input", hook)
        self._nft("add", "rule", "inet", self.TABLE, "input", *self.match, "ct", "state", "new",
                  "counter")  # fmt: skip

    def connections(self) -> int:
        import subprocess

        out = subprocess.run(
            ["nft", "list", "table", "inet", self.TABLE], check=True, capture_output=True,
            text=True,
        ).stdout  # fmt: skip
        m = re.search(r"ct state new counter packets (\d+)", out)
        return int(m.group(1)) if m else 0

    def block(self) -> None:
        self._nft("add", "rule", "inet", self.TABLE, "input", *self.match, "drop")

    def close(self) -> None:
        import subprocess

        subprocess.run(["nft", "delete", "table", "inet", self.TABLE], capture_output=True)


def _pod_addresses() -> str:
    """The real node's pod addresses as an nftables range: its bridge's network (POD_CIDR in
    hack/lib/common.sh; the kubelet's CNI config sets no node podCIDR) without the bridge's own
    address, which is the host's (its own connections to S3 are not pods')."""
    import ipaddress

    text = (ROOT / "hack" / "lib" / "common.sh").read_text()
    cidr = re.search(r"^POD_CIDR=(\S+)", text, re.M)
    assert cidr, "POD_CIDR not found in hack/lib/common.sh"
    net = ipaddress.ip_network(cidr.group(1))
    return f"{net.network_address + 2}-{net.broadcast_address - 1}"


class _RealNode:
    """real_node's namespace on the real node: kubectl as JSON, and the model pods it makes,
    times and counts (`burst` of them at once in a burst)."""

    def __init__(self, cluster: Cluster, ns: str, burst: int) -> None:
        self.cluster, self.ns, self.burst = cluster, ns, burst

    def get(self, kind: str, name: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(
            self.cluster.kubectl("get", kind, "-n", self.ns, name, "-o", "json").stdout
        )
        return doc

    def tune_three(self, s3: S3Settings, secret: str) -> list[float]:
        """Three profiles applied in turn (delivered as ConfigMap, Store, ConfigMap), each
        until Ready with its artifacts delivered: the seconds each took."""
        from testbed.real_node import real_profile

        durations = []
        for i, delivery in enumerate(["ConfigMap", "Store", "ConfigMap"]):
            name = f"tune{i}"
            doc = real_profile(name, s3, secret, serving={"delivery": delivery})
            doc["spec"]["workload"]["shapes"][0]["mnk"][0] += i  # a distinct profile each run
            start = time.perf_counter()
            self.cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=yaml.safe_dump(doc))
            eventually(
                lambda name=name: self.get("tp", name),
                lambda p: (
                    (p.get("status") or {}).get("phase") == "Ready"
                    and all(a.get("delivery") for a in p["status"].get("artifacts") or [])
                ),
                f"{name} Ready",
                timeout=300,
                interval=0.5,
            )
            durations.append(time.perf_counter() - start)
        return durations

    @staticmethod
    def pod_doc(name: str, profile: str | None, once: bool = False) -> dict[str, Any]:
        from testbed.real_node import model_pod

        # One fake GPU each: the real node has 8, and a burst queues for them.
        doc = model_pod(name, profile or "tune0", gpus=1)
        if profile is None:
            del doc["metadata"]["labels"]["tunefleet.io/profile"]
        if not once:
            doc["spec"]["restartPolicy"] = "Always"
            doc["spec"]["containers"][0]["command"] = ["standin-server"]
        return doc

    def phase(self, name: str, want: str, timeout: float = 180) -> dict[str, Any]:
        return eventually(
            lambda: self.get("pod", name),
            lambda p: (p.get("status") or {}).get("phase") == want,
            f"{name} {want}",
            timeout=timeout,
            interval=0.1,
        )

    def start_to_running(self, name: str, profile: str | None) -> float:
        t = time.perf_counter()
        doc = yaml.safe_dump(self.pod_doc(name, profile))
        self.cluster.kubectl("create", "-n", self.ns, "-f", "-", input=doc)
        self.phase(name, "Running")
        took = time.perf_counter() - t
        self.cluster.kubectl("delete", "pod", "-n", self.ns, name, "--wait=false")
        return took

    def tuned(self, name: str) -> bool:
        logs = self.cluster.kubectl("logs", "-n", self.ns, name, "-c", "server", check=False).stdout
        return "results file(s) in" in logs

    def burst_of(self, prefix: str, profile: str | None, timeout: float = 300) -> dict[str, Any]:
        """`burst` pods at once that report what they got and end (so that all of them get
        one of the node's 8 fake GPUs in turn)."""
        names = [f"{prefix}-{i}" for i in range(self.burst)]
        t = time.perf_counter()
        docs = "\n---\n".join(yaml.safe_dump(self.pod_doc(n, profile, once=True)) for n in names)
        self.cluster.kubectl("create", "-n", self.ns, "-f", "-", input=docs)
        for n in names:
            self.phase(n, "Succeeded", timeout)
        took = time.perf_counter() - t
        started_tuned = sum(self.tuned(n) for n in names)
        self.cluster.kubectl("delete", "pod", "-n", self.ns, *names, "--wait=false")
        return {"pods": self.burst, "all_done_s": round(took, 1), "started_tuned": started_tuned}


# real_node's arms: a pod with no profile (the baseline), one served by a ConfigMap, one that
# fetches from the store.
REAL_ARMS: dict[str, str | None] = {"none": None, "configmap": "tune0", "store": "tune1"}


def _store_reachable(
    node: _RealNode, runs: int, counter: S3FromPods
) -> tuple[dict[str, list[float]], dict[str, float], dict[str, Any]]:
    """Start-up `runs` times per arm, interleaved, then a burst each way counting the S3
    connections pods opened; (times, their medians, the bursts)."""
    arms = REAL_ARMS
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for i in range(runs):
        for arm, prof in arms.items():
            times[arm].append(node.start_to_running(f"{arm}-{i}", prof))
    medians = {arm: statistics.median(ts) for arm, ts in times.items()}
    bursts = {}
    for arm in ("configmap", "store"):
        before = counter.connections()
        bursts[arm] = node.burst_of(f"burst-{arm}", arms[arm])
        bursts[arm]["s3_connections_from_pods"] = counter.connections() - before
    return times, medians, bursts


def _store_unreachable(node: _RealNode, runs: int) -> dict[str, Any]:
    """With pods' connections to the store dropped: start-up `runs` times with no profile and
    with a ConfigMap, then a burst of each delivering arm."""
    arms = REAL_ARMS
    down: dict[str, list[float]] = {"none": [], "configmap": []}
    for i in range(runs):
        for arm in down:
            down[arm].append(node.start_to_running(f"down-{arm}-{i}", arms[arm]))
    down_medians = {arm: statistics.median(ts) for arm, ts in down.items()}
    outage: dict[str, Any] = {
        "create_to_running_s_median": {a: round(m, 2) for a, m in down_medians.items()},
        "configmap_ratio_to_no_profile": round(down_medians["configmap"] / down_medians["none"], 2),
    }
    outage |= {
        f"burst_{arm}": node.burst_of(f"down-burst-{arm}", arms[arm], timeout=900)
        for arm in ("configmap", "store")
    }
    return outage


def real_node(cluster: Cluster, s3: S3Settings, runs: int = 10, burst: int = 20) -> dict[str, Any]:
    """On the real node, with the operator as the chart's Deployment: a tuning Job's duration
    (stand-in image), then model pod start-up (create to Running) three ways, interleaved,
    `runs` times each: no profile (the baseline), the artifact delivered as a ConfigMap (the
    default), and fetched from the store by the init container; then a burst of `burst` pods
    each way, counting the S3 connections pods opened; then the same with the store
    unreachable from pods."""
    from urllib.parse import urlsplit

    from testbed.cluster import ensure_images
    from testbed.operator import SERVING_SECRET, create_s3_secret, install_in_cluster

    ensure_images()
    deployed = install_in_cluster(cluster, s3)
    ns = f"bench-real-{int(time.time())}"
    cluster.kubectl("create", "namespace", ns)
    CREATED.append(ns)
    secret = create_s3_secret(cluster.kubectl, ns, s3.access_key, s3.secret_key)
    create_s3_secret(
        cluster.kubectl, ns, s3.reader_access_key, s3.reader_secret_key, SERVING_SECRET
    )
    node = _RealNode(cluster, ns, burst)
    durations = node.tune_three(s3, secret)
    assert node.get("tp", "tune0")["status"]["artifacts"][0]["delivery"].startswith("ConfigMap")
    pod_cidr = _pod_addresses()
    endpoint = urlsplit(s3.pod_endpoint)
    counter = S3FromPods(pod_cidr, endpoint.hostname or "", endpoint.port or 80)
    try:
        times, medians, bursts = _store_reachable(node, runs, counter)
        counter.block()
        outage = _store_unreachable(node, runs)
    finally:
        counter.close()
        deployed.uninstall()
    out = {
        "tuning_job_apply_to_ready_s": [round(d, 1) for d in durations],
        "tuning_job_apply_to_ready_s_median": round(statistics.median(durations), 1),
        "model_pod_create_to_running_s_median": {a: round(m, 2) for a, m in medians.items()},
        "model_pod_create_to_running_s_all": {
            a: [round(t, 2) for t in ts] for a, ts in times.items()
        },
        "ratio_to_no_profile": {
            a: round(medians[a] / medians["none"], 2) for a in ("configmap", "store")
        },
        "burst": bursts,
        "store_unreachable_from_pods": outage,
        "note": (
            f"{runs} pods per arm, interleaved; stand-in inference image (no GPU, no real "
            "torch); the stand-in tunes 8 shapes in 'microseconds'. Store-path pods with the "
            "store unreachable start untuned after the fetch's wall-clock limit (60 s)."
        ),
    }
    print(f"real node: {json.dumps(out)}", flush=True)
    return out


PARTS = ROUTINES  # what each routine measures (bench/routines.py)
# The parts that need the operator running here (kwok fleet) and those that do not.
OPERATOR_PARTS = ("scale", "storm", "churn", "webhook")


class _Steps:
    """The progress lines of a run of `total` parts: each part's start, numbered, and its end
    with its time and the run's."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._step = iter(range(1, total + 1))
        self._started = time.monotonic()

    def begin(self, part: str) -> float:
        progress(part, f"[{next(self._step)}/{self.total}] started: {PARTS[part]}")
        return time.monotonic()

    def done(self, part: str, since: float) -> None:
        took = time.monotonic() - since
        progress(part, f"done in {took:.0f} s ({time.monotonic() - self._started:.0f} s in all)")


@dataclass(frozen=True)
class _Bench:
    """What the parts share: the cluster, the store (and its env), the command line's options,
    the results they merge their figures into, and the operator process the OPERATOR_PARTS
    run against (None when none of them runs)."""

    cluster: Cluster
    s3: S3Settings
    env: dict[str, str]
    options: dict[str, Any]
    results: dict[str, Any]
    operator: Operator | None

    def op(self) -> Operator:
        assert self.operator is not None
        return self.operator


def _scale(b: _Bench) -> None:
    from bench import bench_scale

    operator = b.op()
    b.results.pop("scale_1000_profiles", None)
    sizes = bench_scale.parse_sizes(bench_scale.SIZES)
    b.results["scale"] = {}
    for i, (n, m) in enumerate(sizes, start=1):
        progress("scale", f"size {i}/{len(sizes)}: {n} profiles over {m} namespaces")
        b.results["scale"][str(n)] = stamped(bench_scale.run(b.cluster, operator, n, m))


def _storm(b: _Bench) -> None:
    b.results["kill_storm"] = stamped(kill_storm(b.cluster, b.op(), b.options["kills"]))


def _churn(b: _Bench) -> None:
    figures = churn(b.cluster, b.op(), b.options["churn_profiles"], b.options["cycles"])
    b.results["churn_create_delete"] = stamped(figures)


def _webhook(b: _Bench) -> None:
    b.results["webhook"] = stamped(webhook_latency(b.cluster, b.op(), b.env))
    progress("webhook", "latency done; now the cost ratio (3 runs)")
    b.results["webhook_cost_ratio"] = stamped(webhook_ratio(b.cluster, b.op(), b.env))


def _library(b: _Bench) -> None:
    from bench import bench_library

    b.results["library"] = stamped(bench_library.run(b.s3))


def _artifacts(b: _Bench) -> None:
    b.results["artifacts"] = stamped(artifacts(b.s3, b.options["runs"]))


def _gc(b: _Bench) -> None:
    from bench import bench_gc

    b.results["gc_10000_objects"] = stamped(bench_gc.run(b.s3))


def _real(b: _Bench) -> None:
    b.results["real_node"] = stamped(real_node(b.cluster, b.s3))


def _nodemap(options: dict[str, Any], results: dict[str, Any]) -> None:
    from bench import bench_nodemap

    results["node_map_10000_nodes"] = stamped(bench_nodemap.run(options["nodes"]))


def _metrics(options: dict[str, Any], results: dict[str, Any]) -> None:
    from bench import bench_metrics

    results["metrics_scrape_10000_profiles"] = stamped(bench_metrics.run())


def _capture(b: _Bench) -> None:
    from bench import bench_capture

    b.results["capture"] = stamped(bench_capture.run(loop=b.options["loop"]))


def _bundles(b: _Bench) -> None:
    from bench import bench_bundles

    figures = bench_bundles.run(b.cluster, b.s3, b.options["bundle_pods"])
    b.results["bundles_torch_compile"] = stamped(figures)


def _vllm(b: _Bench) -> None:
    from bench import bench_vllm

    figures = bench_vllm.run(
        b.cluster, b.s3, b.options["vllm_pods"], b.options.get("vllm_model", "real")
    )
    b.results["bundles_vllm"] = stamped(figures)


def _large(b: _Bench) -> None:
    from bench import bench_large

    o = b.options
    figures = bench_large.run(b.cluster, b.s3, o["large_pods"], o["large_volume_pods"])
    b.results["bundles_large"] = stamped(figures)


def _fleet(b: _Bench) -> None:
    from bench import bench_fleet

    b.results["fleet_two_clusters"] = stamped(bench_fleet.run(b.cluster, b.s3))


def _trust(b: _Bench) -> None:
    from bench import bench_trust

    groups = bench_trust.run(b.cluster, b.s3, b.options["pin_writers"], b.options["trust_pods"])
    for name, figures in groups.items():
        b.results[name] = stamped(figures)


def _broker(b: _Bench) -> None:
    from bench import bench_broker

    groups = bench_broker.run(b.cluster, b.s3, b.options["broker_rounds"])
    for name, figures in groups.items():
        b.results[name] = stamped(figures)


def _bids(options: dict[str, Any], results: dict[str, Any]) -> None:
    from bench import bench_bids

    results["fleet_bids_simulated"] = stamped(bench_bids.run(options["bid_trials"]))


def _oci(b: _Bench) -> None:
    from bench import bench_oci

    figures = bench_oci.run(b.cluster, b.s3, b.options["oci_pods"], b.options["oci_rounds"])
    b.results["oci_delivery"] = stamped(figures)


# Each part's runner, in the order a run takes them: those that need no cluster first
# (WITHOUT_CLUSTER, below: alone, they start none), then the operator's parts (it is stopped
# after them), then the rest (fleet before oci, unlike ROUTINES, as run_parts always took them).
WITH_OPERATOR: dict[str, Callable[[_Bench], None]] = {
    "scale": _scale, "storm": _storm, "churn": _churn, "webhook": _webhook,
}  # fmt: skip
WITHOUT_OPERATOR: dict[str, Callable[[_Bench], None]] = {
    "library": _library, "artifacts": _artifacts, "gc": _gc, "real": _real,
    "capture": _capture, "bundles": _bundles,
    "vllm": _vllm, "large": _large, "fleet": _fleet, "oci": _oci, "trust": _trust,
    "broker": _broker,
}  # fmt: skip
# The parts that need no cluster at all: run first, and alone they start none.
WITHOUT_CLUSTER: dict[str, Callable[[dict[str, Any], dict[str, Any]], None]] = {
    "nodemap": _nodemap, "metrics": _metrics, "bids": _bids,
}  # fmt: skip


def _each(
    runners: dict[str, Callable[[_Bench], None]], only: list[str], b: _Bench, steps: _Steps
) -> None:
    for part, runner in runners.items():
        if part in only:
            t = steps.begin(part)
            runner(b)
            steps.done(part, t)


def _with_cluster(
    only: list[str], options: dict[str, Any], results: dict[str, Any], steps: _Steps
) -> None:
    """The parts that need the local control plane (started if needed)."""
    cluster, s3 = ensure_cluster(), ensure_s3()
    env = s3.env()
    operator = None
    if any(p in OPERATOR_PARTS for p in only):
        progress("bench", "installing the operator (a process here, the chart's identity)")
        operator = install(cluster, s3.endpoint)
        assert operator.proc is not None
    b = _Bench(cluster, s3, env, options, results, operator)
    try:
        _each(WITH_OPERATOR, only, b, steps)
    finally:
        if operator is not None:
            operator.stop()
    try:
        _each(WITHOUT_OPERATOR, only, b, steps)
    finally:
        for ns in CREATED:
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def run_parts(only: list[str], options: dict[str, Any]) -> None:
    """Run the parts in order, merge their stamped figures into results.json, write both."""
    results = load()
    steps = _Steps(len(only))
    for part, runner in WITHOUT_CLUSTER.items():
        if part in only:
            t = steps.begin(part)
            runner(options, results)
            steps.done(part, t)
    if any(p not in WITHOUT_CLUSTER for p in only):
        _with_cluster(only, options, results, steps)
    write(results)
