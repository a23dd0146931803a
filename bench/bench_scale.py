"""Operator scale: N one-model TuningProfiles over M namespaces, created at once, then a
restart with all of them present, then all deleted; the operator's lag behind the API server,
its resident memory at every point, its CPU.

    python -m bench scale --profiles 10000 --namespaces 100     # one size, merged into results
    python -m bench scale --sizes 1000:10,3000:30,10000:100     # what `make bench` runs
    python -m bench scale --profiles 3000 --namespaces 30 --py-spy /tmp/prof --no-write
    python -m bench scale --sizes 1000:10 --operator-source /tmp/checkout-of-before

What the clock starts on. "Last Job after create" starts when the last profile has been
created (every profile is in etcd) and stops when the API server has sent the Nth tuning Job's
ADDED event on a watch (metadata only) opened before the first create. Two ways to create:
--create kubectl (the default, the goal's own wording: one `kubectl create -f` of a List of N,
which POSTs them one at a time; the clock starts when kubectl exits) and --create rest (8
connections of this process, one POST each: ~5x kubectl's rate, a burst that leaves the
operator less slack during the creates, not more).

How fast the API server takes creates alone (no operator running, same 8 connections, same
profile bodies) is measured first, on min(N, 3000) profiles in a namespace of its own, so the
target can be judged against it.

Memory is the operator process's VmRSS (/proc/<pid>/status) sampled every 0.25 s; CPU is its
utime + stime (/proc/<pid>/stat). The "empty" figure is the operator's settled RSS after a
fresh start with none of this run's profiles present: the baseline deletion must return to.

--py-spy DIR records the operator with py-spy (collapsed stacks, --gil, 50 Hz) during the
apply and the restart; --tracemalloc DIR runs it under tracemalloc (25 frames) and dumps a
snapshot at each phase (bench/tracemalloc_hook/): slower, so its figures are not written.
--malloc-info DIR dumps glibc's malloc_info and the process's smaps at each phase instead,
untraced (the allocator's layout as in production): what the heap keeps that Python does not.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes

from bench.scrape import scrape
from testbed.builders.objects import bench_profile, manifest, object_list

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "bench" / "tracemalloc_hook"
GROUP, VERSION, PLURAL = "tunefleet.io", "v1alpha1", "tuningprofiles"
JOB_SELECTOR = "app.kubernetes.io/managed-by=tunefleet,tunefleet.io/profile-uid"
CREATE_CONNECTIONS = 8
CREATE_MODES = ("kubectl", "rest")
META_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def profile(name: str, i: int) -> dict[str, Any]:
    """One-model profile; each one's shapes differ, so nothing can be shared between them
    (real fleets' profiles differ) and each makes its own revision."""
    return bench_profile(name, mnk=(64 + i % 4096, 64 + i // 4096, 64))


# --- the API server, as cheaply as this process can reach it ------------------------------


class Api:
    """Raw REST calls over the admin kubeconfig's connection pool: the bench must not be what
    the 2 cores spend their time on (kubernetes.client's (de)serialization costs ~ms a call)."""

    def __init__(self, kubeconfig: str) -> None:
        self.client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
        self.client.configuration.connection_pool_maxsize = CREATE_CONNECTIONS + 4
        self.client.rest_client = kubernetes.client.rest.RESTClientObject(
            self.client.configuration, maxsize=CREATE_CONNECTIONS + 4
        )
        self.host = self.client.configuration.host
        self.pool = self.client.rest_client.pool_manager
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        self.client.update_params_for_auth(self.headers, [], ["BearerToken"])

    def request(
        self, method: str, path: str, body: bytes | None = None, **kw: Any
    ) -> Any:  # urllib3.BaseHTTPResponse
        return self.pool.request(
            method, self.host + path, body=body, headers={**self.headers, **kw.pop("headers", {})},
            **kw,
        )  # fmt: skip

    def create_profile(self, ns: str, body: bytes) -> None:
        resp = self.request("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}", body)
        if resp.status != 201:
            raise RuntimeError(f"create in {ns}: {resp.status} {resp.data[:300]!r}")

    def namespace(self, ns: str) -> None:
        body = json.dumps(manifest("v1", "Namespace", ns))
        resp = self.request("POST", "/api/v1/namespaces", body.encode())
        if resp.status not in (201, 409):
            raise RuntimeError(f"namespace {ns}: {resp.status} {resp.data[:300]!r}")

    def delete_namespace(self, ns: str) -> None:
        self.request("DELETE", f"/api/v1/namespaces/{ns}")

    def namespace_exists(self, ns: str) -> bool:
        return bool(self.request("GET", f"/api/v1/namespaces/{ns}").status == 200)

    def delete_profiles(self, ns: str) -> None:
        """One DELETE of the collection per namespace (what `kubectl delete tp --all` asks,
        without listing first)."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}"
        resp = self.request("DELETE", path, timeout=600.0)
        if resp.status != 200:
            raise RuntimeError(f"delete in {ns}: {resp.status} {resp.data[:300]!r}")

    def stream(
        self, path: str, params: dict[str, str], meta_only: bool
    ) -> Iterator[dict[str, Any]]:
        """A watch's events, parsed, until the server ends it."""
        query = "&".join(f"{k}={v}" for k, v in params.items())
        headers = {"Accept": META_ONLY} if meta_only else {}
        resp = self.request(
            "GET", f"{path}?{query}", headers=headers, preload_content=False, timeout=None
        )
        if resp.status != 200:
            raise RuntimeError(f"watch {path}: {resp.status} {resp.data[:300]!r}")
        buf = b""
        try:
            for chunk in resp.stream(1 << 16):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.release_conn()


class Watch:
    """One kind, cluster-wide, from before the first create: when each object of this run's
    namespaces was first seen, and which are still there."""

    def __init__(
        self,
        api: Api,
        path: str,
        prefix: str,
        labels: str = "",
        meta_only: bool = True,
        done: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.api, self.path, self.prefix, self.labels = api, path, prefix, labels
        self.meta_only, self.done = meta_only, done
        self.alive: set[str] = set()
        self.finished: set[str] = set()  # uids for which done(object) was true
        self.added_at: list[float] = []  # the monotonic time of each first ADDED
        self.last_event = time.monotonic()  # of the last event about this run's objects
        self.changed = threading.Condition()
        self._stop = False
        self._rv = ""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Watch:
        # Start from "now": the list's resourceVersion (nothing of this run exists yet).
        resp = self.api.request("GET", f"{self.path}?limit=1")
        self._rv = json.loads(resp.data)["metadata"]["resourceVersion"]
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop = True

    def _run(self) -> None:
        while not self._stop:
            params = {"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": "600",
                      "resourceVersion": self._rv}  # fmt: skip
            if self.labels:
                params["labelSelector"] = self.labels
            try:
                for event in self.api.stream(self.path, params, self.meta_only):
                    self._event(event)
                    if self._stop:
                        return
            except Exception as e:  # a dropped stream: resume from the last version seen
                print(f"bench watch {self.path}: {e}; resuming", flush=True)
                time.sleep(0.5)

    def _event(self, event: dict[str, Any]) -> None:
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        self._rv = meta.get("resourceVersion") or self._rv
        if event.get("type") == "ERROR":
            raise RuntimeError(f"watch error: {obj}")
        if event.get("type") == "BOOKMARK" or not meta.get("namespace", "").startswith(self.prefix):
            return
        uid, now = meta["uid"], time.monotonic()
        self.last_event = now
        with self.changed:
            if event["type"] == "DELETED":
                self.alive.discard(uid)
                self.finished.discard(uid)
            else:
                if uid not in self.alive:
                    self.alive.add(uid)
                    if event["type"] == "ADDED":
                        self.added_at.append(now)
                if self.done is not None and self.done(obj):
                    self.finished.add(uid)
            self.changed.notify_all()

    def wait(self, ok: Callable[[Watch], bool], what: str, timeout: float) -> float:
        """Block until ok(self); returns the monotonic time it first held."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not ok(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{what}: not within {timeout:.0f}s ({len(self.alive)} present, "
                        f"{len(self.finished)} done)"
                    )
                self.changed.wait(min(left, 1.0))
            return time.monotonic()


def warm(api: Api, ns: str) -> None:
    """One profile, until its status lists its Job; then deleted, until its Job is gone (its
    namespace is deleted without waiting: on this cluster one deleted seconds after its
    first objects can stay Terminating for many minutes)."""
    api.namespace(ns)
    profiles = Watch(
        api, f"/apis/{GROUP}/{VERSION}/{PLURAL}", ns, meta_only=False,
        done=lambda p: bool((p.get("status") or {}).get("jobs")),
    ).start()  # fmt: skip
    jobs = Watch(api, "/apis/batch/v1/jobs", ns, labels=JOB_SELECTOR).start()
    api.create_profile(ns, json.dumps(profile("warm", 0)).encode())
    profiles.wait(lambda w: len(w.finished) >= 1, "the warm-up profile's status", timeout=300)
    api.delete_profiles(ns)
    jobs.wait(lambda w: not w.alive, "the warm-up Job gone", timeout=300)
    profiles.stop()
    jobs.stop()
    api.delete_namespace(ns)


def quiet(watches: list[Watch], seconds: float, timeout: float = 600.0) -> float:
    """Wait until none of `watches` has seen an event for `seconds` (the burst's tail: status
    rewritten as pods are scheduled); returns when the last event came (monotonic)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = max(w.last_event for w in watches)
        if time.monotonic() - last >= seconds:
            return last
        time.sleep(1.0)
    return max(w.last_event for w in watches)


def create_all(api: Api, items: list[tuple[str, bytes]], rate: float = 0.0) -> tuple[float, float]:
    """POST every profile over CREATE_CONNECTIONS connections, each sent no sooner than
    `rate` a second allows (0: as fast as they go); (first sent, last answered)."""
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=CREATE_CONNECTIONS) as pool:
        sent = []
        for i, (ns, body) in enumerate(items):
            if rate and (due := start + i / rate - time.monotonic()) > 0:
                time.sleep(due)
            sent.append(pool.submit(api.create_profile, ns, body))
        for f in concurrent.futures.as_completed(sent):
            f.result()
    return start, time.monotonic()


def kubectl_create(cluster: Any, items: list[tuple[str, bytes]]) -> tuple[float, float]:
    """`kubectl create -f` of one List holding every profile; (started, kubectl exited)."""
    profiles = []
    for ns, body in items:
        item = json.loads(body)
        item["metadata"]["namespace"] = ns  # the REST path names it in the URL instead
        profiles.append(item)
    listed = object_list(profiles)
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="bench-scale-") as f:
        json.dump(listed, f)
        f.flush()
        start = time.monotonic()
        cluster.kubectl("create", "-f", f.name, "-o", "name", timeout=7200)
        return start, time.monotonic()


def bodies(namespaces: list[str], n: int) -> list[tuple[str, bytes]]:
    """Round-robin over the namespaces, so every namespace fills at once."""
    return [
        (namespaces[i % len(namespaces)], json.dumps(profile(f"p{i:05d}", i)).encode())
        for i in range(n)
    ]


# --- the operator process -----------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def allocator(pid: int) -> str:
    """The malloc the operator runs under (tunefleet/__main__.py): jemalloc if mapped."""
    return "jemalloc" if "libjemalloc" in Path(f"/proc/{pid}/maps").read_text() else "glibc"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler:
    """The operator's RSS every 0.25 s: peak, and the series (for the notes)."""

    def __init__(self, pid: Callable[[], int]) -> None:
        self.pid, self.peak = pid, 0.0
        self.series: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError, AssertionError):
                rss = rss_mib(self.pid())
                self.peak = max(self.peak, rss)
                self.series.append((round(time.monotonic() - self._t0, 1), round(rss, 1)))
            self._stop.wait(0.25)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()


def idle_cpu(pid: int, seconds: float) -> float:
    before, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return round(100 * (cpu_seconds(pid) - before) / (time.monotonic() - t0), 2)


def settle(pid: int, quiet: float = 5.0, below: float = 5.0, timeout: float = 600.0) -> float:
    """Wait until the operator spends under `below`% of a core over `quiet` s; returns the
    seconds waited (how long the work after a restart or a deletion kept it busy)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if idle_cpu(pid, quiet) < below:
            return round(time.monotonic() - t0 - quiet, 1)
    return round(time.monotonic() - t0, 1)


class PySpy:
    """py-spy recording the operator (collapsed stacks of the GIL holder) into DIR/NAME.txt."""

    def __init__(self, out: Path | None, name: str, pid: int) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        if out is None:
            return
        out.mkdir(parents=True, exist_ok=True)
        exe = Path(sys.executable).parent / "py-spy"
        self.proc = subprocess.Popen(
            [str(exe), "record", "--pid", str(pid), "--rate", "50", "--gil", "--nonblocking",
             "--format", "raw", "--output", str(out / f"{name}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=60)


def snapshot(operator: Any, out: Path | None, name: str) -> None:
    """--tracemalloc: ask the operator for a snapshot (bench/tracemalloc_hook) and wait for it."""
    if out is None:
        return
    target = out / f"{name}.snapshot"
    target.unlink(missing_ok=True)
    (out / "next").write_text(str(target))
    os.kill(operator.proc.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 120
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.5)


# --- the routine --------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """How a size runs, as the command line chose: `py_spy`, where py-spy's recordings go;
    `tracemalloc`, where the hook's dumps go at each phase; `trace`, under tracemalloc (else
    malloc_info and smaps only, with the allocator's layout as in production); `create`, one of
    CREATE_MODES; `rate`, --create rest's profiles a second (0: as fast as they go)."""

    py_spy: Path | None = None
    tracemalloc: Path | None = None
    trace: bool = True
    create: str = "kubectl"
    rate: float = 0.0


DEFAULTS = Options()


@dataclass(frozen=True)
class _Size:
    """One size's run as its phases share it: the cluster, the operator process, the API, the
    profiles and their namespaces, and the figures the phases write (out, series)."""

    cluster: Any
    operator: Any
    api: Api
    n: int
    stamp: str
    prefix: str
    namespaces: list[str]
    items: list[tuple[str, bytes]]
    options: Options
    out: dict[str, Any]
    series: dict[str, list[tuple[float, float]]]

    @property
    def start_timeout(self) -> float:
        traced = self.options.tracemalloc is not None and self.options.trace
        return 300.0 if traced else 120.0  # ~10x slower traced


def _under_hook(operator: Any, options: Options) -> str | None:
    """--tracemalloc DIR (or --malloc-info): the operator's environment loads the snapshot
    hook, and tracemalloc when `trace`; returns its PYTHONPATH before, for _restore."""
    before_path: str | None = operator.env.get("PYTHONPATH")
    tracemalloc = options.tracemalloc
    if tracemalloc is not None:
        tracemalloc.mkdir(parents=True, exist_ok=True)
        path = os.pathsep.join(p for p in (str(HOOK), before_path) if p)
        operator.env.update(
            {"PYTHONPATH": path, "TUNEFLEET_BENCH_SNAPSHOT": str(tracemalloc / "next")}
        )
        if options.trace:
            operator.env["PYTHONTRACEMALLOC"] = "25"
    return before_path


def _restore(s: _Size, before_path: str | None) -> None:
    """Whatever happened: this size's namespaces deleted, the RSS series written beside the
    profilers' output, the operator's environment as it was."""
    for ns in s.namespaces:
        s.api.delete_namespace(ns)
    for where in (s.options.py_spy, s.options.tracemalloc):
        if where is not None:
            (where / f"rss-{s.n}.json").write_text(json.dumps(s.series))
    s.operator.env.pop("PYTHONTRACEMALLOC", None)
    s.operator.env.pop("PYTHONPATH", None)
    if before_path is not None:
        s.operator.env["PYTHONPATH"] = before_path


def _apiserver_alone(s: _Size) -> None:
    """1. The API server alone: creates with no operator running."""
    s.operator.kill()
    alone_ns = f"bench-alone-{s.stamp}"
    s.api.namespace(alone_ns)
    sample = s.items[: min(s.n, 3000)]
    first, last = create_all(s.api, [(alone_ns, body) for _, body in sample])
    s.out["apiserver_alone_creates_per_s"] = round(len(sample) / (last - first), 1)
    s.out["apiserver_alone_sample"] = len(sample)
    s.api.delete_namespace(alone_ns)
    deadline = time.monotonic() + 600
    while s.api.namespace_exists(alone_ns) and time.monotonic() < deadline:
        time.sleep(2)


def _empty(s: _Size) -> None:
    """2. The empty operator: a fresh start, settled ("cold"), then once one profile has been
    tuned and deleted (every module a reconcile needs imported: boto3's alone is ~10 MiB),
    settled again: the empty operator deletion is compared with."""
    operator, out = s.operator, s.out
    operator.start(timeout=s.start_timeout)
    settle(operator.proc.pid)
    time.sleep(45)  # past a housekeeping pass (every 30 s), which hands back the heap
    out["rss_empty_cold_mib"] = round(operator.rss_mib(), 1)
    out["allocator"] = allocator(operator.proc.pid)
    warm(s.api, f"bench-warm-{s.stamp}")
    settle(operator.proc.pid)
    time.sleep(45)
    out["rss_empty_mib"] = round(operator.rss_mib(), 1)
    snapshot(operator, s.options.tracemalloc, "0-empty")


def _watches(s: _Size) -> tuple[Watch, Watch]:
    """This size's namespaces, and the watches on their Jobs and profiles, opened before the
    first create; (jobs, profiles)."""
    for ns in s.namespaces:
        s.api.namespace(ns)
    jobs = Watch(s.api, "/apis/batch/v1/jobs", s.prefix, labels=JOB_SELECTOR).start()
    profiles = Watch(
        s.api,
        f"/apis/{GROUP}/{VERSION}/{PLURAL}",
        s.prefix,
        meta_only=False,
        done=lambda p: bool((p.get("status") or {}).get("jobs")),
    ).start()
    return jobs, profiles


def _create(s: _Size) -> tuple[float, float]:
    """Every profile created the chosen way; (first, last) as kubectl_create or create_all."""
    if s.options.create == "kubectl":
        return kubectl_create(s.cluster, s.items)
    return create_all(s.api, s.items, s.options.rate)


def _apply(s: _Size, jobs: Watch, profiles: Watch) -> float:
    """3. Apply: every profile created, until the Nth Job and every status are seen; returns
    when the creates ended (the clock's start)."""
    n, out = s.n, s.out
    pid = s.operator.proc.pid
    cpu0 = cpu_seconds(pid)
    spy = PySpy(s.options.py_spy, "apply", pid)
    with Sampler(lambda: pid) as rss:
        first, last = _create(s)
        cpu_create = cpu_seconds(pid)
        out["create_s"] = round(last - first, 1)
        out["create_per_s"] = round(n / (last - first), 1)
        out["jobs_present_when_create_returned"] = len(jobs.alive)
        at = jobs.wait(lambda w: len(w.alive) >= n, f"{n} Jobs", timeout=1800)
        out["last_job_after_create_s"] = round(at - last, 1)
        at = profiles.wait(lambda w: len(w.finished) >= n, "every status", timeout=1800)
        out["last_status_after_create_s"] = round(at - last, 1)
    spy.stop()
    out["operator_cpu_s_during_create"] = round(cpu_create - cpu0, 1)
    out["operator_cpu_s_apply"] = round(cpu_seconds(pid) - cpu0, 1)
    out["rss_peak_apply_mib"] = round(rss.peak, 1)
    s.series["apply"] = rss.series
    return last


def _settled(s: _Size, jobs: Watch, profiles: Watch, last: float) -> None:
    """The operator once the apply's burst has passed: idle CPU, RSS, a scrape's cost."""
    operator, out = s.operator, s.out
    pid = operator.proc.pid
    # Idle is after the burst's tail: no status or Job written for 20 s.
    tail = quiet([jobs, profiles], 20.0)
    out["last_write_after_create_s"] = round(tail - last, 1)
    out["idle_cpu_percent_of_a_core"] = idle_cpu(pid, 60)
    out["rss_settled_mib"] = round(operator.rss_mib(), 1)
    # What a Prometheus scrape of this operator costs with every profile in its cache.
    port = operator.env["TUNEFLEET_METRICS_PORT"]
    out["metrics_scrape"] = scrape(f"http://127.0.0.1:{port}/metrics")
    snapshot(operator, s.options.tracemalloc, "1-settled")


def _restart(s: _Size) -> None:
    """4. Restart with everything present."""
    operator, out = s.operator, s.out
    operator.kill()
    t0 = time.monotonic()
    with Sampler(lambda: operator.proc.pid) as rss:
        operator.start(timeout=s.start_timeout, listening_only=True)
        out["restart_to_webhook_listening_s"] = round(time.monotonic() - t0, 1)
        # The reconciler starts once every kind is listed (handlers/startup.py).
        operator.wait_started(timeout=s.start_timeout)
        out["restart_to_reconciling_s"] = round(time.monotonic() - t0, 1)
        spy = PySpy(s.options.py_spy, "restart", operator.proc.pid)
        cpu0 = cpu_seconds(operator.proc.pid)
        out["restart_busy_s"] = settle(operator.proc.pid, quiet=5.0)
        spy.stop()
        time.sleep(10)
    out["operator_cpu_s_restart"] = round(cpu_seconds(operator.proc.pid) - cpu0, 1)
    out["rss_peak_restart_mib"] = round(rss.peak, 1)
    s.series["restart"] = rss.series
    out["rss_after_restart_mib"] = round(operator.rss_mib(), 1)
    snapshot(operator, s.options.tracemalloc, "2-restarted")


def _delete(s: _Size, jobs: Watch, profiles: Watch) -> None:
    """5. Delete every profile (garbage collection takes Jobs, ConfigMaps, pods); then the
    watches end."""
    operator, out = s.operator, s.out
    pid = operator.proc.pid
    with Sampler(lambda: pid) as rss:
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=CREATE_CONNECTIONS) as pool:
            list(pool.map(s.api.delete_profiles, s.namespaces))
        at = jobs.wait(lambda w: not w.alive, "all Jobs gone", timeout=1800)
        out["delete_to_all_jobs_gone_s"] = round(at - t0, 1)
        profiles.wait(lambda w: not w.alive, "all profiles gone", timeout=600)
        settle(pid)
        time.sleep(40)  # housekeeping (every 30 s) hands freed memory back
    out["rss_peak_delete_mib"] = round(rss.peak, 1)
    s.series["delete"] = rss.series
    out["rss_after_delete_mib"] = round(operator.rss_mib(), 1)
    out["rss_after_delete_over_empty"] = round(
        out["rss_after_delete_mib"] / out["rss_empty_mib"], 3
    )
    out["rss_after_delete_over_cold"] = round(
        out["rss_after_delete_mib"] / out["rss_empty_cold_mib"], 3
    )
    snapshot(operator, s.options.tracemalloc, "3-deleted")
    jobs.stop()
    profiles.stop()


def _summary(s: _Size) -> None:
    """The figures over the phases, once the namespaces are on their way out."""
    out = s.out
    out["rss_max_mib"] = max(
        out[k] for k in ("rss_peak_apply_mib", "rss_settled_mib", "rss_peak_restart_mib",
                         "rss_peak_delete_mib", "rss_after_delete_mib")
    )  # fmt: skip
    out["namespaces_removed"] = wait_namespaces_gone(s.api, s.namespaces)
    out["operator_cpu_ms_per_profile_apply"] = round(1000 * out["operator_cpu_s_apply"] / s.n, 2)
    out["goals"] = GOALS if s.options.create == "kubectl" else BURST_GOALS


def run(
    cluster: Any, operator: Any, n: int, spaces: int, options: Options = DEFAULTS
) -> dict[str, Any]:
    """One size: `n` profiles over `spaces` namespaces, through the phases in order (1-5); the
    namespaces and the operator's environment restored whatever happened."""
    api = Api(cluster.kubeconfig)
    stamp = f"{int(time.time()) % 100000}"
    prefix = f"bench-s{n}-{stamp}-"
    namespaces = [f"{prefix}{k:03d}" for k in range(spaces)]
    items = bodies(namespaces, n)
    out: dict[str, Any] = {"profiles": n, "namespaces": spaces, "created_by": options.create}
    if options.create == "rest":
        out["paced_at_per_s"] = options.rate or None  # None: as fast as the connections went
    s = _Size(cluster, operator, api, n, stamp, prefix, namespaces, items, options, out, {})
    before_path = _under_hook(operator, options)
    try:
        _apiserver_alone(s)
        _empty(s)
        jobs, profiles = _watches(s)
        last = _apply(s, jobs, profiles)
        _settled(s, jobs, profiles, last)
        _restart(s)
        _delete(s, jobs, profiles)
    finally:
        _restore(s, before_path)
    _summary(s)
    print(f"scale {n}: {json.dumps(out)}", flush=True)
    return out


GOALS = {
    "last_job_after_create_s": "<= 30 (10,000 profiles over 100 namespaces)",
    "rss_max_mib": "<= 384 at every point: apply, settled, restart, deletion",
    "rss_after_delete_over_empty": "<= 1.10",
    "idle_cpu_percent_of_a_core": "<= 2",
}

# Issue 42's burst (--create rest, paced at BURST_RATE a second), at 10,000 profiles over 100
# namespaces.
BURST_RATE = 80.0
BURST_GOALS = {
    "last_job_after_create_s": "<= 30",
    "last_status_after_create_s": "<= 60",
    "operator_cpu_ms_per_profile_apply": "<= 5",
    "rss_settled_mib": "<= 256",
    "rss_after_delete_over_empty": "<= 1.15",
    "restart_to_webhook_listening_s": "<= 10",
    "metrics_scrape": "<= 100 ms and <= 2 MB, no series per profile by default",
}


def wait_namespaces_gone(api: Api, prefix_spaces: list[str], timeout: float = 900) -> bool:
    deadline = time.monotonic() + timeout
    left = list(prefix_spaces)
    while left and time.monotonic() < deadline:
        left = [ns for ns in left if api.namespace_exists(ns)]
        if left:
            time.sleep(3)
    return not left


def parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        n, _, m = part.partition(":")
        out.append((int(n), int(m or max(1, int(n) // 100))))
    return out


SIZES = "1000:10,3000:30,10000:100"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__)
    parser.add_argument("--profiles", type=int)
    parser.add_argument("--namespaces", type=int)
    parser.add_argument("--sizes", default=SIZES, help="N:namespaces,... (default %(default)s)")
    parser.add_argument("--py-spy", type=Path)
    parser.add_argument("--tracemalloc", type=Path)
    parser.add_argument(
        "--malloc-info",
        type=Path,
        help="dump glibc's malloc_info and smaps at each phase here (no tracemalloc)",
    )
    parser.add_argument(
        "--create",
        choices=CREATE_MODES,
        default="kubectl",
        help="kubectl: one `kubectl create -f` (the goal's wording); rest: 8 connections "
        "paced by --rate (a burst); default %(default)s",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=BURST_RATE,
        help="--create rest: profiles a second (issue 42's burst: %(default)s); 0: as fast as "
        "the connections go",
    )
    parser.add_argument("--no-write", action="store_true", help="print, do not merge results")
    parser.add_argument(
        "--operator-source",
        type=Path,
        help="run the operator from another checkout's operator/ (a change's 'before'); "
        "its figures are printed, not written",
    )
    return parser


def main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    sizes = (
        [(args.profiles, args.namespaces or max(1, args.profiles // 100))]
        if args.profiles
        else parse_sizes(args.sizes)
    )
    from bench.results import load, progress, stamped, write
    from testbed.cluster import ensure_cluster, ensure_s3
    from testbed.operator import install

    cluster, s3 = ensure_cluster(), ensure_s3()
    operator = install(cluster, s3.endpoint)
    if args.operator_source:
        operator.env["PYTHONPATH"] = str(args.operator_source.resolve() / "operator")
    got: dict[str, Any] = {}
    try:
        for i, (n, m) in enumerate(sizes, start=1):
            progress("scale", f"size {i}/{len(sizes)}: {n} profiles over {m} namespaces")
            dumps, trace = (
                (args.tracemalloc, True) if args.tracemalloc else (args.malloc_info, False)
            )
            options = Options(args.py_spy, dumps, trace, args.create, args.rate)
            got[str(n)] = stamped(run(cluster, operator, n, m, options))
    finally:
        operator.stop()
        print(f"operator log: {operator.log}", flush=True)
    if args.no_write or args.tracemalloc or args.malloc_info or args.operator_source:
        return
    results = load()
    results.pop("scale_1000_profiles", None)
    # The goal's figures (kubectl) under "scale", the burst's beside them.
    results.setdefault("scale" if args.create == "kubectl" else "scale_rest", {}).update(got)
    write(results)
