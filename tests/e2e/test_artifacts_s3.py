"""publish and fetch against the real S3 server (SeaweedFS from hack/cluster-up.sh --s3-only).

The CLIs run as the pods run them: subprocesses with AWS_* credentials and AWS_ENDPOINT_URL_S3
in their environment, nothing else configured.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner_job.manifest import ArtifactId, Manifest
from tuner_job.output import RunFacts, write_output
from tuner_job.results import read_results

pytestmark = pytest.mark.e2e

DATA = Path(__file__).resolve().parents[1] / "unit" / "data"
REPO = Path(__file__).resolve().parents[2]
MODEL = "AMD_Instinct_MI300X_OAM"


def tuner_output(out: Path) -> Manifest:
    return write_output(
        out,
        read_results(DATA / "rocm_results.csv"),
        ArtifactId(namespace="ml", profile="llama", revision="3f2a9c01de", gpu_model=MODEL),
        RunFacts(
            recorded=3,
            identity={"gpuName": "sample (hand-written results, no GPU here)"},
            seconds=1.5,
        ),
    )


def cli(s3: Any, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(s3.env())
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO)])
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=120
    )


def publish(s3: Any, out: Path, prefix: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return cli(
        s3,
        "tunefleet.artifacts.publish",
        "--dir",
        str(out),
        "--uri",
        f"s3://{s3.bucket}/{prefix}",
        "--namespace",
        "ml",
        "--profile",
        "llama",
        "--gpu-model",
        MODEL,
        "--termination-log",
        str(tmp / "termination-log"),
        "--timeout-seconds",
        "60",
    )


def fetch(s3: Any, uri: str, sha: str, dest: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli(
        s3,
        "tunefleet.artifacts.fetch",
        "--uri",
        uri,
        "--sha256",
        sha,
        "--dest",
        str(dest),
        "--devices",
        "2",
        "--gpu-model",
        MODEL,
        "--timeout-seconds",
        "30",
        *extra,
    )


def test_publish_then_fetch_round_trip(s3: Any, prefix: str, tmp_path: Path) -> None:
    manifest = tuner_output(tmp_path / "out")
    done = publish(s3, tmp_path / "out", prefix, tmp_path)
    assert done.returncode == 0, done.stderr
    message = json.loads(done.stdout)
    sha = manifest.results_sha256
    key = f"{prefix}/ml/llama/{MODEL}/{sha}"
    assert message["uri"] == f"s3://{s3.bucket}/{key}"
    assert (message["sha256"], message["gemms"]) == (sha, manifest.gemms)
    assert json.loads((tmp_path / "termination-log").read_text()) == message

    # Stored with the SHA-256 checksum the server verified on upload.
    client = s3.client()
    data = (tmp_path / "out" / "results.csv").read_bytes()
    head = client.head_object(Bucket=s3.bucket, Key=f"{key}/results.csv", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()
    assert head["ContentLength"] == len(data)

    done = fetch(s3, message["uri"], sha, tmp_path / "dest")
    assert done.returncode == 0, done.stderr
    for i in range(2):
        assert (tmp_path / "dest" / f"tunableop_results{i}.csv").read_bytes() == data

    again = publish(s3, tmp_path / "out", prefix, tmp_path)
    assert again.returncode == 0, again.stderr  # identical artifact already there: success
    assert "already published" in again.stderr


def test_a_different_object_under_the_content_key_fails_publish(
    s3: Any, prefix: str, tmp_path: Path
) -> None:
    manifest = tuner_output(tmp_path / "out")
    key = f"{prefix}/ml/llama/{MODEL}/{manifest.results_sha256}/results.csv"
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=b"not these results\n")
    done = publish(s3, tmp_path / "out", prefix, tmp_path)
    assert done.returncode == 1
    assert "a different object already exists" in done.stderr


@pytest.mark.parametrize("how", ["corrupted", "truncated"])
def test_fetch_refuses_a_corrupted_or_truncated_object(
    s3: Any, prefix: str, tmp_path: Path, how: str
) -> None:
    manifest = tuner_output(tmp_path / "out")
    done = publish(s3, tmp_path / "out", prefix, tmp_path)
    assert done.returncode == 0, done.stderr
    uri = json.loads(done.stdout)["uri"]
    data = (tmp_path / "out" / "results.csv").read_bytes()
    bad = (
        data.replace(b"Gemm_Hipblaslt_1219", b"Gemm_Hipblaslt_1218")
        if how == "corrupted"
        else data[:-30]
    )
    # Overwritten behind tunefleet's back (no If-None-Match), as a faulty store or a person might.
    key = uri.removeprefix(f"s3://{s3.bucket}/") + "/results.csv"
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=bad)

    closed = fetch(s3, uri, manifest.results_sha256, tmp_path / "closed", "--fail-closed")
    assert closed.returncode == 1
    assert closed.stderr.startswith("tunefleet-fetch: refusing to start: results.csv has SHA-256")
    opened = fetch(s3, uri, manifest.results_sha256, tmp_path / "open")
    assert opened.returncode == 0
    assert opened.stderr.startswith("tunefleet-fetch: starting untuned: results.csv has SHA-256")
    for dest in (tmp_path / "closed", tmp_path / "open"):
        assert not dest.exists() or not list(dest.iterdir())


def test_fetch_of_a_missing_artifact_follows_the_policy(
    s3: Any, prefix: str, tmp_path: Path
) -> None:
    sha = "ab" * 32
    uri = f"s3://{s3.bucket}/{prefix}/ml/llama/{MODEL}/{sha}"
    done = fetch(s3, uri, sha, tmp_path / "dest", "--fail-closed")
    assert done.returncode == 1 and "no object at s3://" in done.stderr
    done = fetch(s3, uri, sha, tmp_path / "dest")
    assert done.returncode == 0 and "starting untuned: no object" in done.stderr


def test_a_file_over_one_part_goes_up_multipart_once_and_streams_back(
    s3: Any, prefix: str, tmp_path: Path
) -> None:
    """The real S3 server takes a cache archive of several parts (each with its SHA-256,
    completed with If-None-Match), streams it back hashed, keeps the first object under a
    key, and refuses a different one there."""
    from tunefleet.storage import s3 as s3_store
    from tunefleet.storage.registry import open_store, parse_uri
    from tunefleet.storage.store import ConflictError, StoreOptions, get_file

    size = 2 * s3_store.PART_BYTES + 12345
    path = tmp_path / "archive"
    path.write_bytes(os.urandom(size))
    uri = f"s3://{s3.bucket}/{prefix}"
    store = open_store(parse_uri(uri), StoreOptions(client=s3.client(), timeout_s=120))
    key = f"{prefix}/big/archive.tar.gz"
    assert store.put_file_if_absent(key, path, "application/gzip") is True
    with open(tmp_path / "back", "wb") as f:
        got = get_file(store, key, f, size)
    assert (got.size, got.sha256) == (size, hashlib.sha256(path.read_bytes()).hexdigest())
    assert (tmp_path / "back").read_bytes() == path.read_bytes()
    assert store.put_file_if_absent(key, path, "application/gzip") is False  # the same: kept
    other = tmp_path / "other"
    other.write_bytes(os.urandom(size))
    with pytest.raises(ConflictError):
        store.put_file_if_absent(key, other, "application/gzip")
    uploads = s3.client().list_multipart_uploads(Bucket=s3.bucket, Prefix=f"{prefix}/big/")
    assert not uploads.get("Uploads"), "an upload left parts behind"


def test_a_big_object_comes_back_as_ranges_of_its_one_version(
    s3: Any, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real server answers ranged GETs with If-Match: a multipart object comes down as
    ranges (several in flight) with the bytes and SHA-256 of the whole, and a range of a
    version since replaced is refused (412), so no download mixes two versions."""
    from tunefleet.storage import s3 as s3_store
    from tunefleet.storage.registry import open_store, parse_uri
    from tunefleet.storage.store import StoreOptions, get_file

    monkeypatch.setattr(s3_store, "RANGED_FROM", 1 << 20)
    size = s3_store.PART_BYTES + 54321
    data = os.urandom(size)
    path = tmp_path / "archive"
    path.write_bytes(data)
    store = open_store(
        parse_uri(f"s3://{s3.bucket}/{prefix}"), StoreOptions(client=s3.client(), timeout_s=120)
    )
    key = f"{prefix}/ranged/archive.tar.gz"
    assert store.put_file_if_absent(key, path, "application/gzip") is True
    ranges: list[str] = []

    def counted(params: dict[str, Any], **_: Any) -> None:
        if "Range" in params:
            ranges.append(params["Range"])

    # botocore's own hook on each GetObject call: the requests as sent, nothing replaced.
    store.client.meta.events.register("provide-client-params.s3.GetObject", counted)
    with open(tmp_path / "back", "w+b") as f:
        got = get_file(store, key, f, size)
    assert (got.size, got.sha256) == (size, hashlib.sha256(data).hexdigest())
    assert (tmp_path / "back").read_bytes() == data
    assert len(ranges) == -(-size // s3_store.RANGE_BYTES), ranges
    etag = s3.client().head_object(Bucket=s3.bucket, Key=key)["ETag"]
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=b"another version")
    with pytest.raises(Exception) as refused:
        s3.client().get_object(Bucket=s3.bucket, Key=key, Range="bytes=0-9", IfMatch=etag)
    assert "412" in str(refused.value) or "PreconditionFailed" in str(refused.value)
