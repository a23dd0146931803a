"""Reuse, sharding, resume and concurrent library writes against the real S3 server (SeaweedFS
from hack/cluster-up.sh --s3-only; no Kubernetes).

The programs run as a tuning pod runs them (testbed/library_pod.py): tunefleet-sync,
`python -m tuner_job run` with the stand-in torch (PYTHONPATH=tests/unit/data/fake_torch: it
computes nothing, FAKE_TORCH_TUNE_SLEEP gives each GEMM a cost), tunefleet-publish and
tunefleet-merge, each a process with only AWS_* settings in its environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.wrappers import make_tuner_run
from testbed.library_pod import (
    MODEL,
    Pod,
    all_tuned,
    merge,
    run_job,
    tool_env,
    tuned_keys,
    wait_until,
)
from tunefleet.artifacts.fetch import Pinned, Serving, fetch
from tunefleet.artifacts.library import Library, read_library
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.s3 import S3Store
from tuner_job.library import library_key
from tuner_job.manifest import ArtifactId, ManifestExtra
from tuner_job.output import RunFacts, write_output
from tuner_job.results import ResultRow, ResultsFile, format_results, merge_results, read_results

pytestmark = pytest.mark.e2e

ROCM = {"FAKE_TORCH_BACKEND": "rocm"}
VALIDATORS = {"PT_VERSION": "2.11.0", "GCN_ARCH_NAME": "gfx942:sramecc+:xnack-"}
IDENTITY = {"gpuName": "AMD Instinct MI300X", "arch": "gfx942:sramecc+:xnack-"}
FAST = {"FAKE_TORCH_TUNE_SLEEP": "0.01"}  # each GEMM's cost in the stand-in torch


def keys_under(s3: Any, prefix: str) -> list[str]:
    client = s3.client()
    out: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return out


def store_for(s3: Any, message: dict[str, Any]) -> S3Store:
    return S3Store(parse_uri(message["uri"]), client=s3.client(), timeout_s=60)


def test_reuse_through_s3_tunes_only_the_misses(s3: Any, prefix: str, tmp_path: Path) -> None:
    job = make_tuner_run(f"s3://{s3.bucket}/{prefix}", "first", range(0, 24))
    first = Pod(job.fields(s3_env=s3.env()).env(**ROCM, **FAST).obj(), tmp_path / "a").run()
    assert first.publish is not None and first.publish.returncode == 0, first.publish.stderr
    key = first.manifest()["libraryKey"]
    entries = keys_under(s3, f"{prefix}/ml/_library/{MODEL}/{key}/")
    assert len(entries) == 1 and entries[0].endswith(".json")

    job = make_tuner_run(f"s3://{s3.bucket}/{prefix}", "second", range(8, 32))
    second = Pod(job.fields(s3_env=s3.env()).env(**ROCM, **FAST).obj(), tmp_path / "b").run()
    assert second.tune.returncode == 0, second.tune.stderr
    a, b = read_results(first.out / "results.csv"), read_results(second.out / "results.csv")
    assert set(second.tuned) == b.keys() - a.keys() and len(second.tuned) == 8
    message = second.message()
    assert (message["recorded"], message["reused"], message["newlyTuned"]) == (24, 16, 8)
    assert len(keys_under(s3, f"{prefix}/ml/_library/{MODEL}/{key}/")) == 2
    got = fetch(
        Pinned(message["uri"], message["sha256"]), tmp_path / "serve", store=store_for(s3, message)
    )
    assert got.gemms == 24


def test_sharding_through_s3_merges_into_one_artifact(s3: Any, prefix: str, tmp_path: Path) -> None:
    job = make_tuner_run(f"s3://{s3.bucket}/{prefix}-alone", "llama", range(30))
    alone = Pod(job.fields(s3_env=s3.env()).env(**ROCM, **FAST).obj(), tmp_path / "alone").run()
    s3.delete_prefix(prefix + "-alone/")
    job = make_tuner_run(f"s3://{s3.bucket}/{prefix}", "llama", range(30))
    spec = job.fields(s3_env=s3.env(), shards=3).env(**ROCM, **FAST).obj()
    runs = run_job(spec, tmp_path / "job")
    for r in runs:
        assert r.publish is not None and r.publish.returncode == 0, r.publish.stderr
    tuned = all_tuned(runs)
    assert len(tuned) == len(set(tuned)) == 30
    shard_keys = keys_under(s3, f"{prefix}/ml/llama/{MODEL}/_shards/{spec.revision}/")
    assert len(shard_keys) == 6  # results.csv + manifest.json per shard

    done = merge(spec, tmp_path / "merge")
    assert done.returncode == 0, done.stderr
    message = json.loads(done.stdout)
    assert message["sha256"] == alone.message()["sha256"]
    assert message["uri"] == f"s3://{s3.bucket}/{prefix}/ml/llama/{MODEL}/{message['sha256']}"
    assert (message["gemms"], message["newlyTuned"], message["shards"]) == (30, 30, 3)
    got = fetch(
        Pinned(message["uri"], message["sha256"]),
        tmp_path / "serve",
        Serving(2),
        store=store_for(s3, message),
    )
    assert got.gemms == 30


def test_resume_through_s3_after_the_pod_is_lost(s3: Any, prefix: str, tmp_path: Path) -> None:
    every = 4
    job = make_tuner_run(f"s3://{s3.bucket}/{prefix}", "llama", range(16))
    spec = (
        job.fields(s3_env=s3.env(), every_gemms=every)
        .env(**ROCM, FAKE_TORCH_TUNE_SLEEP="0.3")
        .obj()
    )
    pod = Pod(spec, tmp_path / "try-1")
    pod.start_sync()
    pod.start_tune()
    wait_until(lambda: pod.progress_gemms() >= 8, 120, "half of the GEMMs tuned")
    pod.kill(sidecar_too=True)
    first = pod.wait_tune()
    pod.stop_sync()
    tuned_first = set(tuned_keys(first.stderr))
    checkpoint = f"{prefix}/ml/llama/{MODEL}/_checkpoints/{spec.revision}/0-of-1.json"
    assert keys_under(s3, checkpoint) == [checkpoint]

    retry = Pod(spec, tmp_path / "try-2").run()
    assert retry.tune.returncode == 0, retry.tune.stderr
    assert len(tuned_first & set(retry.tuned)) <= every
    m = retry.manifest()
    assert m["resume"]["status"] == "resumed" and m["resumed"] + m["newlyTuned"] == 16


PUBLISH = """
import sys
from pathlib import Path
from tunefleet.artifacts.publish import Output, publish
from tunefleet.storage.store import StoreOptions
out = Output(Path(sys.argv[1]), sys.argv[2], "ml", sys.argv[3], sys.argv[4])
pub = publish(out, options=StoreOptions(timeout_s=60))
assert pub.library is not None and pub.library.created, pub.library_error
"""


def synthetic(i: int) -> ResultsFile:
    """30 rows of this publisher's own, 10 every publisher has (other times), TunableOp format."""
    own = [
        ResultRow(
            "GemmTunableOp_BFloat16_TN",
            f"tn_{64 + j}_{2000 + i}_64_ld_64_64_{64 + j}",
            f"Gemm_Hipblaslt_{i}",
            f"0.{j + 1:03d}",
        )
        for j in range(30)
    ]
    shared = [
        ResultRow(
            "GemmTunableOp_BFloat16_TN",
            f"tn_{64 + j}_99_64_ld_64_64_{64 + j}",
            f"Gemm_Rocblas_{i}",
            f"0.{i + 1:03d}",
        )
        for j in range(10)
    ]
    return ResultsFile(dict(VALIDATORS), own + shared)


def test_concurrent_publishes_to_one_library_lose_nothing(
    s3: Any, prefix: str, tmp_path: Path
) -> None:
    publishers = 6
    key = library_key(MODEL, VALIDATORS, IDENTITY)
    for i in range(publishers):
        write_output(
            tmp_path / f"out{i}",
            synthetic(i),
            ArtifactId(namespace="ml", profile=f"p{i}", revision="3f2a9c01de", gpu_model=MODEL),
            RunFacts(
                recorded=40,
                identity=IDENTITY,
                seconds=1.0,
                extra=ManifestExtra(library_key=key, shards=1),
            ),
        )
    uri = f"s3://{s3.bucket}/{prefix}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PUBLISH, str(tmp_path / f"out{i}"), uri, f"p{i}", MODEL],
            env=tool_env(s3.env()),
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(publishers)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    store = S3Store(parse_uri(uri), client=s3.client(), timeout_s=60)
    view = read_library(store, Library(store.location, "namespace", "ml", MODEL, key), VALIDATORS)
    assert (view.entries, view.skipped) == (publishers, [])
    expected = merge_results([synthetic(i) for i in range(publishers)])
    assert format_results(view.results) == format_results(expected)
    assert view.gemms == publishers * 30 + 10


def test_listing_pages_through_every_key(s3: Any, prefix: str) -> None:
    client = s3.client()
    for i in range(7):
        client.put_object(Bucket=s3.bucket, Key=f"{prefix}/dir/{i:02d}.json", Body=b"{}")
    client.put_object(Bucket=s3.bucket, Key=f"{prefix}/dirx/other.json", Body=b"{}")
    store = S3Store(parse_uri(f"s3://{s3.bucket}"), client=client, timeout_s=60)
    store.page_size = 3  # three ListObjectsV2 pages for seven keys
    listed = store.list(f"{prefix}/dir", 100)
    assert [o.key for o in listed] == [f"{prefix}/dir/{i:02d}.json" for i in range(7)]
    assert all(o.size == 2 and o.modified > 0 for o in listed)
    assert len(store.list(f"{prefix}/dir", 5)) == 5
