"""`python -m bench large`: a real-size bundle (1 GiB) end to end, and the codec it travels in.

Codecs (no cluster): a 1 GiB corpus of real kernel-like files (the shared libraries of the
real-torch venvs when hack/torch-venvs.sh has made them, else of this machine's Python and
/usr/lib; hard links, no copy) packed and unpacked by tunefleet's own code in gzip (what the
tuner writes, stdlib only, in the user's image) and zstd (the zstandard package, level 3, the
tar+zstd OCI media type), each against `tar -x` of the same archive from disk.

Real node, S3 (the operator as the chart's Deployment, the stand-in image's workload writing
1 GiB of a seeded generator's bytes, testbed/large.py): apply to Ready; the tune step's pack
and publish's upload seconds (their log lines); then `pods` model pods one at a time, each
fetching the bundle: fetch's download-and-verify and unpack seconds and its cgroup's peak
memory (its log line), the pod's creation to its server's start, the SHA-256 it got; and
`tar -xzf` of the same archive downloaded to this machine's disk (the node's disk), the
limit fetch is compared with: (download + verify + unpack) / tar -x, medians.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.realnode import Run, epoch, in_namespace, tuned
from bench.results import progress
from testbed.cluster import STANDIN_IMAGE, Cluster, S3Settings
from testbed.large import BLOB, expected_sha256, large_profile, serving_pod
from testbed.poll import eventually
from tunefleet.artifacts import bundle  # registers the zstandard reader (as fetch has it)
from tuner_job import caches as cc

GIB = 1 << 30
MIB = 1024


def _corpus(dest: Path, size: int = GIB) -> str:
    """`size` bytes of shared libraries hard-linked under dest; what they are, in words."""
    roots = [Path.home() / ".cache" / "tunefleet" / "torch", Path(sys.prefix), Path("/usr/lib")]
    found: list[Path] = []
    for root in roots:
        if root.is_dir():
            found += sorted(p for p in root.rglob("*.so*") if p.is_file() and not p.is_symlink())
    if not found:
        raise RuntimeError("no shared libraries to make a corpus of")
    total, i = 0, 0
    while total < size:
        src = found[i % len(found)]
        target = dest / f"{i // len(found)}" / f"{i:06d}-{src.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, target)
        except OSError:
            shutil.copyfile(src, target)
        total += target.stat().st_size
        i += 1
    where = "real-torch venvs' libraries" if found[0].is_relative_to(roots[0]) else "libraries"
    return f"{i} files, {total} bytes: {where} ({found[0].parent})"


def _zstd_pack(base: Path, target: Path) -> None:
    """The same tar as the tuner's (tuner_job/caches.py), through zstd level 3."""
    import zstandard

    with (
        open(target, "wb") as raw,
        zstandard.ZstdCompressor(level=3).stream_writer(raw) as z,
        tarfile.open(fileobj=z, mode="w|", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in sorted(base.rglob("*")):
            # Each member made as the tuner makes it (never a hard link: the corpus is made
            # of them, and an archive of caches holds none).
            info = tarfile.TarInfo(path.relative_to(base).as_posix())
            if path.is_file():
                info.size, info.mode = path.stat().st_size, 0o644
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return round(time.perf_counter() - t, 2)


def _tar_x(archive: Path, flag: str) -> float:
    with tempfile.TemporaryDirectory(dir=archive.parent) as out:
        return _timed(
            lambda: subprocess.run(["tar", flag, "-xf", str(archive), "-C", out], check=True)
        )


def codecs(work: Path) -> dict[str, Any]:
    """gzip against zstd for pack and unpack of the corpus, each against tar -x."""
    corpus = work / "corpus"
    said = _corpus(corpus)
    progress("large", f"codecs on {said}")
    out: dict[str, Any] = {"corpus": said}
    assert cc.ZSTD_READERS, f"{bundle.__name__} registers no zstd reader: pip install zstandard"
    runs = {"gzip": lambda p: cc.pack_file(corpus, p), "zstd": lambda p: _zstd_pack(corpus, p)}
    for name, pack in runs.items():
        archive = work / f"corpus.{name}"
        pack_s = _timed(lambda a=archive, f=pack: f(a))  # type: ignore[misc]
        dest = work / f"unpacked-{name}"
        unpack_s = _timed(lambda a=archive, d=dest: cc.unpack_file(a, d))  # type: ignore[misc]
        shutil.rmtree(dest, ignore_errors=True)
        tar_s = _tar_x(archive, "-z" if name == "gzip" else "--zstd")
        out[name] = {
            "pack_s": pack_s,
            "unpack_s": unpack_s,
            "tar_x_s": tar_s,
            "size": archive.stat().st_size,
            "unpack_over_tar_x": round(unpack_s / tar_s, 2),
        }
        archive.unlink()
        progress("large", f"{name}: {out[name]}")
    shutil.rmtree(corpus, ignore_errors=True)
    return out


class _Run(Run):
    pass


def _logs(r: Run, pod: str, container: str) -> str:
    return str(r.cluster.kubectl("logs", "-n", r.ns, pod, "-c", container, check=False).stdout)


def _seconds(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def _tune_side(r: Run) -> dict[str, Any]:
    pods = r.cluster.kubectl(
        "get", "pods", "-n", r.ns, "-l", "batch.kubernetes.io/job-name", "-o", "name"
    ).stdout.split()
    pod = pods[0].removeprefix("pod/") if pods else ""
    return {
        "pack_s": _seconds(r"cache big: .* packed to \d+ in ([\d.]+) s", _logs(r, pod, "tune")),
        "upload_s": _seconds(r"caches uploaded, \d+ bytes in ([\d.]+) s", _logs(r, pod, "publish")),
    }


def _fetch_pod(r: Run, i: int, expected: str) -> dict[str, Any]:
    name = f"fetch-{i}"
    created = time.time()
    r.create(serving_pod(name, "big", f'sha256sum {BLOB} && echo "served" && sleep 3600'))
    eventually(
        lambda: _logs(r, name, "server"),
        lambda text: "served" in text,
        f"{name} served",
        timeout=900,
        interval=1,
    )
    pod = r.get("pod", name)
    log = _logs(r, name, "tunefleet-fetch")
    started = next(
        c["state"]["running"]["startedAt"]
        for c in pod["status"]["containerStatuses"]
        if c["name"] == "server"
    )
    sha = _logs(r, name, "server").split()[0]
    r.cluster.kubectl("delete", "pod", "-n", r.ns, name, "--wait=false")
    peak = re.search(r"memory peak (\d+) bytes", log)
    return {
        "download_verify_s": _seconds(r"download and verify ([\d.]+) s", log),
        "unpack_s": _seconds(r"unpack ([\d.]+) s", log),
        "peak_bytes": int(peak.group(1)) if peak else None,
        "create_to_start_s": round(epoch(started) - created, 1),
        "same_bytes": sha == expected,
    }


def _tar_baseline(s3: S3Settings, prefix: str, work: Path, runs: int = 3) -> float:
    """tar -xzf of the stored archive from this machine's disk (the real node's), median."""
    client = s3.client()
    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=s3.bucket, Prefix=prefix
        )
        for o in page.get("Contents", [])
        if o["Key"].endswith(cc.PAYLOAD_SUFFIX)
    ]
    archive = work / "stored.tar.gz"
    client.download_file(s3.bucket, keys[0], str(archive))
    times = [_tar_x(archive, "-z") for _ in range(runs)]
    archive.unlink()
    return statistics.median(times)


def _measure(r: Run, s3: S3Settings, pods: int) -> dict[str, Any]:
    prefix = f"bench-large/{uuid.uuid4().hex[:12]}"
    try:
        marker = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bench-large"}}
        prof, ready_s = tuned(
            r, s3, marker, lambda secret: large_profile("big", s3, secret, prefix, MIB), "big"
        )
        (art,) = prof["status"]["artifacts"]
        expected = expected_sha256(MIB)
        rows = []
        for i in range(pods):
            progress("large", f"fetch pod {i + 1}/{pods}")
            rows.append(_fetch_pod(r, i, expected))
        with tempfile.TemporaryDirectory(prefix="bench-large-") as tmp:
            tar_s = _tar_baseline(s3, prefix, Path(tmp))
        fetch_s = statistics.median(
            (x["download_verify_s"] or 0) + (x["unpack_s"] or 0) for x in rows
        )
        return {
            "bundle": {k: art["caches"][0][k] for k in ("files", "bytes", "size")},
            "apply_to_ready_s": round(ready_s, 1),
            "tune_side": _tune_side(r),
            "pods": rows,
            "fetch_s": round(fetch_s, 2),
            "tar_x_s": round(tar_s, 2),
            "fetch_over_tar_x": round(fetch_s / tar_s, 2),
            "peak_bytes_max": max(x["peak_bytes"] or 0 for x in rows),
            "all_same_bytes": all(x["same_bytes"] for x in rows),
        }
    finally:
        with contextlib.suppress(Exception):
            s3.delete_prefix(prefix + "/")


def run(cluster: Cluster, s3: S3Settings, pods: int = 3) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-codecs-", dir=Path.home()) as tmp:
        codec_figures = codecs(Path(tmp))
    run_ = _Run(cluster, "", STANDIN_IMAGE)
    s3_figures = in_namespace(cluster, s3, "bench-large", run_, _measure, pods)
    return {"codecs": codec_figures, "s3": s3_figures}
