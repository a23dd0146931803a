"""Publish and fetch time for a 1 MB results file against a real S3 server (median of N runs).

Two views of each: the library call the CLIs make (upload/download, checks and file writes,
a warm boto3 client), and the CLI as a pod runs it (a fresh Python process: interpreter start,
boto3 import, client, transfer, checks), which is what an init container adds to pod start.

Each run publishes a different file (one row's solution changes) so that every publish really
uploads instead of finding its identical artifact already there. The results file is generated
in TunableOp's format; its rows are synthetic.

    python -m bench.bench_artifacts [--runs N]   # S3 from $AWS_* env or .tunefleet/s3.env
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import boto3

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from tunefleet.artifacts.fetch import Pinned, fetch  # noqa: E402
from tunefleet.artifacts.publish import Output, publish  # noqa: E402
from tunefleet.storage.registry import parse_uri  # noqa: E402
from tunefleet.storage.s3 import S3Store  # noqa: E402
from tuner_job.manifest import ArtifactId, Manifest  # noqa: E402
from tuner_job.output import RunFacts, write_output  # noqa: E402
from tuner_job.results import parse_results  # noqa: E402

SIZE = 1_000_000
MODEL = "BENCH-GPU"


class S3Like(Protocol):
    endpoint: str
    access_key: str
    secret_key: str
    region: str
    bucket: str


def results_text(variant: int, size: int = SIZE) -> str:
    head = (
        "Validator,PT_VERSION,2.11.0\nValidator,ROCM_VERSION,6.4.1\n"
        "Validator,HIPBLASLT_VERSION,100000-43e8d0cd1e\nValidator,GCN_ARCH_NAME,gfx942\n"
    )
    rows, i = [], 0
    total = len(head)
    while total < size:
        m, n, k = 128 * (1 + i % 97), 64 * (1 + i // 97), 4096
        solution = variant if i == 0 else 1000 + i
        line = (
            f"GemmTunableOp_BFloat16_TN,tn_{m}_{n}_{k}_ld_{k}_{k}_{m},"
            f"Gemm_Hipblaslt_{solution},{0.001 * (i % 500 + 1):.4f}\n"
        )
        rows.append(line)
        total += len(line)
        i += 1
    return head + "".join(rows)


def write_artifact(out: Path, variant: int) -> Manifest:
    results = parse_results(results_text(variant))
    return write_output(
        out,
        results,
        ArtifactId(namespace="bench", profile="artifacts", revision="bench", gpu_model=MODEL),
        RunFacts(
            recorded=results.gemms,
            identity={"gpuName": "synthetic bench data"},
            seconds=0.0,
            tool_version="bench",
        ),
    )


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def _client(s3: S3Like) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        region_name=s3.region,
    )


def _cli_env(s3: S3Like) -> dict[str, str]:
    """The environment a pod gives the CLIs: the store's settings, the code on the path."""
    return {
        **os.environ,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_REGION": s3.region,
        "AWS_ENDPOINT_URL_S3": s3.endpoint,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)]),
    }


@dataclass
class _Times:
    """Each run's seconds, per way of publishing and fetching; the last results file's size."""

    pub_s: list[float] = field(default_factory=list)
    fetch_s: list[float] = field(default_factory=list)
    cli_pub_s: list[float] = field(default_factory=list)
    cli_fetch_s: list[float] = field(default_factory=list)
    size: int = 0


@dataclass(frozen=True)
class _Round:
    """What every run shares: the warm client, where it publishes, the CLIs' environment, and
    the scratch folder."""

    client: Any
    base_uri: str
    env: dict[str, str]
    work: Path


def _library_run(r: _Round, i: int, times: _Times) -> None:
    """Run i through the library calls (a warm client): publish, then fetch what it made."""
    out = r.work / f"out{i}"
    manifest = write_artifact(out, variant=i)
    times.size = (out / "results.csv").stat().st_size
    store = S3Store(parse_uri(r.base_uri), client=r.client, timeout_s=60)
    t0 = time.perf_counter()
    pub = publish(Output(out, r.base_uri, "bench", "artifacts", MODEL), store=store)
    times.pub_s.append(time.perf_counter() - t0)
    assert pub.created
    fstore = S3Store(parse_uri(pub.uri), client=r.client, timeout_s=60)
    t0 = time.perf_counter()
    got = fetch(Pinned(pub.uri, manifest.results_sha256), r.work / f"dest{i}", store=fstore)
    times.fetch_s.append(time.perf_counter() - t0)
    assert got.sha256 == manifest.results_sha256


def _timed_cli(cmd: list[str], env: dict[str, str], into: list[float]) -> str:
    """Run a CLI as a pod would (a fresh process); its seconds appended to `into`, its stdout."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    into.append(time.perf_counter() - t0)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)}: {done.stderr}")
    return done.stdout


def _cli_run(r: _Round, i: int, times: _Times) -> None:
    """Run i through the CLIs: publish a file of its own, then fetch it for 8 devices."""
    cli_out = r.work / f"cli{i}"
    cli_manifest = write_artifact(cli_out, variant=10_000 + i)
    publish_cmd = [
        sys.executable, "-m", "tunefleet.artifacts.publish", "--dir", str(cli_out),
        "--uri", r.base_uri, "--namespace", "bench", "--profile", "artifacts",
        "--gpu-model", MODEL, "--termination-log", str(r.work / "tl"),
    ]  # fmt: skip
    uri = json.loads(_timed_cli(publish_cmd, r.env, times.cli_pub_s))["uri"]
    fetch_cmd = [
        sys.executable, "-m", "tunefleet.artifacts.fetch", "--uri", uri,
        "--sha256", cli_manifest.results_sha256, "--dest", str(r.work / f"cdest{i}"),
        "--devices", "8", "--fail-closed",
    ]  # fmt: skip
    _timed_cli(fetch_cmd, r.env, times.cli_fetch_s)


def _delete_prefix(client: Any, bucket: str, base_uri: str) -> None:
    prefix = parse_uri(base_uri).prefix + "/"
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=obj["Key"])


def run(s3_settings: S3Like, runs: int = 7) -> dict[str, Any]:
    s3 = s3_settings
    client = _client(s3)
    base_uri = f"s3://{s3.bucket}/bench-artifacts/{uuid.uuid4().hex[:10]}"
    env = _cli_env(s3)
    times = _Times()
    with tempfile.TemporaryDirectory(prefix="bench-artifacts-") as tmp:
        r = _Round(client, base_uri, env, Path(tmp))
        for i in range(runs):
            _library_run(r, i, times)
            _cli_run(r, i, times)
    _delete_prefix(client, s3.bucket, base_uri)
    return {
        "results_bytes": times.size,
        "runs": runs,
        "publish_median_ms": _ms(times.pub_s),
        "fetch_median_ms": _ms(times.fetch_s),
        "cli_publish_median_ms": _ms(times.cli_pub_s),
        "cli_fetch_8_devices_median_ms": _ms(times.cli_fetch_s),
        "note": (
            "library: warm boto3 client, upload/download + parse + verify + write; "
            "cli: a fresh process as a pod runs it (fetch writes 8 per-ordinal files)"
        ),
    }


class _Settings:
    def __init__(self, env: dict[str, str], bucket: str) -> None:
        self.endpoint = env["AWS_ENDPOINT_URL_S3"]
        self.access_key = env["AWS_ACCESS_KEY_ID"]
        self.secret_key = env["AWS_SECRET_ACCESS_KEY"]
        self.region = env.get("AWS_REGION", "us-east-1")
        self.bucket = bucket


def _settings_from_environment() -> _Settings:
    env = dict(os.environ)
    state = Path(os.environ.get("TUNEFLEET_STATE", ROOT / ".tunefleet")) / "s3.env"
    if "AWS_ENDPOINT_URL_S3" not in env and state.exists():
        for line in state.read_text().splitlines():
            line = line.strip().removeprefix("export ")
            if "=" in line and not line.startswith("#"):
                key, _, value = line.partition("=")
                env.setdefault(key.strip(), shlex.split(value)[0] if value.strip() else "")
    missing = [
        k
        for k in ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        if k not in env
    ]
    if missing:
        raise SystemExit(f"no S3 settings ({', '.join(missing)}): run hack/cluster-up.sh --s3-only")
    return _Settings(env, env.get("TUNEFLEET_S3_BUCKET", "tunefleet"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print(json.dumps(run(_settings_from_environment(), runs=args.runs), indent=2))


if __name__ == "__main__":
    main()
