"""A sharded tuning Job's pods without Kubernetes: the real CLIs as processes, as a pod runs them.

One `Pod` is one index of the Indexed Job: tunefleet-sync (the native sidecar) starts first and
runs alongside `python -m tuner_job run` (with the stand-in torch: it computes nothing, its
results are not measurements, and everything it writes says so) and then tunefleet-publish;
the sidecar is SIGTERMed at the end, as the kubelet does. `merge` is the merge Job's pod.
Used by the unit tests (file:// store), the e2e tests and bench/bench_library.py (the real S3
server).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FAKE_TORCH = REPO / "tests" / "unit" / "data" / "fake_torch"
NAMESPACE = "ml"
MODEL = "AMD_Instinct_MI300X_OAM"
IMAGE = "tunefleet.local/standin-inference:2.11.0-standin"
STANDIN_NOTE = "stand-in torch: per-GEMM cost is FAKE_TORCH_TUNE_SLEEP, no GPU, no measurement"
# "[3/40] GemmTunableOp_BFloat16_TN,tn_... in 0.1s": one GEMM torch's offline tuner ran.
_TUNED_PREFIX = "tuner_job: ["


def shape(i: int, *, base: int = 64) -> dict[str, Any]:
    """A distinct bf16 GEMM per i (what nn.Linear without bias runs), recorded as one row."""
    return {"m": base + 16 * (i % 64), "n": 128 + 16 * (i // 64), "k": 64, "transB": True}


def shapes(indices: Iterable[int]) -> list[dict[str, Any]]:
    return [shape(i) for i in indices]


def tuned_keys(stderr: str) -> list[tuple[str, str]]:
    """The GEMMs the tuning process finished, from its per-GEMM log lines."""
    out = []
    for line in stderr.splitlines():
        if line.startswith(_TUNED_PREFIX) and "] " in line and " in " in line:
            sig = line.split("] ", 1)[1].rsplit(" in ", 1)[0]
            op, params = sig.split(",", 1)
            out.append((op, params))
    return out


def tool_env(s3_env: dict[str, str] | None) -> dict[str, str]:
    """tunefleet's image: our packages, S3 settings in the environment only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "JOB_COMPLETION"))}
    env.update(s3_env or {})
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO)])
    return env


def tuner_env(extra: dict[str, str]) -> dict[str, str]:
    """The user's image: the stand-in torch and tuner_job; no S3 credentials."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "PYTORCH_", "TUNEFLEET_", "FAKE_TORCH_", "JOB_COMPLETION"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_TORCH), str(REPO)])
    env.update(extra)
    return env


@dataclass
class JobSpec:
    """What the operator would put into each pod of one Job."""

    uri: str
    profile: str
    gemms: list[dict[str, Any]]
    revision: str = "3f2a9c01de"
    shards: int = 1
    scope: str = "namespace"
    every_gemms: int = 5
    every_seconds: float = 60.0
    min_interval_s: float = 0.0
    poll_s: float = 0.1
    wait_s: float = 60.0
    budget_s: float = 600.0
    s3_env: dict[str, str] | None = None
    torch_env: dict[str, str] = field(default_factory=dict)  # FAKE_TORCH_* for the tune step
    tuning: dict[str, Any] = field(default_factory=dict)  # spec.tuning's shaping fields
    namespace: str = NAMESPACE
    model: str = MODEL

    def common(self) -> list[str]:
        return [
            "--uri", self.uri, "--namespace", self.namespace, "--profile", self.profile,
            "--gpu-model", self.model, "--library-scope", self.scope,
        ]  # fmt: skip


@dataclass
class PodRun:
    index: int
    tune: subprocess.CompletedProcess[str]
    publish: subprocess.CompletedProcess[str] | None
    sync_rc: int | None
    sync_log: str
    tuned: list[tuple[str, str]]
    out: Path
    wall_s: float

    def manifest(self) -> dict[str, Any]:
        return dict(json.loads((self.out / "manifest.json").read_text()))

    def message(self) -> dict[str, Any]:
        assert self.publish is not None
        return dict(json.loads(self.publish.stdout))


class Pod:
    """One pod (index) of the Job, in its own directory: exchange, config, out, logs."""

    def __init__(self, job: JobSpec, root: Path, index: int = 0) -> None:
        self.job, self.index = job, index
        self.dir = root
        self.exchange = root / "exchange"
        self.out = root / "out"
        for d in (self.exchange, self.out):
            d.mkdir(parents=True, exist_ok=True)
        self.config = root / "config.json"
        self.config.write_text(
            json.dumps(
                {
                    "namespace": job.namespace,
                    "profile": job.profile,
                    "gpuModel": job.model,
                    "revision": job.revision,
                    "gpus": 1,
                    "shards": job.shards,
                    "exchange": {"dir": str(self.exchange), "waitSeconds": job.wait_s},
                    "workload": {"shapes": job.gemms},
                    "tuning": {"budgetSeconds": job.budget_s, **job.tuning},
                }
            )
        )
        self.sync: subprocess.Popen[str] | None = None
        self.tuner: subprocess.Popen[str] | None = None
        self.started = time.monotonic()

    def index_env(self) -> dict[str, str]:
        return {"JOB_COMPLETION_INDEX": str(self.index)}

    def start_sync(self) -> None:
        job = self.job
        args = [
            sys.executable, "-m", "tunefleet.artifacts.sync", "--exchange", str(self.exchange),
            *job.common(), "--revision", job.revision, "--shards", str(job.shards),
            "--checkpoint-every-gemms", str(job.every_gemms),
            "--checkpoint-every-seconds", str(job.every_seconds),
            "--min-upload-interval-seconds", str(job.min_interval_s),
            "--poll-seconds", str(job.poll_s),
        ]  # fmt: skip
        self.sync = subprocess.Popen(
            args,
            env={**tool_env(job.s3_env), **self.index_env()},
            stdout=subprocess.DEVNULL,
            stderr=(self.dir / "sync.log").open("w"),
            text=True,
        )

    def start_tune(self) -> None:
        self.started = time.monotonic()
        self.tuner = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tuner_job",
                "--termination-log",
                str(self.dir / "tl"),
                "run",
                "--config",
                str(self.config),
                "--out",
                str(self.out),
            ],
            env=tuner_env({**self.job.torch_env, **self.index_env()}),
            cwd=self.dir,
            stdout=(self.dir / "tune.out").open("w"),
            stderr=(self.dir / "tune.log").open("w"),
            text=True,
        )

    def wait_tune(self, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        assert self.tuner is not None
        rc = self.tuner.wait(timeout=timeout)
        return subprocess.CompletedProcess(
            self.tuner.args, rc, (self.dir / "tune.out").read_text(), self.tune_log()
        )

    def tune_log(self) -> str:
        path = self.dir / "tune.log"
        return path.read_text() if path.exists() else ""

    def tuning_child(self) -> int | None:
        """The tuning process (its own session: the mgpu workers join its group)."""
        assert self.tuner is not None
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.tuner.pid:
                return int(stat.parent.name)
        return None

    def progress_gemms(self) -> int:
        path = self.exchange / "progress.csv"
        if not path.exists():
            return 0
        return sum(1 for ln in path.read_text().splitlines() if not ln.startswith("Validator,"))

    def publish(self) -> subprocess.CompletedProcess[str]:
        job = self.job
        args = [
            sys.executable, "-m", "tunefleet.artifacts.publish", "--dir", str(self.out),
            *job.common(), "--image-reference", IMAGE,
            "--termination-log", str(self.dir / "publish-tl"), "--timeout-seconds", "60",
        ]  # fmt: skip
        if job.shards > 1:
            args += ["--shards", str(job.shards)]
        return subprocess.run(
            args,
            env={**tool_env(job.s3_env), **self.index_env()},
            capture_output=True,
            text=True,
            timeout=120,
        )

    def stop_sync(self, sig: int = signal.SIGTERM) -> int | None:
        """The kubelet's SIGTERM once publish has exited (SIGKILL: the node is gone)."""
        if self.sync is None:
            return None
        if self.sync.poll() is None:
            self.sync.send_signal(sig)
        try:
            # It ends within a second or two here; one CI run (2 cores, the cluster up beside
            # the suite) saw it pass 60 s once. Wait longer, and fail with its log, not a bare
            # timeout, so a real hang says where it was.
            return self.sync.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.sync.kill()
            self.sync.wait()
            raise AssertionError(
                f"the sync sidecar did not end within 120 s of {signal.Signals(sig).name}; "
                f"its log:\n{self.sync_log()[-4000:]}"
            ) from None
        finally:
            self.sync = None

    def sync_log(self) -> str:
        path = self.dir / "sync.log"
        return path.read_text() if path.exists() else ""

    def run(self, *, publish: bool = True, timeout: float = 600) -> PodRun:
        self.start_sync()
        self.start_tune()
        tune = self.wait_tune(timeout)
        pub = self.publish() if publish and tune.returncode == 0 else None
        rc = self.stop_sync()
        return PodRun(
            self.index,
            tune,
            pub,
            rc,
            self.sync_log(),
            tuned_keys(tune.stderr),
            self.out,
            time.monotonic() - self.started,
        )

    def kill(self, *, sidecar_too: bool) -> None:
        """SIGKILL the tuning process's group mid-run (and the sidecar: a lost node)."""
        child = self.tuning_child()
        assert child is not None, "no tuning process to kill"
        if sidecar_too and self.sync is not None:
            self.sync.kill()
        os.killpg(child, signal.SIGKILL)


def run_job(job: JobSpec, root: Path, *, concurrent: bool = True) -> list[PodRun]:
    """Every index of the Job, as concurrent pods (an Indexed Job with parallelism N)."""
    pods = [Pod(job, root / f"pod-{i}", i) for i in range(job.shards)]
    if not concurrent:
        return [p.run() for p in pods]
    for p in pods:
        p.start_sync()
        p.start_tune()
    runs = []
    for p in pods:
        tune = p.wait_tune()
        pub = p.publish() if tune.returncode == 0 else None
        rc = p.stop_sync()
        runs.append(
            PodRun(
                p.index,
                tune,
                pub,
                rc,
                p.sync_log(),
                tuned_keys(tune.stderr),
                p.out,
                time.monotonic() - p.started,
            )
        )
    return runs


def merge(job: JobSpec, root: Path) -> subprocess.CompletedProcess[str]:
    """The merge Job's pod."""
    root.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable, "-m", "tunefleet.artifacts.merge", *job.common(),
        "--revision", job.revision, "--shards", str(job.shards), "--image-reference", IMAGE,
        "--termination-log", str(root / "merge-tl"), "--timeout-seconds", "120",
    ]  # fmt: skip
    return subprocess.run(
        args, env=tool_env(job.s3_env), capture_output=True, text=True, timeout=300
    )


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def all_tuned(runs: Sequence[PodRun]) -> list[tuple[str, str]]:
    return [k for r in runs for k in r.tuned]
