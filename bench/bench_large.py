"""`python -m bench large`: a real-size bundle (1 GiB) end to end, and the codec it travels in.

Codecs (no cluster): a 1 GiB corpus of real kernel-like files (the shared libraries of the
real-torch venvs when hack/torch-venvs.sh has made them, else of this machine's Python and
/usr/lib; hard links, no copy) packed and unpacked by tunefleet's own code in gzip (what the
tuner writes, stdlib only, in the user's image) and zstd (the zstandard package, level 3, the
tar+zstd OCI media type), each against `tar -x` of the same archive from disk.

Real node, S3 (the operator as the chart's Deployment, the stand-in image's workload writing
1 GiB of a seeded generator's bytes, testbed/large.py): apply to Ready; the tune step's pack
and publish's upload seconds (their log lines); then `pods` model pods one at a time, each
fetching the bundle: fetch's download-and-verify and unpack seconds, its cgroup's peak
memory and its process's peak RSS (its log line), the pod's creation to its server's start, the SHA-256 it got; and
`tar -xzf` of the same archive downloaded to this machine's disk (the node's disk), the
limit fetch is compared with: (download + verify + unpack) / tar -x, medians.

Real node, image volume (oci:// on the local registry, the operator holding the public key):
the same 1 GiB stack tuned into a volume image, then `volume_pods` model pods one after
another on the one node, each beside a pod with no profile (the same image and command but
the cache): each pod's creation to its first command (the container's own clock, the node is
this machine), what fetch copied and linked and in how long, the SHA-256 the pod read; the
registry's bytes served over all those pods (Distribution's /metrics, every handler), against
the bundle's size. Then `copy_pods` pods that ask for copies (tunefleet.io/caches-copy), what
each further pod paid before links.
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
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench import bench_oci
from bench.realnode import Run, epoch, in_namespace, tuned
from bench.results import progress
from testbed.builders.wrappers import make_config_map
from testbed.cluster import STANDIN_IMAGE, Cluster, S3Settings
from testbed.large import BLOB, expected_sha256, large_profile, serving_pod, volume_profile
from testbed.poll import eventually
from testbed.registry import Registry
from tunefleet import naming
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
    rss = re.search(r"peak RSS (\d+) bytes", log)
    return {
        "download_verify_s": _seconds(r"download and verify ([\d.]+) s", log),
        "unpack_s": _seconds(r"unpack ([\d.]+) s", log),
        "peak_bytes": int(peak.group(1)) if peak else None,
        "rss_bytes": int(rss.group(1)) if rss else None,
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
        marker = make_config_map("bench-large", "").obj()
        seed = _fresh_seed()
        prof, ready_s = tuned(
            r,
            s3,
            marker,
            lambda secret: large_profile("big", s3, secret, prefix, MIB, seed),
            "big",
        )
        (art,) = prof["status"]["artifacts"]
        expected = expected_sha256(MIB, seed)
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
            "rss_bytes_max": max(x["rss_bytes"] or 0 for x in rows),
            "all_same_bytes": all(x["same_bytes"] for x in rows),
        }
    finally:
        with contextlib.suppress(Exception):
            s3.delete_prefix(prefix + "/")


def _fresh_seed() -> int:
    """A seed for the stack's bytes that no earlier run used."""
    return int.from_bytes(os.urandom(6), "big")


def _registry_bytes(metrics_url: str) -> int:
    """Every byte the registry has answered with (Distribution's /metrics, all handlers)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("registry_http_response_size_bytes_sum")
        )
    )


def _metrics_url(reg: Registry) -> str:
    return next(
        line.split("=", 1)[1]
        for line in (reg.data.parent.parent / "oci.env").read_text().splitlines()
        if line.startswith("TUNEFLEET_OCI_METRICS=")
    )


# What a volume pod runs: its clock at start, then what it got (the link, if one, and the
# bytes' SHA-256); a pod with no profile runs the clock alone.
_SAYS_START = "date +%s.%N"
_READS = f'{_SAYS_START} && readlink {BLOB}; sha256sum {BLOB} && echo "served"'


def _bare_pod(name: str, profile: str | None, command: str, copy: bool = False) -> dict[str, Any]:
    """serving_pod that runs once and asks for no GPU (the node's fake GPUs would hold a pod
    while the last one ends), with the profile's label or none."""
    pod = serving_pod(name, profile or "none", command)
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    pod["spec"]["containers"][0]["resources"] = {}
    if profile is None:
        del pod["metadata"]["labels"]["tunefleet.io/profile"]
    if copy:
        pod["metadata"]["annotations"] = {naming.CACHES_COPY_ANNOTATION: "true"}
    return pod


def _started(r: Run, pod: dict[str, Any]) -> tuple[float, str, str]:
    """A pod's creation (this machine's clock) to its first command, its server's log and
    its fetch's, once it has Succeeded; then deleted."""
    name = pod["metadata"]["name"]
    created = time.time()
    r.create(pod)
    done = r.finished(name)
    log = _logs(r, name, "server")
    fetch = _logs(r, name, "tunefleet-fetch") if done["spec"].get("initContainers") else ""
    if done["status"]["phase"] != "Succeeded":
        raise AssertionError(f"{name} failed: {log} {fetch}")
    r.cluster.kubectl("delete", "pod", "-n", r.ns, name, "--wait=true")
    return round(float(log.split()[0]) - created, 2), log, fetch


_COPY_RE = r"(\d+) copied, (\d+) linked in ([\d.]+) s"


def _volume_pod(r: Run, name: str, expected: str, copy: bool) -> dict[str, Any]:
    start_s, log, fetch = _started(r, _bare_pod(name, "bigvol", _READS, copy))
    m = re.search(_COPY_RE, fetch)
    peak = re.search(r"memory peak (\d+) bytes", fetch)
    return {
        "create_to_start_s": start_s,
        "copied_bytes": int(m.group(1)) if m else None,
        "linked_bytes": int(m.group(2)) if m else None,
        "copy_s": float(m.group(3)) if m else None,
        "peak_bytes": int(peak.group(1)) if peak else None,
        "linked": "/tunefleet/volume/" in log,
        "same_bytes": expected in log,
    }


def _registry_for(r: Run) -> tuple[str, str, dict[str, str]]:
    """The local registry made ready for r's namespace: its writer's and reader's Secrets and
    a signing key pair's Secret there; (the registry's metrics URL, the repository to push
    to, the key pair)."""
    reg = Registry.from_state()
    metrics = _metrics_url(reg)
    for doc in (
        reg.secret("registry-writer", reg.writer),
        reg.secret("registry-reader", reg.reader),
    ):
        r.apply(doc)
    keys = bench_oci.key_pair()
    r.cluster.kubectl(
        "create", "secret", "generic", "signing", "-n", r.ns,
        *[f"--from-literal={k}={v}" for k, v in keys.items()],
    )  # fmt: skip
    return metrics, f"{reg.host}/bench/{r.ns}", keys


def _measure_volume(r: Run, s3: S3Settings, pods: int, copy_pods: int = 3) -> dict[str, Any]:
    metrics, repository, keys = _registry_for(r)
    # Bytes no earlier run made: the node holds no volume image of them, so the first pod
    # pays the pull (the same bytes would give the same volume image, pulled already).
    seed = _fresh_seed()
    marker = make_config_map("bench-large-vol", "").obj()
    _, ready_s = tuned(
        r,
        s3,
        marker,
        lambda _secret: volume_profile("bigvol", s3, MIB, repository, keys["cosign.pub"], seed),
        "bigvol",
    )
    art = eventually(
        lambda: r.get("tp", "bigvol")["status"]["artifacts"][0],
        lambda a: str(a.get("delivery", "")) == "ImageVolume",
        "bigvol delivered as an image volume",
        timeout=300,
        interval=1,
    )
    expected = expected_sha256(MIB, seed)
    before = _registry_bytes(metrics)
    rows, bare = [], []
    for i in range(pods):
        progress("large", f"image volume pod {i + 1}/{pods}, and one with no profile")
        rows.append(_volume_pod(r, f"vol-{i}", expected, copy=False))
        bare.append(_started(r, _bare_pod(f"bare-{i}", None, _SAYS_START))[0])
    served = _registry_bytes(metrics) - before
    copies = []
    for i in range(copy_pods):
        progress("large", f"image volume pod {i + 1}/{copy_pods} asking for copies")
        copies.append(_volume_pod(r, f"copy-{i}", expected, copy=True))
    later = [x["create_to_start_s"] for x in rows[1:]] or [rows[0]["create_to_start_s"]]
    bare_s = statistics.median(bare)
    size = int(art["caches"][0]["size"])
    return {
        "bundle": {k: art["caches"][0][k] for k in ("files", "bytes", "size")},
        "apply_to_ready_s": round(ready_s, 1),
        "pods": rows,
        "pods_without_profile_s": bare,
        "registry_bytes": served,
        "registry_bytes_over_bundle": round(served / size, 3),
        "first_pod_start_s": rows[0]["create_to_start_s"],
        "later_pods_start_s": round(statistics.median(later), 2),
        "without_profile_start_s": round(bare_s, 2),
        "later_over_without_profile": round(statistics.median(later) / bare_s, 2),
        "copy_pods": copies,
        "copy_s": statistics.median(x["copy_s"] or 0.0 for x in copies) if copies else None,
        "link_s": statistics.median(x["copy_s"] or 0.0 for x in rows[1:] or rows),
        "copy_pods_start_s": (
            statistics.median(x["create_to_start_s"] for x in copies) if copies else None
        ),
        "all_same_bytes": all(x["same_bytes"] for x in rows + copies),
        "all_linked": all(x["linked"] for x in rows) and not any(x["linked"] for x in copies),
    }


def run(cluster: Cluster, s3: S3Settings, pods: int = 3, volume_pods: int = 10) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-codecs-", dir=Path.home()) as tmp:
        codec_figures = codecs(Path(tmp))
    run_ = _Run(cluster, "", STANDIN_IMAGE)
    s3_figures = in_namespace(cluster, s3, "bench-large", run_, _measure, pods)
    volume_run = _Run(cluster, "", STANDIN_IMAGE)
    volume_figures = in_namespace(
        cluster, s3, "bench-large-vol", volume_run, _measure_volume, volume_pods
    )
    return {"codecs": codec_figures, "s3": s3_figures, "image_volume": volume_figures}
